"""The base of every stamen strategy: a round of FedAvg with personalised evaluation, composed of parts.

:class:`FederatedStrategy` holds the run's settings and the method's hooks; the rest is
in parts, each a file of its own. Mixins share its ``self`` (``flower_api.FlowerApi``:
Flower's ``Strategy`` API, the messages and aggregation; ``global_model``: the arrays
that travel; ``run_watch``: the record per round, the divergence watch, the summary);
members take their inputs as arguments (``reply_screen``: the screen every fit reply
passes, failures reported; ``update_screen``: outsized updates; ``divergence``: the
non-finite rounds; ``run_checkpoints``: checkpoints and resuming; ``tests/test_part_members.py``),
and their pure helpers: seeded sampling (``sampling``), the node map and preflight
(``nodes``), reply checks (``screening``), averaging (``aggregation``), records and
progress lines (``records``), checkpoint files (``checkpoint``). A method subclasses
:class:`FederatedStrategy`, names its contract, and overrides a few hooks:

======================  =====================================================  ============================
hook                    what it decides                                         default
======================  =====================================================  ============================
``hyperparameters``     the values in force, sent in every fit config           the contract's keys
``tuning``              the tuner's settings, when the values in force move     ``tune``'s (``fathom-*``) or none
``evaluate_config``     what every evaluate config holds                        ``adapt-*``, ``adapt-lr`` = lr
``sample_fit``          which partitions train this round                       seeded, ``fraction-fit``
``sample_evaluate``     which partitions evaluate                               seeded, ``fraction-evaluate``
``begin_round``         set-up once a round's partitions are chosen             nothing
``parameters_for``      the model a partition is sent, for fit or evaluate      the global model's shared arrays
``payload_for``         the array sets sent beside it (the contract's sends)    none
``payload_shapes``      the shapes a returned array set must have               the shared arrays' shapes
``payload_dtypes``      the dtypes a returned array set must have               the shared arrays' dtypes
``combine``             how accepted replies become the new global model        ``aggregation``'s average
``start``               set-up once the nodes are known (before round 1)        nothing
``state``/``restore``   what a checkpoint keeps besides the global model        nothing
``finish``              what the run writes at its end                          nothing
======================  =====================================================  ============================

Flower's ``Strategy`` methods are implemented once (``flower_api``) and call the hooks; a method
never overrides them (``tests/test_registry.py`` checks every registered one). What
travels beside the model is declared in the contract (``sends``, ``returns``) and
packed by name (``strategies.contracts.payload``); a method with personal layers
(``personal``) has only its shared arrays sent, screened and averaged, while the
global model keeps the rest at their initial values. A round's record is written by
:meth:`end_round`, which :class:`strategies.server.RoundServer` calls after each
round's evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from logging import WARNING
from typing import ClassVar

import numpy as np
from flwr.common import Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.strategy import Strategy

from strategies.aggregation import aggregate
from strategies.checkpoint import Checkpoint
from strategies.contracts.client_reports import EVALUATE_METRICS, FIT_METRICS
from strategies.contracts.contract import Contract
from strategies.contracts.fedavg import CONTRACT as FEDAVG
from strategies.contracts.models import ModelLayout
from strategies.contracts.settings import MethodSettings, Settings
from strategies.divergence import DivergenceWatch
from strategies.flower_api import PREFLIGHT_LOG, FlowerApi
from strategies.global_model import GlobalModelPart
from strategies.nodes import NodeDirectory
from strategies.recorder import NullRecorder, Recorder
from strategies.reply_screen import ReplyScreen, describe_failure
from strategies.run_checkpoints import RunCheckpoints
from strategies.run_watch import RunDivergedError, RunWatch
from strategies.sampling import sample_partitions, sample_size
from strategies.screening import Reply
from strategies.tuner import PHI_METRIC, FathomTuner
from strategies.update_screen import UpdateNormScreen

__all__ = ["PREFLIGHT_LOG", "FederatedStrategy", "RunDivergedError", "describe_failure"]

class FederatedStrategy(FlowerApi, GlobalModelPart, RunWatch, Strategy):
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
    initial_parameters
        The global model before round 1.
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

    """

    contract: ClassVar[Contract] = FEDAVG

    def __init__(
        self,
        *,
        settings: Settings,
        initial_parameters: Parameters,
        layout: ModelLayout | Sequence[str] = (),
        recorder: Recorder | None = None,
        central_evaluation: Callable[[list[np.ndarray]], dict[str, float]] | None = None,
    ) -> None:
        if not isinstance(settings.method, self.contract.settings):
            raise TypeError(f"{type(self).__name__} needs {self.contract.settings.__name__}, "
                            f"got {type(settings.method).__name__}")  # fmt: skip
        self.settings = settings
        self.method = settings.method
        self.recorder = recorder if recorder is not None else NullRecorder()
        self.central_evaluation = central_evaluation
        self.nodes = NodeDirectory(reply_s=settings.run.preflight_timeout)
        self.failure_groups: list[dict] = []  # why the run could not start, by cause (summary.json)
        self.global_parameters = initial_parameters
        self.global_model = parameters_to_ndarrays(initial_parameters)  # decoded once, kept decoded
        self.shapes = [a.shape for a in self.global_model]
        self.layout = layout if isinstance(layout, ModelLayout) else ModelLayout.of_names(tuple(layout))
        self.shared = self._shared_indices(self.layout)  # the model's arrays that travel, by index
        self.sent_shapes = [self.shapes[i] for i in self.shared]
        self.sent_dtypes = [self.global_model[i].dtype for i in self.shared]  # a reply's arrays must have these
        # which shared arrays are averaged: decided by the server's own model, never by a reply
        self.float_layers = [np.issubdtype(dtype, np.floating) for dtype in self.sent_dtypes]
        self.global_shared = self._shared_part(self.global_model)
        self.connected_partitions: list[int] = []  # the partitions connected when this round's fit was configured
        self._encoded: dict[int, tuple[list[np.ndarray], list[bytes]]] = {}  # while one round's messages are built
        self.fit_specs = {m.name: m for m in (*FIT_METRICS, *self.contract.metrics)}
        self.tuner: FathomTuner | None = None
        if (tuning := self.tuning()) is not None:  # the values in force move every round
            values = settings.as_run_config()
            self.tuner = FathomTuner(settings=tuning, keys=self.contract.tunable.keys(values), start=values)
        if settings.tuner is not None:  # tune = "fathom" over another method: its clients report phi too
            self.fit_specs[PHI_METRIC.name] = PHI_METRIC
        self.evaluate_specs = {m.name: m for m in EVALUATE_METRICS}
        self.history: list[dict] = []
        self.record: dict = {}
        self.started = time.perf_counter()
        # when the server started (Unix time) and how long it took to reach round 1, for summary.json
        self.timing: dict[str, float] = {"server-started-unix": time.time()}
        self.evaluate_started = self.started
        self.sent_model = self.global_model  # the model sent in the current round
        self.divergence = DivergenceWatch(patience=settings.run.stop_after_nonfinite, initial_model=self.global_model)
        update_screen = UpdateNormScreen(ratio=settings.run.max_update_ratio, returns=self.contract.returns,
                                         nodes=self.nodes)  # fmt: skip
        self.reply_screen = ReplyScreen(name=self.name, returns=self.contract.returns, nodes=self.nodes,
                                        fit_specs=self.fit_specs, sent_shapes=self.sent_shapes,
                                        sent_dtypes=self.sent_dtypes, update_screen=update_screen)  # fmt: skip
        self.checkpoints = RunCheckpoints(name=self.name, num_rounds=self.num_rounds, nodes=self.nodes,
                                          kept_on_clients=self.contract.client_state(self.method))  # fmt: skip

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rounds={self.num_rounds})"

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

    def begin_round(self, server_round: int, partitions: list[int], purpose: str) -> None:
        """Called once ``purpose``'s (``fit``, ``evaluate``) ``partitions`` are chosen, before any message is built.

        A method whose :meth:`parameters_for` differs per client computes the round's
        payloads here (FedAMP's cloud models ``u_i``); they must stay as they are until the
        round's replies are combined (the update norms are measured from them).
        """

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

    # ------------------------------------------------------------- the members, handed the hooks' answers; helpers

    def screen_fit(self, server_round: int, results: list) -> tuple[list[Reply], int, dict]:
        """The round's fit replies through :attr:`reply_screen`, against the shapes and dtypes the hooks give."""
        returned = {n: (self.payload_shapes(n), self.payload_dtypes(n)) for n in self.contract.returned_sets()}
        return self.reply_screen.screen_fit(server_round, results, returned=returned,
                                            sent_to=self.sent_to if self.model_travels else None)  # fmt: skip

    def checkpoint(self, server_round: int) -> Checkpoint:
        """The run after ``server_round``: global model, round records, node map, the method's :meth:`state`."""
        return self.checkpoints.checkpoint(server_round, model=self.global_model, history=self.history,
                                           elapsed_seconds=time.perf_counter() - self.started, own=self.state(),
                                           tuner=self.tuner)  # fmt: skip

    def resume(self, checkpoint: Checkpoint) -> Parameters:
        """Continue from ``checkpoint`` (after the preflight); the global model. A misfit raises ``CheckpointError``."""
        resumed = self.checkpoints.resume(checkpoint, model=self.global_model, tuner=self.tuner, restore=self.restore)
        self.history = resumed.history
        self.started = time.perf_counter() - resumed.elapsed_seconds
        self._use_model(resumed.model)
        return self.global_parameters

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
