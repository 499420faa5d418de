"""A round's phases for any method, in plain values: instructions out, replies in, the method's hooks called.

:class:`RoundPhases` is what the round engine (:class:`strategies.flower.rounds.Rounds`)
asks at each step of a round, with Flower's messages already read into stamen's values:
the preflight before round 1 (over a :class:`strategies.nodes.preflight.Fleet`), the fit and
evaluate instructions (the model a partition is sent, the contract's array sets and their
layout, each list of arrays encoded once a round) and the aggregation of the replies
through the members it is handed (the reply screen, the global model, the tuner, the
run's watch). It builds each round's record, kept apart by round number, so round r+1's
fit may be configured before round r's evaluation closes it (``overlap-rounds``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from typing import Protocol

import numpy as np
from flwr.common.logger import log

from strategies.aggregation.rules import all_finite
from strategies.contracts.client_reports import PARTITION_ID
from strategies.contracts.common import RunSettings
from strategies.contracts.contract import Contract, Metric
from strategies.contracts.payload import LAYOUT, MODEL, Scalar, layout_of, sets_problem, to_bytes
from strategies.nodes.data import data_lines
from strategies.nodes.directory import NodeDirectory
from strategies.nodes.preflight import Fleet, connected, preflight, wait_for
from strategies.nodes.preflight_errors import PreflightError
from strategies.rounds.evaluation_phase import EvaluationPhase
from strategies.rounds.global_model import GlobalModel
from strategies.rounds.pacing.pacer import Pacer
from strategies.rounds.pacing.staleness import rebase
from strategies.rounds.recorder import Recorder
from strategies.rounds.records import fit_summary
from strategies.rounds.run_watch import RunWatch
from strategies.screening.replies import Received, Reply
from strategies.screening.reply_screen import Failures, ReplyScreen
from strategies.tuning.tuner import FathomTuner

PREFLIGHT_LOG = "preflight-errors.log"


@dataclass
class OpenRound:
    """A round between its fit's configuration and its close: its record, when it began, the model it sent."""

    record: dict
    sent_model: list[np.ndarray]
    started: float = field(default_factory=time.perf_counter)
    evaluate_started: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class Instruction:
    """One node's fit or evaluate instruction: its arrays as they travel (packed, the layout in ``config``), config."""

    node: str
    tensors: list[bytes]
    config: dict[str, Scalar]


class MethodHooks(Protocol):
    """What :class:`RoundPhases` asks of the method: the hooks in ``base.py``, its name, contract."""

    name: str
    contract: Contract
    float_layers: list[bool]

    def fit_config(self, server_round: int) -> dict[str, Scalar]: ...
    def evaluate_config(self) -> dict[str, Scalar]: ...
    def sample_fit(self, server_round: int, partitions: list[int]) -> list[int]: ...
    def sample_evaluate(self, server_round: int, partitions: list[int]) -> list[int]: ...
    def begin_round(self, server_round: int, partitions: list[int], purpose: str) -> dict[str, Scalar]: ...
    def parameters_for(self, partition: int, purpose: str) -> list[np.ndarray]: ...
    def payload_for(self, partition: int, purpose: str) -> dict[str, list[np.ndarray]]: ...
    def screen_fit(self, server_round: int, results: list[Received]) -> tuple[list[Reply], int, dict]: ...
    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]: ...
    def start(self) -> None: ...


