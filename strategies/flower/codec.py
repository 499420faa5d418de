"""stamen's messages in Flower's Message API records: named ArrayRecords per array set, configs, metrics.

A stamen client packs the model and a method's array sets into one list of arrays and
names the layout in the config or metrics (``"model:6 control:6"``,
:mod:`strategies.contracts.payload`). In a message each set is its own
``ArrayRecord``: the model under ``"arrays"`` (Flower's own key, so a template's
``msg.content["arrays"].to_torch_state_dict()`` reads it), keyed by the ``state_dict``
names of the arrays that travel, and every other set under its name (SCAFFOLD's
``control``, FedProto's ``prototypes``), keyed by index. Config values travel in the
``"config"`` ConfigRecord; a reply's numbers in the ``"metrics"`` MetricRecord (with
``num-examples``, and an evaluation's ``loss``) and its text in the ``"reports"``
ConfigRecord, since a MetricRecord holds only numbers.

The arrays keep the bytes of ``numpy.save`` (:func:`strategies.contracts.payload.to_bytes`),
so converting either way copies no array. :func:`same_arrays`
and :func:`check_like` compare a model's records (the arrays a user hands ``start``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from io import BytesIO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from strategies.contracts.payload import LAYOUT, MODEL, Scalar, parse_layout
from strategies.screening.replies import is_real_number

MODEL_RECORD = "arrays"  # Flower's key for the model in its templates and strategies
CONFIG_RECORD, METRICS_RECORD, REPORTS_RECORD = "config", "metrics", "reports"
NUM_EXAMPLES, LOSS = "num-examples", "loss"  # Flower's key for the example count; an evaluation's loss
STYPE = "numpy.ndarray"  # the serialisation both paths use (flwr.common.ndarray_to_bytes)


def numbers_of(metrics: Mapping[str, object]) -> dict[str, int | float]:
    """The numeric values of ``metrics`` (what a MetricRecord may hold: no bools, no text), as Python numbers."""
    return {k: int(v) if isinstance(v, int | np.integer) else float(v)
            for k, v in metrics.items() if is_real_number(v)}  # fmt: skip


class MessageFormatError(ValueError):
    """A message whose records are not the ones stamen sends or expects back (named in the text)."""


def metric_record(metrics: Mapping[str, object]) -> MetricRecord:
    """The numeric values of ``metrics`` as a MetricRecord (Flower's holds only numbers)."""
    return MetricRecord(numbers_of(metrics))


def array_of(tensor: bytes) -> Array:
    """Flower's ``Array`` over ``tensor`` (``numpy.save`` bytes), its dtype and shape read from the header only."""
    buffer = BytesIO(tensor)
    version = np.lib.format.read_magic(buffer)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(buffer)  # the header alone, no copy of the data
    return Array(dtype=str(dtype), shape=tuple(int(n) for n in shape), stype=STYPE, data=tensor)


def array_records(tensors: Sequence[bytes], layout: object, names: Sequence[str] = ()) -> dict[str, ArrayRecord]:
    """One ArrayRecord per set of ``layout`` over the packed ``tensors``; the model's keyed by ``names`` if they fit.

    Raises
    ------
    MessageFormatError
        If the layout does not parse or names another number of arrays than ``tensors`` holds.

    """
    try:
        pairs = parse_layout(str(layout)) if layout not in (None, "") else [(MODEL, len(tensors))]
    except ValueError as err:
        raise MessageFormatError(str(err)) from err
    if sum(count for _, count in pairs) != len(tensors):
        raise MessageFormatError(f"payload layout {layout!r} names {sum(c for _, c in pairs)} arrays, the message "
                                 f"holds {len(tensors)}")  # fmt: skip
    records, start = {}, 0
    for name, count in pairs:
        keys = list(names) if name == MODEL and len(names) == count else [str(i) for i in range(count)]
        arrays = {key: array_of(tensor) for key, tensor in zip(keys, tensors[start : start + count], strict=True)}
        records[MODEL_RECORD if name == MODEL else name] = ArrayRecord(arrays)
        start += count
    return records


def packed(content: RecordDict) -> tuple[list[bytes], str, list[str]]:
    """The tensors of every ArrayRecord of ``content`` in one list (the model first), the layout, the model's keys."""
    records = content.array_records
    sets = [(MODEL, records[MODEL_RECORD])] if MODEL_RECORD in records else []
    sets += [(name, record) for name, record in records.items() if name != MODEL_RECORD]
    for name, record in sets:
        if any(array.stype != STYPE for array in record.values()):
            raise MessageFormatError(f"array record {name!r} holds arrays not serialised as {STYPE}")
    tensors = [array.data for _, record in sets for array in record.values()]
    layout = " ".join(f"{name}:{len(record)}" for name, record in sets)
    return tensors, layout, list(records[MODEL_RECORD].keys()) if MODEL_RECORD in records else []


def instruction(tensors: Sequence[bytes], config: Mapping[str, Scalar], names: Sequence[str] = ()) -> RecordDict:
    """A fit or evaluate instruction's records: its array sets (by ``config``'s layout) and its config."""
    records = array_records(tensors, config.get(LAYOUT), names)
    return RecordDict({**records, CONFIG_RECORD: ConfigRecord(dict(config))})


def read_instruction(content: RecordDict) -> tuple[list[bytes], dict[str, Scalar], list[str]]:
    """An instruction's packed tensors, its config (the layout in it, as a stamen client reads it), model keys."""
    if CONFIG_RECORD not in content.config_records:
        raise MessageFormatError(f"the instruction has no {CONFIG_RECORD!r} ConfigRecord")
    tensors, layout, names = packed(content)
    return tensors, {**content.config_records[CONFIG_RECORD], LAYOUT: layout}, names


def reply(tensors: Sequence[bytes], num_examples: int, metrics: Mapping[str, Scalar], *, loss: float | None = None,
          names: Sequence[str] = ()) -> RecordDict:  # fmt: skip
    """A client's reply: its array sets (by the layout in ``metrics``), numbers as metrics, text as reports.

    Raises
    ------
    MessageFormatError
        If ``metrics`` uses the reply's own keys (``num-examples``, ``loss``).

    """
    if clash := sorted({NUM_EXAMPLES, LOSS} & set(metrics)):
        raise MessageFormatError(f"a client's metrics may not use the reply's own keys {clash}")
    numbers = numbers_of(metrics)
    text = {k: v for k, v in metrics.items() if k not in numbers and k != LAYOUT}
    numbers[NUM_EXAMPLES] = int(num_examples)
    if loss is not None:
        numbers[LOSS] = float(loss)
    records = array_records(tensors, metrics.get(LAYOUT), names) if tensors or LAYOUT in metrics else {}
    return RecordDict({**records, METRICS_RECORD: MetricRecord(numbers), REPORTS_RECORD: ConfigRecord(text)})


def read_reply(content: RecordDict) -> tuple[list[bytes], int, dict[str, Scalar], list[str]]:
    """A reply's packed tensors, example count and metrics (the layout among them, as the reply screen reads it).

    The metrics are the reply's numbers and reports together; the last item is the
    model's keys, which the server compares with the names it sent.

    Raises
    ------
    MessageFormatError
        If the reply lacks its metrics or its example count.

    """
    if METRICS_RECORD not in content.metric_records:
        raise MessageFormatError(f"the reply has no {METRICS_RECORD!r} MetricRecord")
    numbers = dict(content.metric_records[METRICS_RECORD])
    if NUM_EXAMPLES not in numbers:
        raise MessageFormatError(f"the reply's metrics lack {NUM_EXAMPLES!r}")
    num_examples = numbers.pop(NUM_EXAMPLES)
    reports = dict(content.config_records[REPORTS_RECORD]) if REPORTS_RECORD in content.config_records else {}
    tensors, layout, names = packed(content)
    metrics = {**reports, **numbers}
    if content.array_records:
        metrics[LAYOUT] = layout
    return tensors, num_examples, metrics, names


def same_arrays(first: ArrayRecord, second: ArrayRecord) -> bool:
    """Whether two records hold the same arrays under the same names (bytes compared)."""
    return list(first.keys()) == list(second.keys()) and all(first[k].data == second[k].data for k in first)


def check_like(given: ArrayRecord, model: ArrayRecord) -> None:
    """Refuse ``initial_arrays`` that are not the run's model (names, shapes, dtypes), naming the differences."""
    theirs = {k: (tuple(a.shape), a.dtype) for k, a in given.items()}
    mine = {k: (tuple(a.shape), a.dtype) for k, a in model.items()}
    if theirs != mine:
        raise ValueError(f"initial_arrays are not the run's model: {_differences(theirs, mine)}")


def _differences(theirs: dict, mine: dict) -> str:
    missing, extra = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    changed = sorted(k for k in set(mine) & set(theirs) if mine[k] != theirs[k])
    parts = [f"missing {missing[:3]}" if missing else "", f"unknown {extra[:3]}" if extra else "",
             ", ".join(f"{k}: {theirs[k]} given, {mine[k]} expected" for k in changed[:3])]  # fmt: skip
    return "; ".join(p for p in parts if p)

