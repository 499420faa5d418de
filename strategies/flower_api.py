"""Flower's legacy ``Strategy`` API, implemented once for every stamen method: messages out, replies in, hooks called.

:class:`FlowerRounds` is the member of :class:`strategies.base.FederatedStrategy` that
plays a round as Flower asks: the preflight before round 1, the fit and evaluate
instructions (the model a partition is sent, the contract's array sets and their layout,
each list of arrays encoded once a round) and the aggregation of the replies through the
members it is handed (the reply screen, the global model, the tuner, the run's watch).
It builds each round's record, a value :meth:`FlowerRounds.take_record` hands on when the
round closes; rounds are kept apart by number, so the Message API adapter may configure
round r+1's fit before round r's evaluation closes it (``overlap-rounds``). The method's
hooks come in as :class:`MethodHooks`; the strategy's Flower methods are one line each,
calling these. The Message API adapter (:mod:`strategies.message_strategy`) drives the
same methods, turning their instructions into Messages and the replies back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from typing import Protocol

import numpy as np
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar, ndarray_to_bytes
from flwr.common.logger import log
from flwr.server import Server
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.contracts.client_reports import PARTITION_ID
from strategies.contracts.common import RunSettings
from strategies.contracts.contract import Contract, Metric
from strategies.contracts.payload import LAYOUT, MODEL, layout_of, sets_problem
from strategies.global_model import GlobalModel
from strategies.node_data import data_lines
from strategies.nodes import NodeDirectory
from strategies.preflight import connected, preflight, wait_for
from strategies.preflight_errors import PreflightError
from strategies.recorder import Recorder
from strategies.records import evaluation_summary, fit_summary
from strategies.reply_screen import Failures, ReplyScreen
from strategies.run_watch import RunWatch
from strategies.screening import Reply, evaluate_reply_problem, is_non_finite
from strategies.tuner import FathomTuner

PREFLIGHT_LOG = "preflight-errors.log"


@dataclass
class OpenRound:
    """A round between its fit's configuration and its close: its record, when it began, the model it sent."""

    record: dict
    sent_model: list[np.ndarray]
    started: float = field(default_factory=time.perf_counter)
    evaluate_started: float = field(default_factory=time.perf_counter)


def refuse_plain_server(caller: object) -> None:
    """Refuse to run under a Flower ``Server`` that does not close rounds on the strategy (not stamen's RoundServer).

    A stamen strategy writes a round's record, the run's ``summary.json`` and its plots
    when ``end_round`` is called, which only :class:`strategies.server.RoundServer` does;
    under Flower's own ``Server`` (``ServerApp(config=..., strategy=...)``) the run would
    train and record nothing. Test code driving a strategy by hand is not a ``Server``
    and passes.
    """
    if isinstance(caller, Server) and not getattr(caller, "closes_rounds", False):
        raise RuntimeError(
            f"a stamen strategy runs inside stamen's RoundServer, which records each round; this one runs in "
            f"{type(caller).__name__} and would record nothing. Build the ServerApp with "
            "stamen.build_server_app(...) (docs/own-app.md), or return ServerAppComponents(server="
            "stamen.RoundServer(client_manager=SimpleClientManager(), strategy=strategy, max_workers=64), ...) "
            "from your server_fn"
        )


class MethodHooks(Protocol):
    """What :class:`FlowerRounds` asks of the method (its strategy): the hooks in ``base.py``, its name, contract."""

    name: str
    contract: Contract

    def fit_config(self, server_round: int) -> dict[str, Scalar]: ...
    def evaluate_config(self) -> dict[str, Scalar]: ...
    def sample_fit(self, server_round: int, partitions: list[int]) -> list[int]: ...
    def sample_evaluate(self, server_round: int, partitions: list[int]) -> list[int]: ...
    def begin_round(self, server_round: int, partitions: list[int], purpose: str) -> dict[str, Scalar]: ...
    def parameters_for(self, partition: int, purpose: str) -> list[np.ndarray]: ...
    def payload_for(self, partition: int, purpose: str) -> dict[str, list[np.ndarray]]: ...
    def screen_fit(self, server_round: int, results: list) -> tuple[list[Reply], int, dict]: ...
    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]: ...
    def start(self) -> None: ...


