"""FATHOM: FedAvg that tunes its client learning rate, epochs and batch size online (Kan, 2023)."""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.common import FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.fathom_math import FathomSettings, FathomState, RoundAggregate, fathom_update
from strategies.fedavg import PersonalisedFedAvg
from strategies.vectors import flatten


class Fathom(PersonalisedFedAvg):
    """FedAvg with FATHOM's online hyperparameter updates (ALGORITHMS.md section 2).

    Every round the hyperparameters in force (``lr``, ``local-epochs`` = E and
    ``batch-size`` = B, all reals) go to every sampled client in its fit config;
    models are aggregated by example count; the aggregated update and the clients'
    ``phi`` give the normalised hypergradients, and :func:`fathom_update` moves the
    state. The round's record holds the hyperparameters in force (``hp-*``),
    ``H``, ``G``, the clients' steps and per-example gradients. A reply whose
    ``phi`` is missing, not finite or outside [-1, 1] is rejected like any
    malformed reply.

    Parameters
    ----------
    lr, epochs, batch_size
        The starting point ``eta_0``, ``E_0`` and ``B_0``.
    settings
        Hyper-step sizes, smoothing, bounds and the local-term reading.
    **kwargs
        Passed to :class:`PersonalisedFedAvg`; ``aggregation`` is by examples.

    """

    def __init__(
        self, *, lr: float, epochs: float, batch_size: float, settings: FathomSettings | None = None, **kwargs
    ) -> None:
        self.settings = settings or FathomSettings()
        starts = (
            ("lr", lr, self.settings.lr_bounds),
            ("local-epochs", epochs, self.settings.epochs_bounds),
            ("batch-size", batch_size, self.settings.batch_bounds),
        )
        for key, value, bounds in starts:
            if not bounds[0] <= value <= bounds[1]:
                raise ValueError(f"{key} = {value} is outside its bounds [{bounds[0]}, {bounds[1]}]")
        self.state = FathomState(lr=lr, epochs=epochs, batch_size=batch_size)
        self.global_before: np.ndarray | None = None
        if kwargs.pop("aggregation", "examples") != "examples":
            log(WARNING, "fathom always weighs models by example count (its update rule assumes it)")
        kwargs["aggregation"] = "examples"
        kwargs.setdefault("name", "fathom")
        super().__init__(**kwargs)

    def hyperparameters(self) -> dict[str, Scalar]:
        return {"lr": self.state.lr, "local-epochs": self.state.epochs, "batch-size": self.state.batch_size}

    def strategy_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """The hyperparameters in force, the update count and the smoothed update."""
        state = {"lr": self.state.lr, "epochs": self.state.epochs, "batch-size": self.state.batch_size,
                 "round": self.state.round}  # fmt: skip
        smoothed = self.state.smoothed_update
        return ({"fathom/smoothed-update": smoothed} if smoothed is not None else {}), state

    def restore_strategy_state(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        self.state = FathomState(
            lr=float(state["lr"]), epochs=float(state["epochs"]), batch_size=float(state["batch-size"]),
            smoothed_update=arrays.get("fathom/smoothed-update"), round=int(state["round"]),
        )  # fmt: skip

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        self.global_before = flatten(parameters_to_ndarrays(parameters), np.float64)
        return super().configure_fit(server_round, parameters, client_manager)

    def screen_fit_results(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]):
        accepted, rejected = super().screen_fit_results(server_round, results)
        without_phi = [(p, r) for p, r in accepted if "phi" not in r.metrics]
        for proxy, _ in without_phi:
            self.log_rejection(server_round, proxy, "no 'phi' metric")
        return [(p, r) for p, r in accepted if "phi" in r.metrics], rejected + without_phi

    def after_aggregation(
        self, server_round: int, accepted: list[tuple[ClientProxy, FitRes]], parameters: Parameters
    ) -> dict[str, Scalar]:
        aggregate = RoundAggregate(
            update=flatten(parameters_to_ndarrays(parameters), np.float64) - self.global_before,
            phis=np.array([float(r.metrics["phi"]) for _, r in accepted]),
            examples=np.array([r.num_examples for _, r in accepted], dtype=np.float64),
        )
        self.state, hg = fathom_update(self.state, aggregate, self.settings)
        received_lr = [float(r.metrics.get("lr", np.nan)) for _, r in accepted]
        return {
            "H": hg.global_term,
            "G": hg.local_term,
            "phi-mean": float(np.mean(aggregate.phis)),
            "client-lr-min": float(np.min(received_lr)),
            "client-lr-max": float(np.max(received_lr)),
        }
