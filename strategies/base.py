"""The method object: a method's settings and members over its hooks (FedAvg's, unless a method overrides them).

:class:`FederatedStrategy` holds the run's settings and the method's hooks, and composes
members that take their inputs as arguments (``tests/test_part_members.py`` checks that
none reads what it is not handed): the global model (``global_model``), the node map
(``nodes``), the reply screens (``reply_screen``, ``update_screen``), the tuner
(``tuner``), the round's phases (``rounds.phases.RoundPhases``, which build each round's
record), the run's records and summary (``run_watch``), the divergence watch
(``divergence``) and checkpoints (``run_checkpoints``). It is not a Flower strategy:
Flower's messages reach it through the round engine (:class:`strategies.flower.rounds.Rounds`),
which calls :meth:`FederatedStrategy.end_round` to close a round: the record goes to the
watch, then the divergence watch, checkpoints and the run's end.

A method whose server differs subclasses :class:`FederatedStrategy`, names its contract and
overrides a few hooks (:class:`strategies.methods.hooks.FedAvgHooks`: ``hyperparameters``,
``tuning``, ``evaluate_config``, ``sample_fit``, ``sample_evaluate``, ``begin_round``,
``parameters_for``, ``payload_for``, ``payload_shapes``, ``payload_dtypes``, ``combine``,
``start``, ``state``/``restore``, ``finish``, ``divergence_hint``): the table of what each decides and who overrides it
is in ``docs/architecture.md``. What travels beside the model is declared in the contract
(``sends``, ``returns``) and packed by name (``strategies.contracts.payload``); a method
with personal layers (``personal``) has only its shared arrays sent, screened and
averaged, while the global model keeps the rest at their initial values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from strategies.contracts.client_reports import EVALUATE_METRICS, FIT_METRICS
from strategies.contracts.contract import Contract
from strategies.contracts.fedavg import CONTRACT as FEDAVG
from strategies.contracts.models import ModelLayout
from strategies.contracts.payload import Scalar
from strategies.contracts.settings import Settings
from strategies.methods.hooks import FedAvgHooks
from strategies.nodes.directory import NodeDirectory
from strategies.rounds.checkpoint import Checkpoint
from strategies.rounds.divergence import DivergenceWatch
from strategies.rounds.global_model import GlobalModel, shared_indices
from strategies.rounds.pacing.pacer import Pacer
from strategies.rounds.phases import PREFLIGHT_LOG, RoundPhases
from strategies.rounds.recorder import NullRecorder, Recorder
from strategies.rounds.run_checkpoints import RunCheckpoints
from strategies.rounds.run_watch import RunDivergedError, RunWatch
from strategies.screening.replies import Received, Reply
from strategies.screening.reply_screen import ReplyScreen, describe_failure
from strategies.screening.update_screen import UpdateNormScreen
from strategies.tuning.tuner import PHI_METRIC, FathomTuner

__all__ = ["PREFLIGHT_LOG", "FederatedStrategy", "RunDivergedError", "describe_failure"]


class FederatedStrategy(FedAvgHooks):
    """FedAvg, hardened against bad clients, seeded, with personalised evaluation and per-round records.

    Every training reply is screened (array count and shapes, finite values, positive
    example count, metrics within their declared ranges) before it may touch the
    global model; a rejected reply is logged and counted as a failure. Every
    ``eval-every`` rounds (and in the last round) the sampled clients run the
    personalised evaluation; the server summarises it as an example-weighted mean
    plus the client mean, min, median and max. One record per round goes to the recorder.

    Parameters
    ----------
    settings
        The run's settings; ``settings.method`` must be this strategy's contract's settings.
    initial_model
        The global model before round 1: every array, in ``state_dict`` order.
    layout
        The model's :class:`~strategies.contracts.models.ModelLayout` (its ``state_dict``
        names in order, their dtypes, the kinds of layer owning them, its head:
        ``clients.models.layout_of(model)``), or just the names. A method whose contract
        keeps personal arrays on the clients needs it to find them.
    recorder
        Receives the round records, named arrays, checkpoints and the final summary.
    central_evaluation
        Optional: the global model's arrays -> metrics (``accuracy``, ``loss``) on the
        server's test data, recorded as ``central-*`` after every round.
    contract
        The method this object serves (default: the class's ``contract``, FedAvg's for the
        base). A method whose server needs no hooks of its own is the base built with its
        contract (``app.registry.Method.build``).

    """

    contract: ClassVar[Contract] = FEDAVG

    def __init__(
        self,
        *,
        settings: Settings,
        initial_model: list[np.ndarray],
        layout: ModelLayout | Sequence[str] = (),
        recorder: Recorder | None = None,
        central_evaluation: Callable[[list[np.ndarray]], dict[str, float]] | None = None,
        contract: Contract | None = None,
    ) -> None:
        if contract is not None:  # the base serves any contract; a method's own server class serves its own
            if type(self) is not FederatedStrategy and contract is not type(self).contract:
                raise TypeError(f"{type(self).__name__} serves {type(self).contract.name!r}, not {contract.name!r}")
            self.contract = contract
        if not isinstance(settings.method, self.contract.settings):
            raise TypeError(f"{type(self).__name__} needs {self.contract.settings.__name__}, "
                            f"got {type(settings.method).__name__}")  # fmt: skip
        self.settings = settings
        self.method = settings.method
        self.recorder = recorder if recorder is not None else NullRecorder()
        self.nodes = NodeDirectory(reply_s=settings.run.preflight_timeout)
        self.layout = layout if isinstance(layout, ModelLayout) else ModelLayout.of_names(tuple(layout))
        self.model = GlobalModel(arrays=list(initial_model), shared=shared_indices(
            len(initial_model), self.layout, self.contract, self.method, type(self).__name__))  # fmt: skip
        self.shapes = [a.shape for a in self.global_model]
        self.sent_shapes = [self.shapes[i] for i in self.shared]
        self.sent_dtypes = [self.global_model[i].dtype for i in self.shared]  # a reply's arrays must have these
        # which shared arrays are averaged: decided by the server's own model, never by a reply
        self.float_layers = [np.issubdtype(dtype, np.floating) for dtype in self.sent_dtypes]
        fit_specs = {m.name: m for m in (*FIT_METRICS, *self.contract.metrics)}
        self.tuner: FathomTuner | None = None
        if (tuning := self.tuning()) is not None:  # the values in force move every round
            values = settings.as_run_config()
            self.tuner = FathomTuner(settings=tuning, keys=self.contract.tunable.keys(values), start=values)
        if settings.tuner is not None:  # tune = "fathom" over another method: its clients report phi too
            fit_specs[PHI_METRIC.name] = PHI_METRIC
        self.divergence = DivergenceWatch(patience=settings.run.stop_after_nonfinite, initial_model=self.global_model)
        class_names = self.class_names()
        self.watch = RunWatch(hooks=self, settings=settings, recorder=self.recorder, nodes=self.nodes, model=self.model,
                              divergence=self.divergence, class_names=class_names)  # fmt: skip
        update_screen = UpdateNormScreen(ratio=settings.run.max_update_ratio, returns=self.contract.returns,
                                         nodes=self.nodes)  # fmt: skip
        self.reply_screen = ReplyScreen(name=self.name, returns=self.contract.returns, nodes=self.nodes,
                                        fit_specs=fit_specs, sent_shapes=self.sent_shapes,
                                        sent_dtypes=self.sent_dtypes, update_screen=update_screen)  # fmt: skip
        self.checkpoints = RunCheckpoints(name=self.name, num_rounds=self.num_rounds, nodes=self.nodes,
                                          kept_on_clients=self.contract.client_state(self.method))  # fmt: skip
        self.phases = RoundPhases(hooks=self, run=settings.run, model=self.model, nodes=self.nodes, tuner=self.tuner,
                                  reply_screen=self.reply_screen, watch=self.watch, recorder=self.recorder,
                                  central_evaluation=central_evaluation, fit_specs=fit_specs,
                                  evaluate_specs={m.name: m for m in EVALUATE_METRICS}, class_names=class_names,
                                  pacer=Pacer(fleet=settings.fleet, run=settings.run))  # fmt: skip

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, rounds={self.num_rounds})"

    @property
    def name(self) -> str:
        return self.contract.name

    @property
    def model_names(self) -> tuple[str, ...]:
        """The model's ``state_dict`` names in order (``()`` where the layout names none)."""
        return tuple(self.layout.names)

    @property
    def sent_names(self) -> tuple[str, ...]:
        """The names of the model's arrays that travel (``()`` where the layout names none)."""
        return tuple(self.layout.names[i] for i in self.shared) if self.layout.names else ()

    @property
    def num_rounds(self) -> int:
        return self.settings.run.num_server_rounds

    @property
    def global_model(self) -> list[np.ndarray]:
        """The global model's arrays, every one, in ``state_dict`` order."""
        return self.model.arrays

    @property
    def global_shared(self) -> list[np.ndarray]:
        """The global model's arrays that travel."""
        return self.model.shared_arrays

    @property
    def shared(self) -> list[int]:
        """The indices of the model's arrays that travel."""
        return self.model.shared

    @property
    def model_travels(self) -> bool:
        return self.model.travels

    @property
    def history(self) -> list[dict]:
        """The records of the rounds closed so far."""
        return self.watch.history

    @property
    def record(self) -> dict:
        """The record of the round in progress (read it; the round writes it)."""
        return self.phases.record

    @property
    def connected_partitions(self) -> list[int]:
        """The partitions connected when this round's fit was configured."""
        return self.phases.connected_partitions

    def in_force(self, key: str, default: Scalar) -> Scalar:
        """The value in force for ``key``: the tuner's when it moves that key, else ``default``."""
        return self.tuner.values().get(key, default) if self.tuner is not None else default

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        """The config dict sent with every fit instruction of ``server_round``: the values in force."""
        tuned = self.tuner.values() if self.tuner is not None else {}
        return {**self.hyperparameters(), **tuned, "server-round": server_round}

    # ------------------------------------------------------------------ a round's end, the run's end

    def end_round(self, server_round: int) -> None:
        """Close the round (its record to :attr:`watch`: the record, divergence watch, checkpoint, the run's end)."""
        closed = self.phases.take_record(server_round)
        self.watch.end_round(server_round, closed.record, started=closed.started, sent_model=closed.sent_model)

    def can_overlap(self, server_round: int) -> bool:
        """Whether round ``server_round + 1``'s fit may be configured before ``server_round`` closes.

        The round engine then sends it with the round's evaluation (``overlap-rounds``);
        the run is the same, since closing a round changes nothing the next fit reads,
        unless the method's contract says it does (``overlaps_rounds``) or the close writes
        a checkpoint, which must hold the state before the next round's sampling.
        """
        return self.contract.overlaps_rounds and not self.watch.checkpoint_due(server_round)

    def fail(self, reason: str) -> None:
        """End the run as failed: the records so far stay, and the summary says why (``status`` ``failed``)."""
        self.watch.fail(reason)

    def summary(self, status: str, **extra: object) -> dict[str, object]:
        """``summary.json`` as the run would end now with ``status`` (``completed``, ``stopped``, ``failed``)."""
        return self.watch.summary(status, **extra)

    def adopt_model(self, model: list[np.ndarray]) -> None:
        """Make ``model`` (every array, in ``state_dict`` order) the global model.

        Raises
        ------
        ValueError
            If its shapes or dtypes are not the run's model's.

        """
        self.model.adopt(model, type(self).__name__)

    # ------------------------------------------------------------------ the members, handed the hooks' answers

    def screen_fit(self, server_round: int, results: list[Received]) -> tuple[list[Reply], int, dict]:
        """The round's fit replies through :attr:`reply_screen`, against the shapes and dtypes the hooks give."""
        returned = {n: (self.payload_shapes(n), self.payload_dtypes(n)) for n in self.contract.returned_sets()}
        return self.reply_screen.screen_fit(server_round, results, returned=returned,
                                            sent_to=self.sent_to if self.model_travels else None)  # fmt: skip

    def sent_to(self, partition: int) -> list[np.ndarray]:
        """The model arrays ``partition`` was sent this round (a reply's update is measured from them)."""
        sent = self.phases.sent_models.get(partition)  # a buffered reply: the model its job was sent
        return sent if sent is not None else self.parameters_for(partition, "fit")

    def checkpoint(self, server_round: int) -> Checkpoint:
        """The run after ``server_round``: global model, round records, node map, the method's :meth:`state`."""
        return self.checkpoints.checkpoint(server_round, model=self.global_model, history=self.history,
                                           elapsed_seconds=self.watch.elapsed(), own=self.state(),
                                           tuner=self.tuner)  # fmt: skip

    def resume(self, checkpoint: Checkpoint) -> None:
        """Continue from ``checkpoint`` (after the preflight). A misfit raises ``CheckpointError``."""
        resumed = self.checkpoints.resume(checkpoint, model=self.global_model, tuner=self.tuner, restore=self.restore)
        self.watch.resumed(resumed.history, resumed.elapsed_seconds)
        self.model.use(resumed.model)

    def class_names(self) -> tuple[str, ...]:
        """The run's class names where it names them (a user's own data), else none (classes go by index)."""
        return self.settings.data_spec().classes

