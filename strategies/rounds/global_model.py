"""The global model as the server holds it: every array, and the shared ones that travel.

:class:`GlobalModel` keeps the global model decoded and encoded once and knows which of
its arrays travel (all of them, the shared ones of a method with personal arrays, or none
when no model travels). :func:`shared_indices` decides which, from the contract and the
model's layout.
"""

from __future__ import annotations

import numpy as np

from strategies.contracts.contract import Contract
from strategies.contracts.models import ModelLayout
from strategies.contracts.payload import to_bytes
from strategies.contracts.settings import MethodSettings


def shared_indices(size: int, layout: ModelLayout, contract: Contract, method: MethodSettings, owner: str) -> list[int]:
    """The indices of a ``size``-array model's arrays that travel: all but the contract's personal ones.

    Raises
    ------
    TypeError
        If the layout names another number of arrays, or the contract keeps personal
        arrays and the layout names none (``owner`` names the strategy in the message).

    """
    everything = list(range(size))
    if layout.names and len(layout.names) != size:
        raise TypeError(f"{owner}: the layout names {len(layout.names)} arrays, the model has {size}")
    if contract.personal is None:
        return everything
    if not layout.names:
        raise TypeError(f"{owner} keeps {contract.personal.describe(method.values())} on the clients and needs the "
                        "model's layout to find them (layout = clients.models.layout_of(model))")  # fmt: skip
    personal = set(contract.personal_arrays(method, layout))
    return [i for i in everything if layout.names[i] not in personal]


class GlobalModel:
    """The server's global model: ``arrays`` (every one, in ``state_dict`` order), the ``shared`` ones, ``tensors``.

    ``tensors`` are the arrays as they travel (:func:`strategies.contracts.payload.to_bytes`),
    encoded once per model however many messages carry it.

    Parameters
    ----------
    arrays
        The model before round 1, every array in ``state_dict`` order.
    shared
        The indices of the arrays that travel (:func:`shared_indices`).

    """

    def __init__(self, *, arrays: list[np.ndarray], shared: list[int]) -> None:
        self.shared = shared
        self.use(list(arrays))

    @property
    def travels(self) -> bool:
        """Whether any array of the model travels (``False`` under ``WholeModel``: only the contract's sets do)."""
        return bool(self.shared)

    def shared_part(self, model: list[np.ndarray]) -> list[np.ndarray]:
        """The arrays of ``model`` that travel (``model`` itself when they all do)."""
        return model if len(self.shared) == len(model) else [model[i] for i in self.shared]

    def use(self, model: list[np.ndarray]) -> None:
        """Make ``model`` (every array, personal ones included) the global model."""
        self.arrays = model
        self.shared_arrays = self.shared_part(model)
        self.tensors = [to_bytes(array) for array in model]

    def adopt(self, model: list[np.ndarray], owner: str) -> None:
        """Make ``model`` (every array, in ``state_dict`` order) the global model.

        Raises
        ------
        ValueError
            If its shapes or dtypes are not the run's model's (``owner`` names the strategy).

        """
        if [(a.shape, a.dtype) for a in model] != [(a.shape, a.dtype) for a in self.arrays]:
            raise ValueError(f"{owner}: a global model must have the run model's {len(self.arrays)} arrays, "
                             "shapes and dtypes")  # fmt: skip
        self.use(list(model))

    def use_shared(self, shared: list[np.ndarray]) -> None:
        """Make ``shared`` the global model's shared arrays; its personal ones keep their values."""
        if not self.travels:  # there is nothing to change
            return
        if len(self.shared) == len(self.arrays):
            self.use(shared)
            return
        model = list(self.arrays)
        for index, array in zip(self.shared, shared, strict=True):
            model[index] = array
        self.use(model)
