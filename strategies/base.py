"""The method object every stamen method subclasses: FedAvg with personalised evaluation, composed of members.

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

A method subclasses :class:`FederatedStrategy`, names its contract and overrides a few
hooks (``hyperparameters``, ``tuning``, ``evaluate_config``, ``sample_fit``,
``sample_evaluate``, ``begin_round``, ``parameters_for``, ``payload_for``,
``payload_shapes``, ``payload_dtypes``, ``combine``, ``start``, ``state``/``restore``,
``finish``, ``divergence_hint``): the table of what each decides and who overrides it
is in ``docs/architecture.md``. What travels beside the model is declared in the contract
(``sends``, ``returns``) and packed by name (``strategies.contracts.payload``); a method
with personal layers (``personal``) has only its shared arrays sent, screened and
averaged, while the global model keeps the rest at their initial values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from logging import WARNING
from typing import ClassVar

import numpy as np
from flwr.common.logger import log

from strategies.aggregation.rules import aggregate
from strategies.contracts.client_reports import EVALUATE_METRICS, FIT_METRICS
from strategies.contracts.contract import Contract
from strategies.contracts.fedavg import CONTRACT as FEDAVG
from strategies.contracts.models import ModelLayout
from strategies.contracts.payload import Scalar
from strategies.contracts.settings import MethodSettings, Settings
from strategies.nodes.directory import NodeDirectory
from strategies.rounds.checkpoint import Checkpoint
from strategies.rounds.divergence import DivergenceWatch
from strategies.rounds.global_model import GlobalModel, shared_indices
from strategies.rounds.phases import PREFLIGHT_LOG, RoundPhases
from strategies.rounds.recorder import NullRecorder, Recorder
from strategies.rounds.run_checkpoints import RunCheckpoints
from strategies.rounds.run_watch import RunDivergedError, RunWatch
from strategies.rounds.sampling import sample_partitions, sample_size
from strategies.screening.replies import Received, Reply
from strategies.screening.reply_screen import ReplyScreen, describe_failure
from strategies.screening.update_screen import UpdateNormScreen
from strategies.tuning.tuner import PHI_METRIC, FathomTuner

__all__ = ["PREFLIGHT_LOG", "FederatedStrategy", "RunDivergedError", "describe_failure"]


class FederatedStrategy:
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
                                  evaluate_specs={m.name: m for m in EVALUATE_METRICS},
                                  class_names=class_names)  # fmt: skip

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

    # ------------------------------------------------------------------ hooks

    def hyperparameters(self) -> dict[str, Scalar]:
        """The values in force: the shared keys the contract uses and the method's keys clients read."""
        training = self.settings.training.values()
        method = self.method.values()
        own = {k: method[k] for k in self.contract.broadcast_keys()}
        return {**{k: training[k] for k in self.contract.uses}, **own}

    def tuning(self) -> MethodSettings | None:
        """The tuner's settings when the values in force move every round (``tune = "fathom"``), else ``None``."""
        return self.settings.tuner

    def evaluate_config(self) -> dict[str, Scalar]:
        """What every evaluate config holds besides ``server-round``: the adaptation (``adapt-lr`` 0 means ``lr``).

        A contract that does not adapt at test (``adapts_at_test``) is sent ``adapt-steps`` 0.
        """
        training = self.settings.training
        steps = training.adapt_steps if self.contract.adapts_at_test else 0
        return {"adapt-steps": steps, "adapt-lr": training.adapt_lr or training.lr,
                "adapt-batch-size": training.adapt_batch_size}  # fmt: skip

    def sample_fit(self, server_round: int, partitions: list[int]) -> list[int]:
        """The partitions that train in ``server_round``: ``fraction-fit`` of those connected, seeded."""
        return self._sample(server_round, partitions, self.settings.run.fraction_fit, "fit")

    def sample_evaluate(self, server_round: int, partitions: list[int]) -> list[int]:
        """The partitions that evaluate in ``server_round``: ``fraction-evaluate`` of those connected, seeded."""
        return self._sample(server_round, partitions, self.settings.run.fraction_evaluate, "evaluate")

    def parameters_for(self, partition: int, purpose: str) -> list[np.ndarray]:
        """The model's arrays sent to ``partition`` in a ``purpose`` (``fit`` or ``evaluate``) instruction.

        The default is the global model's shared arrays (all of them, unless the contract
        keeps personal ones on the clients). A reply's update is measured from what this
        returns for ``fit``, so it must return the same arrays for a partition within a round.
        """
        return self.global_shared

    def begin_round(self, server_round: int, partitions: list[int], purpose: str) -> dict[str, Scalar]:
        """Called once ``purpose``'s (``fit``, ``evaluate``) ``partitions`` are chosen, before any message is built.

        A method whose :meth:`parameters_for` differs per client computes the round's
        payloads here (FedAMP's cloud models ``u_i``); they must stay as they are until the
        round's replies are combined (the update norms are measured from them). It returns
        entries for the round's record (``{}``: none).
        """
        return {}

    def payload_for(self, partition: int, purpose: str) -> dict[str, list[np.ndarray]]:
        """The array sets sent to ``partition`` beside the model: those the contract ``sends`` for ``purpose``."""
        return {}

    def payload_shapes(self, name: str) -> list[tuple[int, ...]]:
        """The shapes the returned array set ``name`` must have: by default those of the arrays that travel."""
        return self.sent_shapes

    def payload_dtypes(self, name: str) -> list[np.dtype]:
        """The dtypes the returned array set ``name`` must have: by default those of the arrays that travel."""
        return self.sent_dtypes

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        """The new global model's shared arrays from the round's accepted replies, and extra metrics for the record.

        ``None`` keeps the global model. The default averages the models as ``aggregation``
        says: by example count, uniformly, or robustly (coordinate-wise median, trimmed
        mean, Krum, multi-Krum). Replies come in partition order; their arrays may be
        overwritten; the sets the contract ``returns`` are in ``reply.extras``.
        """
        if not replies:
            return None, {}
        return self.average([reply.arrays for reply in replies], replies), {}

    def average(self, arrays: list[list[np.ndarray]], replies: list[Reply]) -> list[np.ndarray]:
        """The round's ``aggregation`` of ``arrays`` (one list per reply, in ``replies``' order; may be overwritten).

        A method that averages more than the models (SCAFFOLD's control variates) averages
        them through this too, so that every average it keeps is of the same kind.
        """
        run = self.settings.run
        return aggregate(arrays, self.averaging_weights(replies), rule=run.aggregation,
                         trim_fraction=run.trim_fraction, attackers=run.krum_attackers,
                         float_layers=self.float_layers)  # fmt: skip

    def averaging_weights(self, replies: list[Reply]) -> list[float]:
        """Each reply's weight in the round's average (``aggregation``): its example count, or 1 for every reply.

        The robust rules weigh every reply alike except multi-Krum, which averages the
        replies it keeps by these weights.
        """
        by_examples = self.settings.run.aggregation == "examples"
        return [float(reply.num_examples) if by_examples else 1.0 for reply in replies]

    def start(self) -> None:
        """Set-up once the nodes are known, before round 1 (``self.nodes.properties`` holds their answers)."""

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Named arrays and JSON scalars a checkpoint keeps for this method (the base has none)."""
        return {}, {}

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        """The inverse of :meth:`state`."""

    def finish(self) -> None:
        """What the run writes at its end, besides the summary (through ``self.recorder``)."""

    def divergence_hint(self) -> str:
        """The likeliest cause of a diverged run, for its reason (base: the step sizes in force)."""
        return "most likely the cause: lower them"

    def step_values(self) -> dict[str, float]:
        """The run's value of each of the method's step-size keys (before a tuner moves them)."""
        values = self.settings.as_run_config()
        return {k: float(values[k]) for k in self.contract.step_keys() if k in values}

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
        return self.parameters_for(partition, "fit")

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

    def _sample(self, server_round: int, partitions: list[int], fraction: float, purpose: str) -> list[int]:
        minimum = self.settings.run.min_fit_clients
        size = sample_size(len(partitions), fraction, minimum)
        if len(partitions) < minimum:
            log(WARNING, "only %d node(s) connected (fewer than the %d asked for); sampling %d of them",
                len(partitions), minimum, size)  # fmt: skip
        return sample_partitions(partitions, size, seed=self.settings.run.seed, server_round=server_round,
                                 purpose=purpose)  # fmt: skip