class RoundPhases(EvaluationPhase):
    """A round's phases for the method ``hooks`` (see the module's docstring); its members come as arguments.

    Parameters
    ----------
    hooks
        The method (its strategy object).
    run
        The run's settings (``min-available-clients``, the preflight, ``eval-every``, ...).
    model, nodes, tuner, reply_screen, watch, recorder
        The method's members: global model, node directory, tuner (or ``None``), reply
        screen (its failures' lines), the run's watch and the recorder (preflight reports).
    central_evaluation
        The server's test of the global model, or ``None``.
    fit_specs, evaluate_specs
        The metrics a fit and an evaluate reply may carry, by name.
    class_names
        The run's class names, for the nodes' data lines.
    pacer
        The run's pace (``strategies/rounds/pacing/pacer.py``): who may be sampled, and how many.

    """

    def __init__(self, *, hooks: MethodHooks, run: RunSettings, model: GlobalModel, nodes: NodeDirectory,
                 tuner: FathomTuner | None, reply_screen: ReplyScreen, watch: RunWatch, recorder: Recorder,
                 central_evaluation: Callable[[list[np.ndarray]], dict[str, float]] | None,
                 fit_specs: dict[str, Metric], evaluate_specs: dict[str, Metric],
                 class_names: tuple[str, ...], pacer: Pacer) -> None:  # fmt: skip
        self.hooks, self.run, self.model, self.nodes, self.tuner = hooks, run, model, nodes, tuner
        self.reply_screen, self.watch, self.recorder = reply_screen, watch, recorder
        self.central_evaluation, self.pacer = central_evaluation, pacer
        self.fit_specs, self.evaluate_specs, self.class_names = fit_specs, evaluate_specs, class_names
        self.sent_models: dict[int, list[np.ndarray]] = {}  # while a buffered update screens: what each was sent
        self.open: dict[int, OpenRound] = {}  # the rounds begun and not closed (two while rounds overlap)
        self.connected_partitions: list[int] = []  # the partitions connected when the last fit was configured
        self._encoded: dict[int, tuple[list[np.ndarray], list[bytes]]] = {}  # while one round's messages are built

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

    def start_run(self, fleet: Fleet) -> None:
        """Wait for ``min-available-clients``, run the preflight, then the method's ``start``.

        A failed preflight logs one line per cause and where the clients' tracebacks
        went, then stops the run. Nodes left out for faults in their own data are
        logged the same way, and the run goes on with the others. Every admitted
        node's data (examples per split and class) is logged and kept for ``summary.json``.
        """
        wait_for(fleet, self.run.min_available_clients)
        connected_at = self.watch.mark("nodes-connected-seconds")
        if self.run.preflight:
            try:
                left_out = preflight(self.nodes, fleet, self.hooks.fit_config(0), sample=self.run.preflight_sample,
                                     seed=self.run.seed)  # fmt: skip
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
            log(INFO, "preflight: took %.1f s", self.watch.mark_since("preflight-seconds", connected_at))
        self.hooks.start()

    def _log_preflight(self, err: PreflightError, level: int, prefix: str) -> None:
        where = self.recorder.save_text(PREFLIGHT_LOG, err.detail)
        for line in err.lines:
            log(level, "preflight: %s%s", prefix, line)
        log(level, "preflight: the clients' full reports are in %s", where)

    def fit_instructions(self, server_round: int, fleet: Fleet) -> list[Instruction]:
        """Round ``server_round`` begun: its sampled nodes' fit instructions, with the values in force."""
        config = self.hooks.fit_config(server_round)  # the values in force, which the record keeps
        self.watch.mark("first-round-start-seconds")
        record = {"round": server_round, "strategy": self.hooks.name}
        self.open[server_round] = OpenRound(record=record, sent_model=self.model.arrays)
        record.update({f"hp-{k}": v for k, v in config.items() if k != "server-round"})
        nodes = connected(self.nodes, fleet)
        self.connected_partitions = sorted(nodes)
        available = self.pacer.available(self.connected_partitions)  # on the virtual clock: the devices on now
        chosen = self.pacer.over_select(server_round, self.hooks.sample_fit(server_round, available), available)
        record.update({"clients-sampled": len(chosen), "fit-partitions": chosen})
        record.update(self.hooks.begin_round(server_round, chosen, "fit") or {})  # None: nothing to record
        # each node is told its partition (a device with its own data learns its number so) and the layout
        configs = self.tuner.configs(server_round, chosen, config) if self.tuner is not None else {}
        instructions = [self._instruction(nodes[p], p, "fit", configs.get(p, config)) for p in chosen]
        record["fit-bytes-sent"] = sum(len(t) for ins in instructions for t in ins.tensors)
        return instructions

    def _instruction(self, node: str, partition: int, purpose: str, config: dict[str, Scalar]) -> Instruction:
        """One node's instruction: the model, the declared array sets, their layout, its partition.

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
        tensors = [t for arrays in (model, *extras.values()) for t in self._encode(arrays)]
        return Instruction(node, tensors, {**config, PARTITION_ID: partition, LAYOUT: layout_of({MODEL: model,
                                                                                               **extras})})

    def _encode(self, arrays: list[np.ndarray]) -> list[bytes]:
        """``arrays`` as they travel, each list encoded once however many messages carry it."""
        if arrays is self.model.arrays:
            return self.model.tensors
        if arrays is self.model.shared_arrays:
            return [self.model.tensors[i] for i in self.model.shared]
        cached = self._encoded.get(id(arrays))
        if cached is None or cached[0] is not arrays:
            cached = (arrays, [to_bytes(a) for a in arrays])
            self._encoded[id(arrays)] = cached
        return cached[1]

    def take_fit(self, server_round: int, results: list[Received], failures: Failures, *,
                 stale: dict[int, tuple[list[np.ndarray], float]] | None = None) -> tuple[bool, dict]:  # fmt: skip
        """The round's fit replies screened and combined into the global model; whether it changed, the metrics.

        ``stale`` (the buffered pace): partition -> (the model arrays its reply was trained
        from, its weight); each reply is screened against what it was sent, then rebased onto
        what the partition would be sent now (``strategies/rounds/pacing/staleness.py``).
        """
        self._encoded.clear()  # this round's messages are built and sent
        record = self.round_of(server_round).record
        record["fit-bytes-received"] = sum(len(t) for res in results for t in res.tensors)
        self.sent_models = {p: sent for p, (sent, _) in (stale or {}).items()}
        replies, rejected, screened = self.hooks.screen_fit(server_round, results)
        self.sent_models = {}
        for reply in replies if stale else []:
            sent, weight = stale[reply.partition]
            reply.arrays[:] = rebase(self.hooks.parameters_for(reply.partition, "fit"), sent, reply.arrays, weight,
                                     self.hooks.float_layers)  # fmt: skip
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
        return arrays is not None, metrics
