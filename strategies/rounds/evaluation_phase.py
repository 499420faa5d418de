"""A round's evaluation phase: the server's test of the global model, the clients' instructions, their replies."""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.common.logger import log

from strategies.contracts.common import RunSettings
from strategies.contracts.contract import Metric
from strategies.nodes.directory import NodeDirectory
from strategies.nodes.preflight import Fleet, connected
from strategies.rounds.records import evaluation_summary
from strategies.screening.replies import Evaluation, evaluate_reply_problem, is_non_finite
from strategies.screening.reply_screen import Failures, ReplyScreen

if TYPE_CHECKING:  # the phases import this module
    from strategies.rounds.phases import Instruction


class EvaluationPhase:
    """The evaluation half of :class:`strategies.rounds.phases.RoundPhases` (its members are the phases')."""

    run: RunSettings
    nodes: NodeDirectory
    reply_screen: ReplyScreen
    central_evaluation: Callable[[list[np.ndarray]], dict[str, float]] | None
    evaluate_specs: dict[str, Metric]

    def is_evaluation_round(self, server_round: int) -> bool:
        last = server_round == self.run.num_server_rounds
        return (server_round % self.run.eval_every == 0 or last) and self.run.fraction_evaluate > 0

    def central_test(self, server_round: int) -> dict[str, float] | None:
        """The server's test of the global model after ``server_round``, when a central evaluation is given."""
        if self.central_evaluation is None:
            return None
        metrics = self.central_evaluation(self.model.arrays)
        self.round_of(server_round).record.update({f"central-{k}": v for k, v in metrics.items()})
        return metrics

    def evaluate_instructions(self, server_round: int, fleet: Fleet) -> list[Instruction]:
        """The sampled nodes' evaluate instructions, in an evaluation round (``eval-every``); else none."""
        if not self.is_evaluation_round(server_round):
            return []
        this = self.round_of(server_round)
        this.evaluate_started = time.perf_counter()
        nodes = connected(self.nodes, fleet)
        chosen = self.hooks.sample_evaluate(server_round, sorted(nodes))
        this.record.update(self.hooks.begin_round(server_round, chosen, "evaluate") or {})
        config = {**self.hooks.evaluate_config(), "server-round": server_round}
        this.record["eval-adapt-lr"] = config.get("adapt-lr")  # the test-time step in force, which a tuner may move
        instructions = [self._instruction(nodes[p], p, "evaluate", config) for p in chosen]
        self._encoded.clear()
        this.record["eval-bytes-sent"] = sum(len(t) for ins in instructions for t in ins.tensors)
        return instructions

    def take_evaluation(self, server_round: int, results: list[Evaluation], failures: Failures) -> dict:
        """The clients' evaluation screened and summarised into the round's record; the summary."""
        accepted, non_finite = [], 0
        for res in sorted(results, key=lambda res: self.nodes.partition_of(res.node)):
            try:
                problem = evaluate_reply_problem(res.loss, res.num_examples, res.metrics, self.evaluate_specs,
                                                 examples_limit=self.nodes.declared(res.node).num_test)  # fmt: skip
            except Exception as err:  # e.g. a loss that is not a number
                problem = f"unreadable reply ({err})"
            if problem is None:
                accepted.append((res.loss, res.num_examples, res.metrics))
            else:
                non_finite += is_non_finite(problem)
                log(WARNING, "round %s: rejected evaluate reply from %s: %s", server_round, self.nodes.label(res.node),
                    problem)  # fmt: skip
        metrics = evaluation_summary(accepted)
        metrics["eval-clients-failed"] = len(results) - len(accepted) + len(failures)
        metrics["eval-clients-nonfinite"] = non_finite
        this = self.round_of(server_round)
        this.record.update(metrics)
        this.record["evaluate-seconds"] = time.perf_counter() - this.evaluate_started
        this.record.update(self.reply_screen.failures("evaluate", server_round, failures))
        return metrics
