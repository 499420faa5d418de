"""Continue a run from its checkpoint: Flower counts rounds from 1 again, the strategy does not."""

from __future__ import annotations

from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from strategies.base import FederatedStrategy
from strategies.checkpoint import Checkpoint


class ContinuedRun(Strategy):
    """Runs ``strategy`` from the round after ``checkpoint``.

    Flower's server loop numbers rounds ``1 .. num_rounds`` of the new run; this
    wrapper adds the checkpoint's round to every round number it passes on, so the
    strategy, its records and the clients' per-round seeds see the original run's
    numbering. Run it with ``num_rounds = strategy.num_rounds - checkpoint.round``.

    Parameters
    ----------
    strategy
        The run's strategy, built from the same settings as the checkpointed run.
    checkpoint
        Where to continue from; restored after the strategy's own start-up (the
        preflight, and for diffusion the network and the node map).

    """

    def __init__(self, *, strategy: FederatedStrategy, checkpoint: Checkpoint) -> None:
        if checkpoint.round >= strategy.num_rounds:
            raise ValueError(
                f"num-server-rounds = {strategy.num_rounds} must exceed the checkpoint's round {checkpoint.round}"
            )
        self.strategy = strategy
        self.checkpoint = checkpoint
        self.offset = checkpoint.round

    @property
    def remaining_rounds(self) -> int:
        return self.strategy.num_rounds - self.offset

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.strategy.model_names

    @property
    def sent_names(self) -> tuple[str, ...]:
        return self.strategy.sent_names

    @property
    def global_parameters(self) -> Parameters:
        """The strategy's model (the checkpoint's once :meth:`initialize_parameters` has resumed it)."""
        return self.strategy.global_parameters

    def adopt_model(self, model: list) -> Parameters:
        return self.strategy.adopt_model(model)

    def __repr__(self) -> str:
        return f"ContinuedRun({self.strategy!r}, after round {self.offset})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        self.strategy.initialize_parameters(client_manager)
        return self.strategy.resume(self.checkpoint)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return self.strategy.configure_fit(server_round + self.offset, parameters, client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        return self.strategy.aggregate_fit(server_round + self.offset, results, failures)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return self.strategy.configure_evaluate(server_round + self.offset, parameters, client_manager)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return self.strategy.aggregate_evaluate(server_round + self.offset, results, failures)

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        if server_round == 0:  # Flower's check of the starting model: done in the original run
            return None
        return self.strategy.evaluate(server_round + self.offset, parameters)

    def end_round(self, server_round: int) -> None:
        self.strategy.end_round(server_round + self.offset)

    def can_overlap(self, server_round: int) -> bool:
        return self.strategy.can_overlap(server_round + self.offset)

    def fail(self, reason: str) -> None:
        self.strategy.fail(reason)
