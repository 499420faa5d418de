"""The global model as the server holds it: every array, and the shared ones that travel.

:class:`GlobalModelPart` keeps the global model decoded and encoded once and knows which
of its arrays travel (all of them, the shared ones of a method with personal arrays, or
none when no model travels); what each partition was sent is what a reply's update is
measured from (:mod:`strategies.update_screen`).
"""

from __future__ import annotations

import numpy as np
from flwr.common import Parameters, ndarrays_to_parameters

from strategies.contracts.models import ModelLayout


class GlobalModelPart:
    """A part of :class:`strategies.base.FederatedStrategy` (see the module's docstring)."""

    def _shared_indices(self, layout: ModelLayout) -> list[int]:
        everything = list(range(len(self.global_model)))
        if layout.names and len(layout.names) != len(self.global_model):
            raise TypeError(f"{type(self).__name__}: the layout names {len(layout.names)} arrays, the model has "
                            f"{len(self.global_model)}")  # fmt: skip
        if self.contract.personal is None:
            return everything
        if not layout.names:
            raise TypeError(f"{type(self).__name__} keeps {self.contract.personal.describe(self.method.values())} on "
                            "the clients and needs the model's layout to find them (layout = "
                            "clients.models.layout_of(model))")  # fmt: skip
        personal = set(self.contract.personal_arrays(self.method, layout))
        return [i for i in everything if layout.names[i] not in personal]

    @property
    def model_travels(self) -> bool:
        """Whether any array of the model travels (``False`` under ``WholeModel``: only the contract's sets do)."""
        return bool(self.shared)

    def _shared_part(self, model: list[np.ndarray]) -> list[np.ndarray]:
        return model if len(self.shared) == len(model) else [model[i] for i in self.shared]

    def _use_model(self, model: list[np.ndarray]) -> None:
        """Make ``model`` (every array, personal ones included) the global model."""
        self.global_model = model
        self.global_shared = self._shared_part(model)
        self.global_parameters = ndarrays_to_parameters(model)

    def adopt_model(self, model: list[np.ndarray]) -> Parameters:
        """Make ``model`` (every array, in ``state_dict`` order) the global model; its parameters.

        Raises
        ------
        ValueError
            If its shapes or dtypes are not the run's model's.

        """
        if [(a.shape, a.dtype) for a in model] != [(a.shape, a.dtype) for a in self.global_model]:
            raise ValueError(f"{type(self).__name__}: a global model must have the run model's "
                             f"{len(self.global_model)} arrays, shapes and dtypes")  # fmt: skip
        self._use_model(list(model))
        return self.global_parameters

    def _use_shared(self, shared: list[np.ndarray]) -> None:
        """Make ``shared`` the global model's shared arrays; its personal ones keep their values."""
        if not self.model_travels:  # there is nothing to change
            return
        if len(self.shared) == len(self.global_model):
            self._use_model(shared)
            return
        model = list(self.global_model)
        for index, array in zip(self.shared, shared, strict=True):
            model[index] = array
        self._use_model(model)

    def sent_to(self, partition: int) -> list[np.ndarray]:
        """The model arrays ``partition`` was sent this round (a reply's update is measured from them)."""
        return self.parameters_for(partition, "fit")
