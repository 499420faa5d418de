"""Flower's legacy ``Strategy`` API, implemented once for every stamen method: messages out, replies in, hooks called.

The Message API adapter (:mod:`strategies.message_strategy`) drives these same methods,
turning their instructions into Messages and the replies back.

:class:`FlowerApi` is the part of :class:`strategies.base.FederatedStrategy` that Flower
calls: the preflight before round 1, the fit and evaluate instructions (the model a
partition is sent, the contract's array sets and their layout, each list of arrays
encoded once a round) and the aggregation of the replies through the other parts (the
reply screen, the global model, the run's watch and records). A method never overrides
these (``tests/test_registry.py``); it overrides the hooks in ``base.py``.
"""

from __future__ import annotations

import sys
import time
from logging import ERROR, INFO, WARNING

import numpy as np
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar, ndarray_to_bytes
from flwr.common.logger import log
from flwr.server import Server
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.contracts.client_reports import PARTITION_ID
from strategies.contracts.payload import LAYOUT, MODEL, layout_of, sets_problem
from strategies.node_data import data_lines
from strategies.preflight import connected, preflight, wait_for
from strategies.preflight_errors import PreflightError
from strategies.records import evaluation_summary, fit_summary
from strategies.reply_screen import Failures
from strategies.screening import evaluate_reply_problem, is_non_finite

PREFLIGHT_LOG = "preflight-errors.log"


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


class FlowerApi:
    """A part of :class:`strategies.base.FederatedStrategy` (see the module's docstring)."""

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

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Wait for ``min-available-clients``, run the preflight, then :meth:`start`.

        A failed preflight logs one line per cause and where the clients' tracebacks
        went, then stops the run. Nodes left out for faults in their own data are
        logged the same way, and the run goes on with the others. Every admitted
        node's data (examples per split and class) is logged and kept for ``summary.json``.

        Raises
        ------
        RuntimeError
            When Flower's plain ``Server`` calls it: that server never closes a round on
            the strategy, so the run would train and record nothing (:func:`refuse_plain_server`).

        """
        refuse_plain_server(sys._getframe(1).f_locals.get("self"))
        wait_for(client_manager, self.settings.run.min_available_clients)
        self.timing["nodes-connected-seconds"] = time.perf_counter() - self.started
        if self.settings.run.preflight:
            try:
                left_out = preflight(self.nodes, client_manager, self.fit_config(0),
                                     sample=self.settings.run.preflight_sample, seed=self.settings.run.seed)
            except PreflightError as err:
                self._log_preflight(err, ERROR, "")
                self.failure_groups = err.groups
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

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        config = self.fit_config(server_round)  # the values in force, which the record keeps
        self.timing.setdefault("first-round-start-seconds", time.perf_counter() - self.started)
        self.sent_model = self.global_model
        self.record = {"round": server_round, "strategy": self.name, "_start": time.perf_counter()}
        self.record.update({f"hp-{k}": v for k, v in config.items() if k != "server-round"})
        nodes = connected(self.nodes, client_manager)
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
            If ``payload_for`` builds other array sets than the contract declares for ``purpose``
            (an optional one may be left out).

        """
        model = self.parameters_for(partition, purpose)
        extras = self.payload_for(partition, purpose)
        if problem := sets_problem(list(extras), self.contract.sends, purpose):
            raise RuntimeError(f"{type(self).__name__}.payload_for({partition}, {purpose!r}): {problem} "
                               f"({self.name}'s contract)")  # fmt: skip
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
        replies, rejected, screened = self.screen_fit(server_round, results)
        self.record.update(screened)
        metrics = fit_summary(replies, self.fit_specs.values())
        previous = self.global_shared
        # a tuner's probe round: its clients tried several step sizes, and the model takes the start value's replies
        arrays, extra = self.combine(server_round, self.tuner.model_replies(replies) if self.tuner else replies)
        metrics.update(extra)
        if arrays is not None and not all_finite(arrays):
            # finite replies can still sum past float32's range; a non-finite global model would end the run
            log(WARNING, "round %s: the combined model holds non-finite values; it is dropped and the global model "
                "stays as it was (the round's replies were each finite: lower max-update-ratio or choose a robust "
                "aggregation)", server_round)  # fmt: skip
            arrays, metrics["aggregate-nonfinite"] = None, 1
        if self.tuner is not None and replies:
            metrics.update(self.tuner.update(previous, arrays, replies))
        if arrays is not None:
            self._use_shared(arrays)
        elif not replies:
            log(WARNING, "round %s: no usable fit reply; the global model is unchanged", server_round)
        self.record.update({"clients-succeeded": len(replies), "clients-failed": len(failures) + rejected,
                            "clients-rejected": rejected, **metrics})  # fmt: skip
        self.record.update(self.reply_screen.failures("fit", server_round, failures))
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
        nodes = connected(self.nodes, client_manager)
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
        self.record.update(metrics)
        self.record["evaluate-seconds"] = time.perf_counter() - self.evaluate_started
        self.record.update(self.reply_screen.failures("evaluate", server_round, failures))
        return (metrics["loss"] if accepted else None), metrics


def all_finite(arrays: list[np.ndarray]) -> bool:
    """Whether every floating-point value of ``arrays`` is finite (integer arrays always are)."""
    return all(np.all(np.isfinite(a)) for a in arrays if np.issubdtype(a.dtype, np.floating))


def _size(parameters: Parameters) -> int:
    """The bytes of a message's arrays (what travels, less Flower's framing)."""
    return sum(len(tensor) for tensor in parameters.tensors)
