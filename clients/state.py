"""What a client keeps between rounds: tensors and scalars in Flower's ``Context.state``.

Flower rebuilds the client for every message (in a deployment, in a fresh process);
only ``context.state``, a ``RecordDict`` kept per node and run, survives from one
round to the next. :class:`ClientState` stores named lists of arrays (a personal
model) and named scalars (a counter) in it, under the method's name.
"""

from __future__ import annotations

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

    def _name(self, name: str) -> str:
        return f"{self.owner}/{name}"

    def arrays(self, name: str) -> list[np.ndarray] | None:
        """The arrays stored under ``name``, or ``None`` if there are none yet."""
        record = self.records.array_records.get(self._name(name))
        return None if record is None else record.to_numpy_ndarrays()

    def set_arrays(self, name: str, arrays: list[np.ndarray]) -> None:
        """Store ``arrays`` under ``name``, replacing what was there."""
        self.records[self._name(name)] = ArrayRecord([np.asarray(a) for a in arrays])

    def value(self, name: str, default: Scalar) -> Scalar:
        """The scalar stored under ``name``, or ``default``."""
        record = self.records.config_records.get(self._name("scalars"))
        return default if record is None or name not in record else record[name]

    def set_value(self, name: str, value: Scalar) -> None:
        """Store the scalar ``value`` under ``name``."""
        key = self._name("scalars")
        record = self.records.config_records.get(key) or ConfigRecord()
        record[name] = value
        self.records[key] = record