class FlowerRounds:
    """A round as Flower's legacy ``Strategy`` plays it, for any method (see the module's docstring).

    Parameters
    ----------
    hooks
        The method's hooks (its strategy).
    run
        The run's settings (``min-available-clients``, the preflight, ``eval-every``, ...).
    model
        The global model.
    nodes
        The node directory (partition <-> node, what each node declared).
    tuner
        The tuner moving the values in force, or ``None``.
    reply_screen
        Counts and logs failures (the fit replies go through ``hooks.screen_fit``).
    watch
        The run's timing and failure groups (the preflight's).
    recorder
        Where the preflight's full reports go.
    central_evaluation
        The server's test of the global model, or ``None``.
    fit_specs, evaluate_specs
        The metrics a fit and an evaluate reply may carry, by name.
    class_names
        The run's class names, for the nodes' data lines.

    """

    def __init__(self, *, hooks: MethodHooks, run: RunSettings, model: GlobalModel, nodes: NodeDirectory,
                 tuner: FathomTuner | None, reply_screen: ReplyScreen, watch: RunWatch, recorder: Recorder,
                 central_evaluation: Callable[[list[np.ndarray]], dict[str, float]] | None,
                 fit_specs: dict[str, Metric], evaluate_specs: dict[str, Metric],
                 class_names: tuple[str, ...]) -> None:  # fmt: skip
        self.hooks = hooks
        self.run = run
        self.model = model
        self.nodes = nodes
        self.tuner = tuner
        self.reply_screen = reply_screen
        self.watch = watch
        self.recorder = recorder
        self.central_evaluation = central_evaluation
        self.fit_specs = fit_specs
        self.evaluate_specs = evaluate_specs
        self.class_names = class_names
        self.open: dict[int, OpenRound] = {}  # the rounds begun and not closed (two while rounds overlap)
        self.connected_partitions: list[int] = []  # the partitions connected when the last fit was configured
        self._encoded: dict[int, tuple[list[np.ndarray], list[bytes]]] = {}  # while one round's messages are built

    def is_evaluation_round(self, server_round: int) -> bool:
        due = server_round % self.run.eval_every == 0 or server_round == self.run.num_server_rounds
        return due and self.run.fraction_evaluate > 0

    @property
    def record(self) -> dict:
        """The record of the round begun last (``{}`` when none is open); with rounds overlapping, the next round's."""
        return self.open[max(self.open)].record if self.open else {}

    def round_of(self, server_round: int) -> OpenRound:
        """``server_round`` as it stands, begun now (``round`` and ``strategy``) if no fit began it."""
        if server_round not in self.open:
            self.open[server_round] = OpenRound(record={"round": server_round, "strategy": self.hooks.name},
                                                sent_model=self.model.arrays)  # fmt: skip
        return self.open[server_round]

    def take_record(self, server_round: int) -> OpenRound:
        """The round's record (``round`` and ``strategy`` at least), when it began and the model it sent; closed."""
        closed = self.round_of(server_round)
        del self.open[server_round]
        return closed

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters:
        """Wait for ``min-available-clients``, run the preflight, then the method's ``start``; the global model.

        A failed preflight logs one line per cause and where the clients' tracebacks
        went, then stops the run. Nodes left out for faults in their own data are
        logged the same way, and the run goes on with the others. Every admitted
        node's data (examples per split and class) is logged and kept for ``summary.json``.
        """
        wait_for(client_manager, self.run.min_available_clients)
        connected_at = self.watch.mark("nodes-connected-seconds")
        if self.run.preflight:
            try:
                left_out = preflight(self.nodes, client_manager, self.hooks.fit_config(0),
                                     sample=self.run.preflight_sample, seed=self.run.seed)  # fmt: skip
            except PreflightError as err:
                self._log_preflight(err, ERROR, "")
                self.watch.failure_groups = err.groups
                raise
            if left_out is not None:
                self._log_preflight(left_out, WARNING, "left out: ")
            for line in data_lines(self.nodes.data_report(self.class_names)):
                log(INFO, "preflight: %s", line)
            if ray_nodes := self.nodes.ray_nodes():  # a run meant for a Ray cluster shows here whether it reached it
                log(INFO, "preflight: the clients ran on %d Ray node(s): %s", len(ray_nodes),
                    ", ".join(f"{node[:12]} ({count} clients)" for node, count in ray_nodes.items()))  # fmt: skip
            took = self.watch.timing["preflight-seconds"] = self.watch.elapsed() - connected_at
            log(INFO, "preflight: took %.1f s", took)
        self.hooks.start()
        return self.model.parameters

    def _log_preflight(self, err: PreflightError, level: int, prefix: str) -> None:
        where = self.recorder.save_text(PREFLIGHT_LOG, err.detail)
        for line in err.lines:
            log(level, "preflight: %s%s", prefix, line)
        log(level, "preflight: the clients' full reports are in %s", where)

    def configure_fit(self, server_round: int, client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        config = self.hooks.fit_config(server_round)  # the values in force, which the record keeps
        self.watch.mark("first-round-start-seconds")
        record = {"round": server_round, "strategy": self.hooks.name}
        self.open[server_round] = OpenRound(record=record, sent_model=self.model.arrays)
        record.update({f"hp-{k}": v for k, v in config.items() if k != "server-round"})
        nodes = connected(self.nodes, client_manager)
        self.connected_partitions = sorted(nodes)
        chosen = self.hooks.sample_fit(server_round, self.connected_partitions)
        record.update({"clients-sampled": len(chosen), "fit-partitions": chosen})
        record.update(self.hooks.begin_round(server_round, chosen, "fit") or {})  # None: nothing to record
        # each node is told its partition (a device with its own data learns its number so) and the layout
        configs = self.tuner.configs(server_round, chosen, config) if self.tuner is not None else {}
        instructions = [(nodes[p], FitIns(*self._message(p, "fit", configs.get(p, config)))) for p in chosen]
        record["fit-bytes-sent"] = sum(_size(ins.parameters) for _, ins in instructions)
        return instructions

    def _message(self, partition: int, purpose: str, config: dict[str, Scalar]) -> tuple[Parameters, dict[str, Scalar]]:
        """The parameters and config of one instruction: the model, the declared array sets, their layout.

        Raises
        ------
        RuntimeError
            If ``payload_for`` builds other array sets than the contract declares for ``purpose``
            (an optional one may be left out).

        """
        model = self.hooks.parameters_for(partition, purpose)
        extras = self.hooks.payload_for(partition, purpose)
        if problem := sets_problem(list(extras), self.hooks.contract.sends, purpose):
            raise RuntimeError(f"{type(self.hooks).__name__}.payload_for({partition}, {purpose!r}): {problem} "
                               f"({self.hooks.name}'s contract)")  # fmt: skip
        layout = layout_of({MODEL: model, **extras})
        if model is self.model.arrays and not extras:  # the common message: the global model, encoded once a round
            parameters = self.model.parameters
        else:
            tensors = [t for arrays in (model, *extras.values()) for t in self._encode(arrays)]
            parameters = Parameters(tensors=tensors, tensor_type=self.model.parameters.tensor_type)
        return parameters, {**config, PARTITION_ID: partition, LAYOUT: layout}

    def _encode(self, arrays: list[np.ndarray]) -> list[bytes]:
        """``arrays`` as Flower's bytes, each list encoded once however many messages carry it."""
        if arrays is self.model.arrays:
            return self.model.parameters.tensors
        if arrays is self.model.shared_arrays:
            return [self.model.parameters.tensors[i] for i in self.model.shared]
        cached = self._encoded.get(id(arrays))
        if cached is None or cached[0] is not arrays:
            cached = (arrays, [ndarray_to_bytes(a) for a in arrays])
            self._encoded[id(arrays)] = cached
        return cached[1]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: Failures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self._encoded.clear()  # this round's messages are built and sent
        record = self.round_of(server_round).record
        record["fit-bytes-received"] = sum(_size(res.parameters) for _, res in results)
        replies, rejected, screened = self.hooks.screen_fit(server_round, results)
        record.update(screened)
        metrics = fit_summary(replies, self.fit_specs.values())
        previous = self.model.shared_arrays
        # a tuner's probe round: its clients tried several step sizes, and the model takes the start value's replies
        arrays, extra = self.hooks.combine(server_round, self.tuner.model_replies(replies) if self.tuner else replies)
        metrics.update(extra)
        if arrays is not None and not all_finite(arrays):
            # finite replies can still sum past float32's range; a non-finite global model would end the run
            log(WARNING, "round %s: the combined model holds non-finite values; it is dropped and the global model "
                "stays as it was (the round's replies were each finite: lower max-update-ratio or choose a robust "
                "aggregation)", server_round)  # fmt: skip
            arrays, metrics["aggregate-nonfinite"] = None, 1
        if self.tuner is not None:
            if replies:
                metrics.update(self.tuner.update(previous, arrays, replies))
            if (not replies and screened.get("clients-nonfinite", 0)) or metrics.get("aggregate-nonfinite"):
                metrics.update(self.tuner.nonfinite_round())
            if (restored := self.tuner.restored_model()) is not None:
                arrays = restored  # safe ascent fell back: the model of the lowest loss goes out next
        if arrays is not None:
            self.model.use_shared(arrays)
        elif not replies:
            log(WARNING, "round %s: no usable fit reply; the global model is unchanged", server_round)
        record.update({"clients-succeeded": len(replies), "clients-failed": len(failures) + rejected,
                       "clients-rejected": rejected, **metrics})  # fmt: skip
        record.update(self.reply_screen.failures("fit", server_round, failures))
        return (self.model.parameters if arrays is not None else None), metrics

    def evaluate(self, server_round: int) -> tuple[float, dict[str, Scalar]] | None:
        """The server's test of the global model after each round, when a central evaluation is given."""
        if self.central_evaluation is None or server_round == 0:
            return None
        metrics = self.central_evaluation(self.model.arrays)
        self.round_of(server_round).record.update({f"central-{k}": v for k, v in metrics.items()})
        return metrics["loss"], metrics

    def configure_evaluate(
        self, server_round: int, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.is_evaluation_round(server_round):
            return []
        this = self.round_of(server_round)
        this.evaluate_started = time.perf_counter()
        nodes = connected(self.nodes, client_manager)
        chosen = self.hooks.sample_evaluate(server_round, sorted(nodes))
        this.record.update(self.hooks.begin_round(server_round, chosen, "evaluate") or {})
        config = {**self.hooks.evaluate_config(), "server-round": server_round}
        this.record["eval-adapt-lr"] = config.get("adapt-lr")  # the test-time step in force, which a tuner may move
        instructions = [(nodes[p], EvaluateIns(*self._message(p, "evaluate", config))) for p in chosen]
        self._encoded.clear()
        this.record["eval-bytes-sent"] = sum(_size(ins.parameters) for _, ins in instructions)
        return instructions

    def aggregate_evaluate(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]], failures: Failures
    ) -> tuple[float | None, dict[str, Scalar]]:
        accepted, non_finite = [], 0
        for proxy, res in sorted(results, key=lambda pair: self.nodes.partition_of(pair[0].cid)):
            try:
                problem = evaluate_reply_problem(res.loss, res.num_examples, res.metrics, self.evaluate_specs,
                                                 examples_limit=self.nodes.declared(proxy.cid).num_test)  # fmt: skip
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
        this = self.round_of(server_round)
        this.record.update(metrics)
        this.record["evaluate-seconds"] = time.perf_counter() - this.evaluate_started
        this.record.update(self.reply_screen.failures("evaluate", server_round, failures))
        return (metrics["loss"] if accepted else None), metrics


def all_finite(arrays: list[np.ndarray]) -> bool:
    """Whether every floating-point value of ``arrays`` is finite (integer arrays always are)."""
    return all(np.all(np.isfinite(a)) for a in arrays if np.issubdtype(a.dtype, np.floating))


def _size(parameters: Parameters) -> int:
    """The bytes of a message's arrays (what travels, less Flower's framing)."""
    return sum(len(tensor) for tensor in parameters.tensors)
