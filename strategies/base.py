"""The base of every stamen strategy: a round of FedAvg with personalised evaluation, built from parts.

The parts live beside it: seeded sampling (``sampling``), the node map and preflight
(``nodes``), reply screening (``screening``), averaging (``aggregation``), records
and progress lines (``records``), checkpoints (``checkpoint``). A method subclasses
:class:`FederatedStrategy`, names its contract, and overrides a few hooks:

======================  =====================================================  ============================
hook                    what it decides                                         default
======================  =====================================================  ============================
``hyperparameters``     the values in force, sent in every fit config           the contract's keys
``evaluate_config``     what every evaluate config holds                        ``adapt-*``, ``adapt-lr`` = lr
``sample_fit``          which partitions train this round                       seeded, ``fraction-fit``
``sample_evaluate``     which partitions evaluate                               seeded, ``fraction-evaluate``
``begin_round``         set-up once a round's partitions are chosen             nothing
``parameters_for``      the model a partition is sent, for fit or evaluate      the global model's shared arrays
``payload_for``         the array sets sent beside it (the contract's sends)    none
``payload_shapes``      the shapes a returned array set must have               the shared arrays' shapes
``combine``             how accepted replies become the new global model        weighted average
``start``               set-up once the nodes are known (before round 1)        nothing
``state``/``restore``   what a checkpoint keeps besides the global model        nothing
``finish``              what the run writes at its end                          nothing
======================  =====================================================  ============================

Flower's ``Strategy`` methods are implemented here once and call the hooks; a method
never overrides them (``tests/test_registry.py`` checks every registered one). What
travels beside the model is declared in the contract (``sends``, ``returns``) and
packed by name (``strategies.contracts.payload``); a method with personal layers
(``personal``) has only its shared arrays sent, screened and averaged, while the
global model keeps the rest at their initial values. A round's record is written by
:meth:`end_round`, which :class:`strategies.server.RoundServer` calls after each
round's evaluation.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from logging import ERROR, INFO, WARNING
from typing import ClassVar

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from strategies.aggregation import weighted_average_inplace
from strategies.checkpoint import Checkpoint, CheckpointError, arrays_of_model, check_shapes, model_arrays
from strategies.contracts.common import EVALUATE_METRICS, FIT_METRICS, PARTITION_ID, Settings
from strategies.contracts.contract import Contract
from strategies.contracts.fedavg import CONTRACT as FEDAVG
from strategies.contracts.models import ModelLayout
from strategies.contracts.payload import LAYOUT, MODEL, layout_of, unpack
from strategies.nodes import NodeDirectory, PreflightError, data_lines
from strategies.recorder import NullRecorder, Recorder
from strategies.records import evaluation_summary, fit_summary, progress_line, run_summary, summary_line
from strategies.sampling import sample_partitions, sample_size
from strategies.screening import (
    Reply,
    evaluate_reply_problem,
    extras_problem,
    fit_reply_problem,
    is_non_finite,
    outsized,
    update_norm,
)
from strategies.tuner import PHI_METRIC, FathomTuner

PREFLIGHT_LOG = "preflight-errors.log"


class RunDivergedError(Exception):
    """The strategy ended the run early (it diverged); the message says why. Not a failure of the run."""

Failures = list[tuple[ClientProxy, FitRes] | tuple[ClientProxy, EvaluateRes] | BaseException]


class FederatedStrategy(Strategy):
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
        self.nodes = NodeDirectory()
        self.global_parameters = initial_parameters
        self.global_model = parameters_to_ndarrays(initial_parameters)  # decoded once, kept decoded
        self.shapes = [a.shape for a in self.global_model]
        self.layout = layout if isinstance(layout, ModelLayout) else ModelLayout.of_names(tuple(layout))
        self.shared = self._shared_indices(self.layout)  # the model's arrays that travel, by index
        self.sent_shapes = [self.shapes[i] for i in self.shared]
        self.global_shared = self._shared_part(self.global_model)
        self.model_travels = bool(self.shared)  # False under WholeModel: only the contract's array sets travel
        self.connected_partitions: list[int] = []  # the partitions connected when this round's fit was configured
        self._encoded: dict[int, tuple[list[np.ndarray], list[bytes]]] = {}  # while one round's messages are built
        self.fit_specs = {m.name: m for m in (*FIT_METRICS, *self.contract.metrics)}
        self.tuner: FathomTuner | None = None
        if settings.tuner is not None:  # tune = "fathom": the values in force move every round
            values = settings.as_run_config()
            self.tuner = FathomTuner(settings=settings.tuner, keys=self.contract.tunable.keys(values), start=values)
            self.fit_specs[PHI_METRIC.name] = PHI_METRIC
        self.evaluate_specs = {m.name: m for m in EVALUATE_METRICS}
        self.history: list[dict] = []
        self.record: dict = {}
        self.started = time.perf_counter()
        # when the server started (Unix time) and how long it took to reach round 1, for summary.json
        self.timing: dict[str, float] = {"server-started-unix": time.time()}
        self.evaluate_started = self.started
        self.sent_model = self.global_model  # the model sent in the current round
        self.last_good = (0, self.global_model)  # (the round it is the model after, its arrays), known good
        self.nonfinite_rounds = 0  # consecutive rounds with only non-finite replies or losses

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rounds={self.num_rounds})"

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

    def _shared_part(self, model: list[np.ndarray]) -> list[np.ndarray]:
        return model if len(self.shared) == len(model) else [model[i] for i in self.shared]

    def _use_model(self, model: list[np.ndarray]) -> None:
        """Make ``model`` (every array, personal ones included) the global model."""
        self.global_model = model
        self.global_shared = self._shared_part(model)
        self.global_parameters = ndarrays_to_parameters(model)

    def _use_shared(self, shared: list[np.ndarray]) -> None:
        """Make ``shared`` the global model's shared arrays; its personal ones keep their values."""
        if not self.shared:  # no model travels: there is nothing to change
            return
        if len(self.shared) == len(self.global_model):
            self._use_model(shared)
            return
        model = list(self.global_model)
        for index, array in zip(self.shared, shared, strict=True):
            model[index] = array
        self._use_model(model)

    @property
    def name(self) -> str:
        return self.contract.name

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

    def evaluate_config(self) -> dict[str, Scalar]:
        """What every evaluate config holds besides ``server-round``: the adaptation (``adapt-lr`` 0 means ``lr``)."""
        training = self.settings.training
        return {"adapt-steps": training.adapt_steps, "adapt-lr": training.adapt_lr or training.lr,
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

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        """The new global model's shared arrays from the round's accepted replies, and extra metrics for the record.

        ``None`` keeps the global model. The default averages the models, by example
        count or uniformly (``aggregation``). Replies come in partition order; their
        arrays may be overwritten; the sets the contract ``returns`` are in ``reply.extras``.
        """
        if not replies:
            return None, {}
        by_examples = self.settings.run.aggregation == "examples"
        weights = [reply.num_examples if by_examples else 1 for reply in replies]
        return weighted_average_inplace([reply.arrays for reply in replies], weights), {}

    def start(self) -> None:
        """Set-up once the nodes are known, before round 1 (``self.nodes.properties`` holds their answers)."""

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Named arrays and JSON scalars a checkpoint keeps for this method (the base has none)."""
        return {}, {}

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        """The inverse of :meth:`state`."""

    def finish(self) -> None:
        """What the run writes at its end, besides the summary (through ``self.recorder``)."""

    # --------------------------------------------------- Flower's Strategy API

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Wait for ``min-available-clients``, run the preflight, then :meth:`start`.

        A failed preflight logs one line per cause and where the clients' tracebacks
        went, then stops the run. Nodes left out for faults in their own data are
        logged the same way, and the run goes on with the others. Every admitted
        node's data (examples per split and class) is logged and kept for ``summary.json``.
        """
        self.nodes.wait_for(client_manager, self.settings.run.min_available_clients)
        self.timing["nodes-connected-seconds"] = time.perf_counter() - self.started
        if self.settings.run.preflight:
            try:
                left_out = self.nodes.preflight(client_manager, self.fit_config(0),
                                                sample=self.settings.run.preflight_sample, seed=self.settings.run.seed)
            except PreflightError as err:
                self._log_preflight(err, ERROR, "")
                raise
            if left_out is not None:
                self._log_preflight(left_out, WARNING, "left out: ")
            for line in data_lines(self.nodes.data_report(self.class_names())):
                log(INFO, "preflight: %s", line)
            if ray_nodes := self.nodes.ray_nodes():  # a run meant for a Ray cluster shows here whether it reached it
                log(INFO, "preflight: the clients ran on %d Ray node(s): %s", len(ray_nodes),
                    ", ".join(f"{node[:12]} ({count} clients)" for node, count in ray_nodes.items()))  # fmt: skip
            connected = self.timing["nodes-connected-seconds"]
            self.timing["preflight-seconds"] = time.perf_counter() - self.started - connected
            log(INFO, "preflight: took %.1f s", self.timing["preflight-seconds"])
        self.start()
        return self.global_parameters

    def _log_preflight(self, err: PreflightError, level: int, prefix: str) -> None:
        where = self.recorder.save_text(PREFLIGHT_LOG, err.detail)
        for line in err.lines:
            log(level, "preflight: %s%s", prefix, line)
        log(level, "preflight: the clients' full reports are in %s", where)

    def class_names(self) -> tuple[str, ...]:
        """The run's class names where it names them (a user's own data), else none (classes go by index)."""
        return self.settings.data_spec().classes

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        config = self.fit_config(server_round)  # the values in force, which the record keeps
        self.timing.setdefault("first-round-start-seconds", time.perf_counter() - self.started)
        self.sent_model = self.global_model
        self.record = {"round": server_round, "strategy": self.name, "_start": time.perf_counter()}
        self.record.update({f"hp-{k}": v for k, v in config.items() if k != "server-round"})
        nodes = self.nodes.connected(client_manager)
        self.connected_partitions = sorted(nodes)
        chosen = self.sample_fit(server_round, self.connected_partitions)
        self.record.update({"clients-sampled": len(chosen), "fit-partitions": chosen})
        self.begin_round(server_round, chosen, "fit")
        # each node is told its partition (a device with its own data learns its number so) and the layout
        configs = self.tuner.configs(server_round, chosen, config) if self.tuner is not None else {}
        instructions = [(nodes[p], FitIns(*self._message(p, "fit", configs.get(p, config)))) for p in chosen]
        self.record["fit-bytes-sent"] = sum(_size(ins.parameters) for _, ins in instructions)
        return instructions

    def _message(self, partition: int, purpose: str, config: dict[str, Scalar]) -> tuple[Parameters, dict[str, Scalar]]:
        """The parameters and config of one instruction: the model, the declared array sets, their layout.

        Raises
        ------
        RuntimeError
            If ``payload_for`` builds other array sets than the contract declares for ``purpose``.

        """
        model = self.parameters_for(partition, purpose)
        extras = self.payload_for(partition, purpose)
        declared = self.contract.sent_sets(purpose)
        if tuple(extras) != declared:
            raise RuntimeError(f"{type(self).__name__}.payload_for({partition}, {purpose!r}) built array sets "
                               f"{list(extras)}; {self.name}'s contract sends {list(declared)}")  # fmt: skip
        layout = layout_of({MODEL: model, **extras})
        if model is self.global_model and not extras:  # the common message: the global model, encoded once a round
            parameters = self.global_parameters
        else:
            tensors = [t for arrays in (model, *extras.values()) for t in self._encode(arrays)]
            parameters = Parameters(tensors=tensors, tensor_type=self.global_parameters.tensor_type)
        return parameters, {**config, PARTITION_ID: partition, LAYOUT: layout}

    def _encode(self, arrays: list[np.ndarray]) -> list[bytes]:
        """``arrays`` as Flower's bytes, each list encoded once however many messages carry it."""
        if arrays is self.global_model:
            return self.global_parameters.tensors
        if arrays is self.global_shared:
            return [self.global_parameters.tensors[i] for i in self.shared]
        cached = self._encoded.get(id(arrays))
        if cached is None or cached[0] is not arrays:
            cached = (arrays, [ndarray_to_bytes(a) for a in arrays])
            self._encoded[id(arrays)] = cached
        return cached[1]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: Failures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self._encoded.clear()  # this round's messages are built and sent
        self.record["fit-bytes-received"] = sum(_size(res.parameters) for _, res in results)
        replies, rejected = self.screen_fit(server_round, results)
        metrics = fit_summary(replies, self.fit_specs.values())
        previous = self.global_shared
        # a tuner's probe round: its clients tried several step sizes, and the model takes the start value's replies
        arrays, extra = self.combine(server_round, self.tuner.model_replies(replies) if self.tuner else replies)
        metrics.update(extra)
        if self.tuner is not None and replies:
            metrics.update(self.tuner.update(previous, arrays, replies))
        if arrays is not None:
            self._use_shared(arrays)
        elif not replies:
            log(WARNING, "round %s: no usable fit reply; the global model is unchanged", server_round)
        self.record.update({"clients-succeeded": len(replies), "clients-failed": len(failures) + rejected,
                            "clients-rejected": rejected, **metrics})  # fmt: skip
        self._record_failures("fit", server_round, failures)
        return (self.global_parameters if arrays is not None else None), metrics

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """The server's test of the global model after each round, when a central evaluation is given."""
        if self.central_evaluation is None or server_round == 0:
            return None
        metrics = self.central_evaluation(self.global_model)
        self.record.update({f"central-{k}": v for k, v in metrics.items()})
        return metrics["loss"], metrics

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.is_evaluation_round(server_round):
            return []
        self.evaluate_started = time.perf_counter()
        nodes = self.nodes.connected(client_manager)
        chosen = self.sample_evaluate(server_round, sorted(nodes))
        self.begin_round(server_round, chosen, "evaluate")
        config = {**self.evaluate_config(), "server-round": server_round}
        self.record["eval-adapt-lr"] = config.get("adapt-lr")  # the test-time step in force, which a tuner may move
        instructions = [(nodes[p], EvaluateIns(*self._message(p, "evaluate", config))) for p in chosen]
        self._encoded.clear()
        self.record["eval-bytes-sent"] = sum(_size(ins.parameters) for _, ins in instructions)
        return instructions

    def aggregate_evaluate(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]], failures: Failures
    ) -> tuple[float | None, dict[str, Scalar]]:
        accepted, non_finite = [], 0
        for proxy, res in sorted(results, key=lambda pair: self.nodes.partition_of(pair[0].cid)):
            try:
                problem = evaluate_reply_problem(res.loss, res.num_examples, res.metrics, self.evaluate_specs)
            except Exception as err:  # e.g. a loss that is not a number
                problem = f"unreadable reply ({err})"
            if problem is None:
                accepted.append((res.loss, res.num_examples, res.metrics))
            else:
                non_finite += is_non_finite(problem)
                log(WARNING, "round %s: rejected evaluate reply from %s: %s", server_round, self.nodes.label(proxy.cid),
                    problem)  # fmt: skip
        metrics = evaluation_summary(accepted)
        metrics["eval-clients-failed"] = len(results) - len(accepted) + len(failures)
        metrics["eval-clients-nonfinite"] = non_finite
        self.record.update(metrics)
        self.record["evaluate-seconds"] = time.perf_counter() - self.evaluate_started
        self._record_failures("evaluate", server_round, failures)
        return (metrics["loss"] if accepted else None), metrics

    # ------------------------------------------------------------- the round

    def in_force(self, key: str, default: Scalar) -> Scalar:
        """The value in force for ``key``: the tuner's when it moves that key, else ``default``."""
        return self.tuner.values().get(key, default) if self.tuner is not None else default

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        """The config dict sent with every fit instruction of ``server_round``: the values in force."""
        tuned = self.tuner.values() if self.tuner is not None else {}
        return {**self.hyperparameters(), **tuned, "server-round": server_round}

    def is_evaluation_round(self, server_round: int) -> bool:
        due = server_round % self.settings.run.eval_every == 0 or server_round == self.num_rounds
        return due and self.settings.run.fraction_evaluate > 0

    def screen_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]]) -> tuple[list[Reply], int]:
        """The replies that may be combined (decoded, in partition order) and how many were rejected.

        Each reply is unpacked by the layout it names; its model arrays are screened by
        the shapes sent, finiteness and the declared metrics, and every array set the
        contract ``returns`` by its own shapes (``payload_shapes``) and finiteness. The
        record counts the rejections for non-finite values (``clients-nonfinite``).
        """
        replies, rejected, non_finite = [], 0, 0
        returned = {name: self.payload_shapes(name) for name in self.contract.returned_sets()}
        for proxy, res in results:
            try:
                sets = unpack(parameters_to_ndarrays(res.parameters), res.metrics.get(LAYOUT))
                arrays = sets.pop(MODEL, [])
                metrics = {k: v for k, v in res.metrics.items() if k != LAYOUT}
                problem = (fit_reply_problem(arrays, res.num_examples, metrics, self.sent_shapes, self.fit_specs)
                           or extras_problem(sets, returned, self.name))  # fmt: skip
            except Exception as err:  # undecodable payloads are malformed replies too
                problem = f"unreadable reply ({err})"
            if problem is None:
                partition = self.nodes.partition_of(proxy.cid)
                replies.append(Reply(proxy.cid, partition, arrays, res.num_examples, metrics, extras=sets))
            else:
                log(WARNING, "round %s: rejected fit reply from %s: %s", server_round, self.nodes.label(proxy.cid),
                    problem)  # fmt: skip
                rejected += 1
                non_finite += is_non_finite(problem)
        self.record["clients-nonfinite"] = non_finite
        replies, too_large = self.screen_update_norms(server_round, replies)
        return sorted(replies, key=lambda reply: reply.partition), rejected + too_large

    def sent_to(self, partition: int) -> list[np.ndarray]:
        """The model arrays ``partition`` was sent this round (a reply's update is measured from them)."""
        return self.parameters_for(partition, "fit")

    def screen_update_norms(self, server_round: int, replies: list[Reply]) -> tuple[list[Reply], int]:
        """Record the round's update norms; drop replies beyond ``max-update-ratio`` times their median.

        Returns the replies kept and how many were dropped (``clients-outsized`` in the record).
        A method whose model never travels has no update: nothing is measured or recorded.
        """
        if not replies or not self.model_travels:
            return replies, 0
        norms = [update_norm(reply.arrays, self.sent_to(reply.partition)) for reply in replies]
        ratio, median = self.settings.run.max_update_ratio, float(np.median(norms))
        self.record.update({"update-norm-median": median, "update-norm-max": max(norms)})
        flags = outsized(norms, ratio)
        for reply, norm, flag in zip(replies, norms, flags, strict=True):
            if flag:
                log(WARNING, "round %s: rejected fit reply from %s: update norm %.4g is %.1f times the round's median "
                    "%.4g (max-update-ratio %g)", server_round, self.nodes.label(reply.node), norm, norm / median,
                    median, ratio)  # fmt: skip
        self.record["clients-outsized"] = sum(flags)
        return [reply for reply, flag in zip(replies, flags, strict=True) if not flag], sum(flags)

    def end_round(self, server_round: int) -> None:
        """Write the round's record, log a progress line, checkpoint when due, and finish after the last round."""
        record = dict(self.record) or {"round": server_round, "strategy": self.name}
        start = record.pop("_start", time.perf_counter())
        record["round-seconds"] = time.perf_counter() - start
        record["elapsed-seconds"] = time.perf_counter() - self.started
        self.history.append(record)
        self.record = {}
        self.recorder.record_round(record)
        log(INFO, progress_line(record, self.num_rounds))
        self.watch_divergence(server_round, record)
        every = self.settings.execution.checkpoint_every
        if every and (server_round % every == 0 or server_round == self.num_rounds):
            self.recorder.save_checkpoint(self.checkpoint(server_round))
        if server_round == self.num_rounds:
            self.finish()
            summary = self.summary("completed")
            self.recorder.finish(summary)
            log(INFO, "final: %s", summary_line(summary))

    def watch_divergence(self, server_round: int, record: dict) -> None:
        """Count consecutive non-finite rounds; after ``stop-after-nonfinite`` of them, stop the run.

        A round is non-finite when no fit reply was accepted and some were rejected for
        non-finite values, or when it evaluated and no loss was finite (the clients' or
        the server's). Otherwise the model it sent is known good. Stopping puts back the
        last good model, writes it as the checkpoint, and ends the run with
        ``status: stopped`` and the reason, naming the step sizes in force.

        Raises
        ------
        RunDivergedError
            When the run stops.

        """
        fit_bad = record.get("clients-succeeded", 0) == 0 and record.get("clients-nonfinite", 0) > 0
        evaluated = record.get("eval-clients", 0) + record.get("eval-clients-nonfinite", 0) > 0
        eval_bad = evaluated and record.get("eval-clients", 0) == 0
        central = record.get("central-loss")
        central_bad = isinstance(central, float) and not np.isfinite(central)
        if not (fit_bad or eval_bad or central_bad):
            self.nonfinite_rounds = 0
            self.last_good = (server_round - 1, self.sent_model)
            return
        self.nonfinite_rounds += 1
        patience = self.settings.run.stop_after_nonfinite
        if not patience or self.nonfinite_rounds < patience:
            return
        first = server_round - self.nonfinite_rounds + 1
        what = "every fit reply was non-finite" if fit_bad else "no evaluation loss was finite"
        steps = {k: self.in_force(k, v) for k, v in self.step_values().items()}
        shown = ", ".join(f"{k} = {v:g}" for k, v in steps.items()) or "the method's step sizes"
        good_round, good_model = self.last_good
        reason = (f"diverged: in rounds {first}-{server_round} {what}; the step sizes in force were {shown}; "
                  f"{self.divergence_hint()}; kept the model after round {good_round}, the last whose replies were "
                  "finite")  # fmt: skip
        self._use_model(good_model)
        self.recorder.save_checkpoint(self.checkpoint(good_round))
        self.finish()
        self.recorder.finish(self.summary("stopped", reason=reason, **{"last-good-round": good_round}))
        log(ERROR, "stamen: %s", reason)
        raise RunDivergedError(reason)

    def divergence_hint(self) -> str:
        """The likeliest cause of a diverged run, for its reason (base: the step sizes in force)."""
        return "most likely the cause: lower them"

    def step_values(self) -> dict[str, float]:
        """The run's value of each of the method's step-size keys (before a tuner moves them)."""
        values = self.settings.as_run_config()
        return {k: float(values[k]) for k in self.contract.step_keys() if k in values}

    def fail(self, reason: str) -> None:
        """End the run as failed: the records so far stay, and the summary says why (``status`` ``failed``)."""
        self.recorder.fail(self.summary("failed", reason=reason))
        log(ERROR, "stamen: the run failed after %d completed round(s): %s", len(self.history), reason)

    def summary(self, status: str, **extra: object) -> dict[str, object]:
        """``summary.json``: the run's final and best metrics, how it ended, and each node's data.

        ``status`` is ``completed``, ``stopped`` or ``failed``; ``extra`` adds the reason and the like.
        The nodes left out of the run are listed with why (node id -> reason).
        """
        out: dict[str, object] = {**run_summary(self.history, self.name), "status": status, **extra,
                                  "nodes": self.nodes.data_report(self.class_names())}  # fmt: skip
        if self.nodes.excluded:
            out["nodes-left-out"] = dict(self.nodes.excluded)
        if ray_nodes := self.nodes.ray_nodes():
            out["ray-nodes"] = ray_nodes
        if self.nodes.sampled:
            out["nodes-asked"] = len(self.nodes.sampled)  # "nodes" then holds only their data
        out["timing"] = dict(self.timing)
        return out

    def _sample(self, server_round: int, partitions: list[int], fraction: float, purpose: str) -> list[int]:
        minimum = self.settings.run.min_fit_clients
        size = sample_size(len(partitions), fraction, minimum)
        if len(partitions) < minimum:
            log(WARNING, "only %d node(s) connected (fewer than the %d asked for); sampling %d of them",
                len(partitions), minimum, size)  # fmt: skip
        return sample_partitions(partitions, size, seed=self.settings.run.seed, server_round=server_round,
                                 purpose=purpose)  # fmt: skip

    def _record_failures(self, kind: str, server_round: int, failures: Failures) -> None:
        for failure in failures:
            log(WARNING, "round %s: %s failed: %s", server_round, kind, describe_failure(failure))
        if failures:
            self.record[f"{kind}-failures"] = [describe_failure(f)[:500] for f in failures]

    # ------------------------------------------------------------- checkpoints

    def checkpoint(self, server_round: int) -> Checkpoint:
        """The run after ``server_round``: global model, round records, node map and the method's :meth:`state`."""
        own_arrays, own_state = self.state()
        state = {"strategy": self.name, "history": self.history, "elapsed-seconds": time.perf_counter() - self.started,
                 "node-properties": self.nodes.properties, "own": own_state}  # fmt: skip
        if self.tuner is not None:
            tuner_arrays, state["tuner"] = self.tuner.checkpoint_state()
            own_arrays = {**own_arrays, **tuner_arrays}
        # a copy: the run goes on changing its history and state after this call
        return Checkpoint(round=server_round, arrays={**model_arrays(self.global_model), **own_arrays},
                          state=copy.deepcopy(state))  # fmt: skip

    def resume(self, checkpoint: Checkpoint) -> Parameters:
        """Continue from ``checkpoint`` (after the preflight); returns the global model to start from.

        Raises
        ------
        CheckpointError
            If the checkpoint was written by another strategy or for another model.

        """
        if checkpoint.state.get("strategy") != self.name:
            raise CheckpointError(f"checkpoint was written by strategy {checkpoint.state.get('strategy')!r}, "
                                  f"this run is {self.name!r}")  # fmt: skip
        stored = arrays_of_model(checkpoint)
        check_shapes(self.shapes, stored)
        # JSON has no NaN: the checkpoint stores it as null
        self.history = [{k: np.nan if v is None else v for k, v in r.items()} for r in checkpoint.state["history"]]
        self.started = time.perf_counter() - float(checkpoint.state.get("elapsed-seconds", 0.0))
        # a node still connected keeps its partition; the preflight's fresh answers win where they differ
        self.nodes.properties = {**checkpoint.state.get("node-properties", {}), **self.nodes.properties}
        self.restore(checkpoint.arrays, checkpoint.state.get("own", {}))
        if self.tuner is not None:
            self.tuner.restore(checkpoint.arrays, checkpoint.state["tuner"])
        self._use_model(stored)
        log(INFO, "resumed after round %d of %d", checkpoint.round, self.num_rounds)
        if kept := self.contract.client_state(self.method):  # Context.state belongs to one Flower run
            log(WARNING, "resumed %s: its clients keep %s in Context.state, which a new run starts empty; the rounds "
                "after %d differ from an uninterrupted run's", self.name, kept, checkpoint.round)  # fmt: skip
        return self.global_parameters


def _size(parameters: Parameters) -> int:
    """The bytes of a message's arrays (what travels, less Flower's framing)."""
    return sum(len(tensor) for tensor in parameters.tensors)


def describe_failure(failure: object) -> str:
    """A failed reply or exception as one log-friendly line."""
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    proxy, res = failure  # a reply that arrived with an error status
    return f"node {proxy.cid}: {getattr(res, 'status', res)}"
