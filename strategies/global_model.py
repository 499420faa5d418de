"""The global model as the server holds it: every array, the shared ones that travel, and the update-norm screen.

:class:`GlobalModelPart` keeps the global model decoded and encoded once, knows which of
its arrays travel (all of them, the shared ones of a method with personal arrays, or none
when no model travels) and measures each accepted reply's update against what its
partition was sent (``max-update-ratio``). A method whose model never travels has no
update: the screen then measures and records nothing.
"""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.common import ndarrays_to_parameters
from flwr.common.logger import log

from strategies.contracts.models import ModelLayout
from strategies.screening import Reply, outsized, set_norm, update_norm


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

    def screen_update_norms(self, server_round: int, replies: list[Reply]) -> tuple[list[Reply], int]:
        """Record the round's update norms; drop replies beyond ``max-update-ratio`` times their median.

        Three scales are screened, each against its own round median: the model's
        floating-point update (recorded as ``update-norm-median`` and ``-max``), its integer
        arrays' change (BatchNorm's step counters), and the norm of every returned array set
        of kind ``update`` or ``values`` (SCAFFOLD's ``delta-control``, FedProto's
        prototypes). A non-finite norm is dropped whatever the ratio. Returns the replies
        kept and how many were dropped (``clients-outsized`` in the record).
        """
        if not replies:
            return replies, 0
        ratio = self.settings.run.max_update_ratio
        why: list[str | None] = [None] * len(replies)
        if self.model_travels:
            sent = [self.sent_to(reply.partition) for reply in replies]
            norms = [update_norm(reply.arrays, before) for reply, before in zip(replies, sent, strict=True)]
            self.record.update({"update-norm-median": float(np.median(norms)), "update-norm-max": max(norms)})
            _flag(why, norms, ratio, "update norm")
            counters = [update_norm(r.arrays, before, counters=True) for r, before in zip(replies, sent, strict=True)]
            _flag(why, counters, ratio, "integer arrays' change")
        for array_set in self.contract.returns:
            if array_set.kind in ("update", "values"):
                _flag(why, [set_norm(reply.extras[array_set.name]) for reply in replies], ratio,
                      f"{array_set.name!r} norm")  # fmt: skip
        for reply, reason in zip(replies, why, strict=True):
            if reason is not None:
                log(WARNING, "round %s: rejected fit reply from %s: %s (max-update-ratio %g)", server_round,
                    self.nodes.label(reply.node), reason, ratio)  # fmt: skip
        dropped = sum(reason is not None for reason in why)
        if self.model_travels or dropped:
            self.record["clients-outsized"] = dropped
        return [reply for reply, reason in zip(replies, why, strict=True) if reason is None], dropped


def _flag(why: list[str | None], norms: list[float], ratio: float, what: str) -> None:
    """Set ``why[i]`` for every norm :func:`outsized` flags (the first reason found stays)."""
    median = float(np.median(norms))
    for i, (norm, flag) in enumerate(zip(norms, outsized(norms, ratio), strict=True)):
        if flag and why[i] is None:
            scale = f"{norm / median:.1f} times" if median > 0 and np.isfinite(norm) else "beyond"
            why[i] = f"{what} {norm:.4g} is {scale} the round's median {median:.4g}"
