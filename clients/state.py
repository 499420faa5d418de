"""What a client keeps between rounds: tensors and scalars in Flower's ``Context.state``.

Flower rebuilds the client for every message (in a deployment, in a fresh process);
only ``context.state``, a ``RecordDict`` kept per node and run, survives from one
round to the next. :class:`ClientState` stores named lists of arrays (a personal
model) and named scalars (a counter) in it, under the method's name. A round's writes
can be taken back (:meth:`ClientState.snapshot`, :meth:`ClientState.restore`): the base
client does so when the round produced non-finite values, so one diverged round cannot
leave a client broken for the rest of the run.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.common import ArrayRecord, ConfigRecord, RecordDict

Scalar = bool | int | float | str


class ClientState:
    """Named arrays and scalars of one client that outlive a message.

    Parameters
    ----------
    records
        ``context.state`` of the node (a fresh ``RecordDict`` for a client that lives
        in one process, as in tests and benchmarks).
    owner
        Prefixes every record's name (the method), so two methods never share one.

    """

    def __init__(self, records: RecordDict | None = None, *, owner: str) -> None:
        self.records = records if records is not None else RecordDict()
        self.owner = owner
        self.non_finite: list[str] = []  # the names written with a non-finite value since the last snapshot

    def _name(self, name: str) -> str:
        return f"{self.owner}/{name}"

    def arrays(self, name: str) -> list[np.ndarray] | None:
        """The arrays stored under ``name``, or ``None`` if there are none yet."""
        record = self.records.array_records.get(self._name(name))
        return None if record is None else record.to_numpy_ndarrays()

    def set_arrays(self, name: str, arrays: list[np.ndarray]) -> None:
        """Store ``arrays`` under ``name``, replacing what was there."""
        arrays = [np.asarray(a) for a in arrays]
        if not all(np.all(np.isfinite(a)) for a in arrays if np.issubdtype(a.dtype, np.number)):
            self.non_finite.append(name)
        self.records[self._name(name)] = ArrayRecord(arrays)

    def value(self, name: str, default: Scalar) -> Scalar:
        """The scalar stored under ``name``, or ``default``."""
        record = self.records.config_records.get(self._name("scalars"))
        return default if record is None or name not in record else record[name]

    def set_value(self, name: str, value: Scalar) -> None:
        """Store the scalar ``value`` under ``name``."""
        if isinstance(value, float) and not math.isfinite(value):
            self.non_finite.append(name)
        key = self._name("scalars")
        # a new record, never the old one changed: a snapshot holds the old one
        self.records[key] = ConfigRecord({**(self.records.config_records.get(key) or {}), name: value})

    def snapshot(self) -> dict[str, object]:
        """What this owner keeps now, to put back with :meth:`restore` (records are replaced, never changed)."""
        self.non_finite = []
        prefix = self._name("")
        return {key: record for key, record in self.records.items() if key.startswith(prefix)}

    def restore(self, snapshot: dict[str, object]) -> None:
        """Put back what :meth:`snapshot` returned, dropping whatever this owner wrote since."""
        prefix = self._name("")
        for key in [key for key in self.records if key.startswith(prefix)]:
            del self.records[key]
        for key, record in snapshot.items():
            self.records[key] = record
        self.non_finite = []
