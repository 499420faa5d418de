"""What the settings checks and the strategies know of a model, without torch: its card and its array layout.

A model is registered once, in ``clients/models/registry.py``, with a builder (torch)
and a :class:`ModelCard` (this module: its traits, in plain Python). The run-config
checks read the card (does the model take images? is it smooth enough for a finite
difference of its gradient? does it normalise over the batch?), and a method's
personal-array rule reads the built model's :class:`ModelLayout` (which arrays are the
head, which belong to normalisation layers, which are not floats), so both sides of a
run, and ``python -m app.config`` before it, reach the same answers without Flower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

INPUTS = ("image", "flat")  # image: (C, H, W) arrays; flat: any shape, flattened by the model
TASKS = ("classification", "regression")
NORMS = ("none", "batch", "group")
# the kind of layer that owns an array (ModelLayout.kinds): what a personal-array rule may select by
BATCH_NORM, GROUP_NORM, OTHER = "batch-norm", "group-norm", "other"


@dataclass(frozen=True, kw_only=True)
class ModelCard:
    """A registered model's name and traits, as the settings checks read them.

    Attributes
    ----------
    name
        The value of the ``model`` run-config key.
    summary
        One line for the table of models (docs/models.md).
    inputs
        ``image``: it needs (C, H, W) inputs (refused on generated feature vectors);
        ``flat``: it flattens whatever it is given.
    smooth
        Twice differentiable everywhere (ELU, softmax, linear). ``False`` for ReLU and
        max-pool networks: their gradient is piecewise constant in the weights, so a
        finite difference of it estimates no Hessian (Per-FedAvg's ``hf`` warns, and
        ``so`` takes a curvature bound by default).
    norm
        ``batch`` (BatchNorm: batch statistics, running buffers, an integer counter),
        ``group`` (GroupNorm: per-example statistics) or ``none``.
    task
        ``classification`` (class labels, cross-entropy) or ``regression`` (real
        targets, squared error: dataset ``least-squares`` only).

    """

    name: str
    summary: str
    inputs: str
    smooth: bool
    norm: str = "none"
    task: str = "classification"

    def __post_init__(self) -> None:
        for field_name, value, allowed in (("inputs", self.inputs, INPUTS), ("norm", self.norm, NORMS),
                                           ("task", self.task, TASKS)):  # fmt: skip
            if value not in allowed:
                raise ValueError(f"model card {self.name!r}: {field_name} {value!r} is not one of {list(allowed)}")

    @property
    def min_batch(self) -> int:
        """The smallest batch it can train on: 2 with BatchNorm (a batch of 1 has no batch statistics), else 1."""
        return 2 if self.norm == "batch" else 1


@dataclass(frozen=True)
class ModelLayout:
    """A built model's arrays as the server and the rules see them: names, shapes, dtypes, owners, head.

    Attributes
    ----------
    names
        The ``state_dict`` names, in order (parameters and buffers).
    shapes
        Each array's shape.
    dtypes
        Each array's numpy dtype name (``float32``; ``int64`` for BatchNorm's ``num_batches_tracked``).
    kinds
        The kind of layer that owns each array: ``batch-norm``, ``group-norm`` or ``other``.
    head
        The names of the head's arrays (the model's split into a representation and a
        head); empty for a model with no split.

    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    head: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field_name in ("shapes", "dtypes", "kinds"):
            values = getattr(self, field_name)
            if values and len(values) != len(self.names):
                raise ValueError(f"model layout: {len(values)} {field_name} for {len(self.names)} arrays")
        if unknown := sorted(set(self.head) - set(self.names)):
            raise ValueError(f"model layout: head arrays {unknown} are not among the model's arrays")

    @classmethod
    def of_names(cls, names: Sequence[str]) -> ModelLayout:
        """A layout that knows only the names (every array ``other``, no head): the rules by name still apply."""
        return cls(tuple(names))

    def of_kind(self, kind: str) -> tuple[str, ...]:
        """The names of the arrays owned by layers of ``kind``."""
        return tuple(name for name, owner in zip(self.names, self.kinds, strict=True) if owner == kind)

    def non_float(self) -> tuple[str, ...]:
        """The names of the arrays that are not floating point (counters, masks): never averaged."""
        return tuple(name for name, dtype in zip(self.names, self.dtypes, strict=True) if "float" not in dtype)
