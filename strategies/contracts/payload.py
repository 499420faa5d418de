"""What a message carries besides the model: named array sets, packed into one list of arrays, and their bytes.

A method whose messages carry more than the model declares named array sets in its
contract (:class:`ArraySet`: SCAFFOLD sends ``control`` and its clients return
``delta-control``). The client's ``fit`` takes and returns one list of arrays, model
first, with the layout named in the same message, under ``payload``: in the config
(server to client) and in the metrics (client to server), as ``"model:6 control:6"``.
The receiver unpacks by that layout, never by position alone, so a reply that lacks a
set, or has one of the wrong length, is named as such. On the wire each set is its own
Flower ArrayRecord (``strategies/flower/codec.py``); an array travels as the bytes of
``numpy.save`` (:func:`to_bytes`, :func:`from_bytes`: Flower's own serialisation).

Pure Python and numpy: the strategy and the client both import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO

import numpy as np

Scalar = bool | bytes | float | int | str  # what a config or metrics value may be (Flower's records hold these)

MODEL = "model"  # the arrays of the model that travel: all of them, or the shared ones of a method with personal layers
LAYOUT = "payload"  # the config / metrics key that names a message's layout
PURPOSES = ("fit", "evaluate")
# what a returned set holds, which says how the base screens it (strategies/screening/reply_screen.py)
SET_KINDS = {
    "update": "a change (SCAFFOLD's delta-control): its norm against max-update-ratio times the round's median",
    "values": "values of the model's scale (FedProto's prototypes): its norm against the same bound",
    "counts": "non-negative whole numbers, summing to at most the node's declared num-train (per class, where "
              "the set is one row of classes, at most each declared class count)",
}
_NAME = re.compile(r"[a-z][a-z0-9-]*")


def to_bytes(array: np.ndarray) -> bytes:
    """``array`` as it travels: the bytes of ``numpy.save`` (as Flower's ``ndarray_to_bytes``)."""
    buffer = BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def from_bytes(data: bytes) -> np.ndarray:
    """The array :func:`to_bytes` made (no pickled objects: a hostile reply cannot run code here)."""
    return np.load(BytesIO(data), allow_pickle=False)


class PayloadError(ValueError):
    """A message whose arrays do not match the layout it names."""


@dataclass(frozen=True)
class ArraySet:
    """A named list of arrays a message carries beside the model.

    Attributes
    ----------
    name
        Its name in the layout (kebab-case, not ``model``).
    doc
        One line: what it holds.
    purposes
        For a set the server sends: which instructions carry it (``fit``, ``evaluate``).
        Ignored for a set the clients return (only fit replies carry arrays).
    optional
        For a set the server sends: the strategy chooses, message by message, whether it
        goes (``payload_for`` may leave it out); the layout names what went, and the client
        finds it in ``received`` or not. A required set goes with every instruction of its
        purposes.
    kind
        For a set the clients return: what it holds, one of :data:`SET_KINDS` (``update``,
        ``values``, ``counts``), which decides how the base screens its values. Ignored
        for a set the server sends.

    The base strategy screens a returned set by the shapes and dtypes of the model's
    arrays that travel (a strategy whose set is shaped otherwise overrides
    ``payload_shapes`` and ``payload_dtypes``), by finiteness, like the model itself, and
    by its ``kind``: no method screens its own sets by hand.

    """

    name: str
    doc: str
    purposes: tuple[str, ...] = ("fit",)
    optional: bool = False
    kind: str = "update"

    def __post_init__(self) -> None:
        if self.name == MODEL or not _NAME.fullmatch(self.name):
            raise ValueError(f"array set name {self.name!r} must be kebab-case and not {MODEL!r}")
        if not self.purposes or set(self.purposes) - set(PURPOSES):
            raise ValueError(f"array set {self.name!r}: purposes {self.purposes} must be among {PURPOSES}")
        if self.kind not in SET_KINDS:
            raise ValueError(f"array set {self.name!r}: kind {self.kind!r} must be one of {list(SET_KINDS)}")


def layout_of(sets: Mapping[str, Sequence[np.ndarray]]) -> str:
    """``{"model": [6 arrays], "control": [6 arrays]}`` -> ``"model:6 control:6"``."""
    return " ".join(f"{name}:{len(arrays)}" for name, arrays in sets.items())


def pack(sets: Mapping[str, Sequence[np.ndarray]]) -> tuple[list[np.ndarray], str]:
    """Every set's arrays in one list, in the mapping's order, and the layout naming them."""
    return [array for arrays in sets.values() for array in arrays], layout_of(sets)


def parse_layout(text: str) -> list[tuple[str, int]]:
    """``"model:6 control:6"`` -> ``[("model", 6), ("control", 6)]``.

    Raises
    ------
    PayloadError
        If the text is not ``name:count`` pairs with distinct names.

    """
    pairs = []
    for part in str(text).split():
        name, _, count = part.partition(":")
        if not _NAME.fullmatch(name) or not count.isdigit():
            raise PayloadError(f"payload layout {text!r} is not 'name:count ...'")
        pairs.append((name, int(count)))
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise PayloadError(f"payload layout {text!r} names a set twice")
    return pairs


def unpack(arrays: Sequence[np.ndarray], layout: object) -> dict[str, list[np.ndarray]]:
    """The named sets ``arrays`` holds by ``layout``; no layout means the whole list is the model.

    Raises
    ------
    PayloadError
        If the layout's counts do not add up to the arrays received.

    """
    if layout is None or layout == "":
        return {MODEL: list(arrays)}
    pairs = parse_layout(str(layout))
    if sum(count for _, count in pairs) != len(arrays):
        raise PayloadError(f"payload layout {layout!r} names {sum(c for _, c in pairs)} arrays, the message holds "
                           f"{len(arrays)}")  # fmt: skip
    sets, start = {}, 0
    for name, count in pairs:
        sets[name] = list(arrays[start : start + count])
        start += count
    return sets


def sets_problem(names: Sequence[str], declared: Sequence[ArraySet], purpose: str) -> str | None:
    """Why a ``purpose`` message carrying the sets ``names`` breaks the declaration, or ``None``.

    The sets must be among those declared for the purpose, in declaration order, with
    every required one present.
    """
    allowed = [s for s in declared if purpose in s.purposes]
    expected = [s.name for s in allowed if s.name in names or not s.optional]
    if list(names) != expected:
        required = [s.name for s in allowed if not s.optional]
        optional = [s.name for s in allowed if s.optional]
        return (f"a {purpose} message carried array sets {list(names)}; the contract sends {required}"
                + (f" and may send {optional}" if optional else ""))
    return None
