"""FedAvg with validated replies, personalised-evaluation summaries and per-round records."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from logging import INFO, WARNING

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesIns,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from strategies.checkpoint import Checkpoint, CheckpointError, arrays_of_model, check_shapes, model_arrays
from strategies.recorder import NullRecorder, Recorder
from strategies.summaries import summarise, weighted_mean
from strategies.validation import evaluate_reply_problem, fit_reply_problem
from strategies.vectors import weighted_average_inplace

PREFLIGHT_WAIT_S = 600  # how long the preflight waits for the clients to connect
PREFLIGHT_REPLY_S = 300  # a node that has not answered by then counts as unable to start
PREFLIGHT_WORKERS = 8
AGGREGATIONS = ("examples", "uniform")


class PersonalisedFedAvg(FedAvg):
    """Flower's FedAvg, made safe against bad clients and reporting personalised metrics.

    Every training reply is checked (array count and shapes, finite values,
    positive example count, sane metrics) before aggregation; a rejected reply is
    logged and counted as a failure, and cannot change the global model. Every
    ``eval_every`` rounds (and in the last round) all sampled clients run the
    personalised evaluation; the server summarises it as an example-weighted mean
    plus min / median / max over clients. One record per round goes to ``recorder``.

    Parameters
    ----------
    num_rounds
        Rounds in the run (the last one is always evaluated and closes the record).
    fit_config, evaluate_config
        Values broadcast to clients in every fit / evaluate config dict, besides
        ``server-round``.
    eval_every
        Evaluate every this many rounds.
    recorder
        Receives the per-round records and the final summary.
    name
        The strategy's registry name, written into every record.
    aggregation
        ``examples`` weighs each returned model by its example count (FedAvg);
        ``uniform`` averages them equally (the Per-FedAvg paper's Algorithm 1).
    central_evaluation
        Optional: maps the global model's arrays to metrics (``accuracy``,
        ``loss``) computed on the server; called after every round's aggregation
        and recorded as ``central-*`` (benchmarks; a deployment's server rarely
        holds test data).
    preflight
        Ask every connected client for its properties (with the first round's fit
        config) before the first round, and stop the run with the clients' errors
        if any cannot start.
    checkpoint_every
        Hand the recorder a :class:`~strategies.checkpoint.Checkpoint` (global
        model, strategy state, round records) every this many rounds and after the
        last one; 0 = never.
    **fedavg_kwargs
        Passed to Flower's ``FedAvg`` (fractions, minimum client counts,
        ``initial_parameters``); ``accept_failures`` is always on.

    """

    def __init__(
        self,
        *,
        num_rounds: int,
        fit_config: dict[str, Scalar] | None = None,
        evaluate_config: dict[str, Scalar] | None = None,
        eval_every: int = 1,
        recorder: Recorder | None = None,
        name: str = "fedavg",
        aggregation: str = "examples",
        preflight: bool = True,
        central_evaluation: Callable[[list[np.ndarray]], dict[str, float]] | None = None,
        checkpoint_every: int = 0,
        **fedavg_kwargs,
    ) -> None:
        if eval_every < 1:
            raise ValueError(f"eval-every must be >= 1, got {eval_every}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation {aggregation!r} is not one of {list(AGGREGATIONS)}")
        fedavg_kwargs["accept_failures"] = True
        super().__init__(on_fit_config_fn=self.fit_config, on_evaluate_config_fn=self.evaluate_config, **fedavg_kwargs)
        self.name = name
        self.aggregation = aggregation
        self.preflight = preflight
        self.central_evaluation = central_evaluation
        self.num_rounds = num_rounds
        self.base_fit_config = dict(fit_config or {})
        self.base_evaluate_config = dict(evaluate_config or {})
        self.eval_every = eval_every
        self.recorder = recorder if recorder is not None else NullRecorder()
        self.expected_shapes: list[tuple[int, ...]] = []
        self.decoded: dict[int, list[np.ndarray]] = {}  # id(FitRes) -> its arrays, within one aggregation
        self.round_record: dict = {}
        self.history: list[dict] = []
        self.node_properties: dict[str, dict] = {}  # node id -> its answer to the preflight
        self.started = time.perf_counter()
        self.checkpoint_every = checkpoint_every
        self.current_parameters: Parameters | None = None  # the global model after the last aggregation

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, rounds={self.num_rounds})"

    # -------------------------------------------------------------- start of run

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Check, before any training round, that every connected client can start.

        Each client is asked for its properties with the first round's fit config;
        it loads its partition and checks the config suits its data (Per-FedAvg's
        batch sizes, say). All clients share the run config, so a client that
        cannot start (too many clients for the data, a missing ``data-dir``, a
        batch larger than its data) means the run cannot work as asked: it stops
        now with the clients' reasons instead of recording every round as failed.
        """
        if self.preflight:
            client_manager.wait_for(self.min_available_clients, timeout=PREFLIGHT_WAIT_S)
            proxies = list(client_manager.all().values())
            ins = GetPropertiesIns(config=self.fit_config(0))
            with ThreadPoolExecutor(max_workers=PREFLIGHT_WORKERS) as pool:
                outcomes = list(pool.map(lambda proxy: _ask_properties(proxy, ins), proxies))
            problems = [f"client {proxy.cid}: {outcome}" for proxy, outcome in zip(proxies, outcomes, strict=True)
                        if isinstance(outcome, BaseException)]  # fmt: skip
            if problems:
                shown = "\n".join(problems[:3]) + (f"\n(and {len(problems) - 3} more)" if len(problems) > 3 else "")
                raise RuntimeError(
                    f"stamen preflight: {len(problems)} of {len(proxies)} clients cannot start:\n{shown}"
                )
            answers = zip(proxies, outcomes, strict=True)
            self.node_properties = {proxy.cid: dict(res.properties) for proxy, res in answers}
            log(INFO, "preflight: all %d connected clients accept the config", len(proxies))
        self.current_parameters = super().initialize_parameters(client_manager)
        return self.current_parameters

    def num_fit_clients(self, num_available_clients: int) -> tuple[int, int]:
        return self.within_reach(*super().num_fit_clients(num_available_clients), num_available_clients)

    def num_evaluation_clients(self, num_available_clients: int) -> tuple[int, int]:
        return self.within_reach(*super().num_evaluation_clients(num_available_clients), num_available_clients)

    def within_reach(self, sample_size: int, minimum: int, available: int) -> tuple[int, int]:
        """Shrink a round's sample to the nodes still connected, so a lost node cannot hang the run.

        Flower's sampling waits (up to a day) until ``minimum`` nodes are connected,
        and returns nobody when ``sample_size`` exceeds the connected nodes. The run
        started with ``min-available-clients`` nodes (the preflight waits for them);
        when some are lost later, the round goes on with those that remain.
        """
        if available >= minimum and available >= sample_size:
            return sample_size, minimum
        reachable = max(available, 1)  # with nobody connected, wait for one node to come back
        log(WARNING, "only %d node(s) connected (fewer than the %d asked for); sampling %d of them", available,
            max(sample_size, minimum), min(sample_size, reachable))  # fmt: skip
        return min(sample_size, reachable), min(minimum, reachable)

    # ------------------------------------------------------------------ configs

    def hyperparameters(self) -> dict[str, Scalar]:
        """The hyperparameters in force this round (written into the round's record)."""
        return dict(self.base_fit_config)

    def fit_config(self, server_round: int) -> dict[str, Scalar]:
        """The config dict sent with every fit instruction of ``server_round``."""
        return {**self.hyperparameters(), "server-round": server_round}

    def evaluate_config(self, server_round: int) -> dict[str, Scalar]:
        """The config dict sent with every evaluate instruction of ``server_round``."""
        return {**self.base_evaluate_config, "server-round": server_round}

    def is_evaluation_round(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.num_rounds

    # ------------------------------------------------------------------ training

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        if not self.expected_shapes:  # the model's shapes never change within a run
            self.expected_shapes = [a.shape for a in parameters_to_ndarrays(parameters)]
        self.open_round(server_round)
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self.round_record["clients-sampled"] = len(instructions)
        return instructions

    def open_round(self, server_round: int) -> None:
        """Start the round's record with the hyperparameters in force (before aggregation may change them)."""
        self.round_record = {"round": server_round, "strategy": self.name, "_start": time.perf_counter()}
        self.round_record.update({f"hp-{k}": v for k, v in self.hyperparameters().items()})

    def screen_fit_results(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
    ) -> tuple[list[tuple[ClientProxy, FitRes]], list[tuple[ClientProxy, FitRes]]]:
        """Split replies into accepted and rejected ones, logging each rejection."""
        accepted, rejected = [], []
        self.decoded = {}
        for proxy, res in results:
            try:
                arrays = parameters_to_ndarrays(res.parameters)
                problem = fit_reply_problem(arrays, res.num_examples, res.metrics, self.expected_shapes)
            except Exception as err:  # undecodable payloads are malformed replies too
                problem = f"unreadable reply ({err})"
            if problem is None:
                self.decoded[id(res)] = arrays  # decoding is a third of aggregation's cost: do it once
                accepted.append((proxy, res))
            else:
                self.log_rejection(server_round, proxy, problem)
                rejected.append((proxy, res))
        return accepted, rejected

    def screen_fit_replies(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[list[tuple[ClientProxy, FitRes]], list[tuple[ClientProxy, FitRes]]]:
        """Log the failures, and split the replies into accepted and rejected ones."""
        for failure in failures:
            log(WARNING, "round %s: fit failed: %s", server_round, describe_failure(failure))
        return self.screen_fit_results(server_round, results)

    def reply_arrays(self, res: FitRes) -> list[np.ndarray]:
        """The arrays of an accepted reply, decoded once during screening (the caller may overwrite them)."""
        arrays = self.decoded.pop(id(res), None)
        return arrays if arrays is not None else parameters_to_ndarrays(res.parameters)

    def record_fit(self, accepted: list, rejected: list, failures: list, metrics: dict[str, Scalar]) -> None:
        """Add the round's training outcome to its record (with each failure's reason, in ``fit-failures``)."""
        self.round_record.update(
            {"clients-succeeded": len(accepted), "clients-failed": len(failures) + len(rejected),
             "clients-rejected": len(rejected), **metrics}
        )  # fmt: skip
        if failures:
            self.round_record["fit-failures"] = [describe_failure(f)[:500] for f in failures]

    def log_rejection(self, server_round: int, proxy: ClientProxy, problem: str) -> None:
        log(WARNING, "round %s: rejected fit reply from node %s: %s", server_round, proxy.cid, problem)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        accepted, rejected = self.screen_fit_replies(server_round, results, failures)
        parameters = None
        if accepted:
            weights = [res.num_examples if self.aggregation == "examples" else 1 for _, res in accepted]
            models = [self.reply_arrays(res) for _, res in accepted]
            parameters = ndarrays_to_parameters(weighted_average_inplace(models, weights))
        metrics = self.fit_metrics(accepted)
        if parameters is not None:
            self.current_parameters = parameters
            metrics.update(self.after_aggregation(server_round, accepted, parameters))
        self.record_fit(accepted, rejected, failures, metrics)
        if parameters is None:
            log(WARNING, "round %s: no usable fit reply; the global model is unchanged", server_round)
        return parameters, metrics

    def after_aggregation(
        self, server_round: int, accepted: list[tuple[ClientProxy, FitRes]], parameters: Parameters
    ) -> dict[str, Scalar]:
        """Hook for strategies with server state: runs after a successful aggregation.

        Returns extra metrics for the round's record (the base strategy has none).
        """
        return {}

    def fit_metrics(self, accepted: list[tuple[ClientProxy, FitRes]]) -> dict[str, Scalar]:
        """Example-weighted training loss and the work the clients did this round."""
        weights = [res.num_examples for _, res in accepted]
        return {
            "train-loss": weighted_mean([float(res.metrics.get("train-loss", np.nan)) for _, res in accepted], weights),
            "examples": int(sum(weights)),
            "grad-evals": int(sum(int(res.metrics.get("grad-evals", 0)) for _, res in accepted)),
            "hvp-evals": int(sum(int(res.metrics.get("hvp-evals", 0)) for _, res in accepted)),
            "sample-grads": int(sum(int(res.metrics.get("sample-grads", 0)) for _, res in accepted)),
            "client-steps": int(sum(int(res.metrics.get("local-steps", 0)) for _, res in accepted)),
        }

    # ---------------------------------------------------------------- evaluation

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """Server-side evaluation of the global model after each round, when a central evaluation is given."""
        if self.central_evaluation is None or server_round == 0:
            return None
        metrics = self.central_evaluation(parameters_to_ndarrays(parameters))
        self.round_record.update({f"central-{k}": v for k, v in metrics.items()})
        return metrics["loss"], metrics

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.is_evaluation_round(server_round):
            self.close_round(server_round)
            return []
        instructions = super().configure_evaluate(server_round, parameters, client_manager)
        if not instructions:
            self.close_round(server_round)
        return instructions

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        accepted = []
        for proxy, res in results:
            try:
                problem = evaluate_reply_problem(res.loss, res.num_examples, res.metrics)
            except Exception as err:  # e.g. a metric that is not a number
                problem = f"unreadable reply ({err})"
            if problem is None:
                accepted.append(res)
            else:
                log(WARNING, "round %s: rejected evaluate reply from node %s: %s", server_round, proxy.cid, problem)
        for failure in failures:
            log(WARNING, "round %s: evaluate failed: %s", server_round, describe_failure(failure))
        metrics = evaluation_summary(accepted)
        metrics["eval-clients-failed"] = len(results) - len(accepted) + len(failures)
        self.round_record.update(metrics)
        if failures:
            self.round_record["evaluate-failures"] = [describe_failure(f)[:500] for f in failures]
        self.close_round(server_round)
        loss = metrics["loss"] if accepted else None
        return loss, metrics

    # ------------------------------------------------------------------- records

    def close_round(self, server_round: int) -> None:
        """Write the round's record, log a progress line, and finish after the last round."""
        record = dict(self.round_record) or {"round": server_round, "strategy": self.name}
        start = record.pop("_start", time.perf_counter())
        record["round-seconds"] = time.perf_counter() - start
        record["elapsed-seconds"] = time.perf_counter() - self.started
        self.history.append(record)
        self.recorder.record_round(record)
        log(INFO, progress_line(record, self.num_rounds))
        if self.checkpoint_every and (server_round % self.checkpoint_every == 0 or server_round == self.num_rounds):
            self.recorder.save_checkpoint(self.checkpoint(server_round))
        if server_round == self.num_rounds:
            summary = run_summary(self.history, self.name)
            self.recorder.finish(summary)
            log(INFO, "final: %s", summary_line(summary))

    # --------------------------------------------------------------- checkpoints

    def checkpoint(self, server_round: int) -> Checkpoint:
        """The run's state after ``server_round``: global model, round records and the strategy's own state."""
        arrays = model_arrays(parameters_to_ndarrays(self.current_parameters))
        own_arrays, own_state = self.strategy_state()
        state = {"strategy": self.name, "history": self.history, "elapsed-seconds": time.perf_counter() - self.started,
                 "node-properties": self.node_properties, "own": own_state}  # fmt: skip
        # a copy: the run goes on changing its history and state after this call
        return Checkpoint(round=server_round, arrays={**arrays, **own_arrays}, state=copy.deepcopy(state))

    def strategy_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays and JSON scalars a subclass must keep across a restart (the base strategy has none)."""
        return {}, {}

    def restore(self, checkpoint: Checkpoint) -> Parameters:
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
        check_shapes([a.shape for a in parameters_to_ndarrays(self.current_parameters)], stored)
        # JSON has no NaN: the checkpoint stores it as null
        self.history = [{k: np.nan if v is None else v for k, v in r.items()} for r in checkpoint.state["history"]]
        self.started = time.perf_counter() - float(checkpoint.state.get("elapsed-seconds", 0.0))
        self.restore_strategy_state(checkpoint.arrays, checkpoint.state.get("own", {}))
        self.current_parameters = ndarrays_to_parameters(stored)
        log(INFO, "resumed after round %d of %d", checkpoint.round, self.num_rounds)
        return self.current_parameters

    def restore_strategy_state(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        """Inverse of :meth:`strategy_state` (the base strategy has nothing to restore)."""


def evaluation_summary(accepted: list[EvaluateRes]) -> dict[str, Scalar]:
    """Personalised and global accuracy (weighted mean and spread) over accepted replies."""
    weights = [res.num_examples for res in accepted]
    out: dict[str, Scalar] = {"eval-clients": len(accepted), "loss": weighted_mean([r.loss for r in accepted], weights)}
    out.update(summarise("global-loss", [float(r.metrics.get("global-loss", r.loss)) for r in accepted], weights))
    classified = [r for r in accepted if "accuracy" in r.metrics]
    if classified:  # regression clients report losses only
        weights = [res.num_examples for res in classified]
        out.update(summarise("accuracy", [float(r.metrics["accuracy"]) for r in classified], weights))
        glob = [float(r.metrics.get("global-accuracy", np.nan)) for r in classified]
        out.update(summarise("global-accuracy", glob, weights))
    return out


def progress_line(record: dict, num_rounds: int) -> str:
    """One human-readable line per round."""
    parts = [
        f"[round {record['round']}/{num_rounds}]",
        f"fit {record.get('clients-succeeded', 0)}/{record.get('clients-sampled', 0)} ok",
        f"train-loss {record.get('train-loss', float('nan')):.4f}",
    ]
    if "accuracy" in record:
        parts.append(
            f"personalised acc {record['accuracy']:.4f} (min {record['accuracy-min']:.3f}, "
            f"max {record['accuracy-max']:.3f}) global acc {record['global-accuracy']:.4f}"
        )
    elif "loss" in record:
        parts.append(f"test loss {record['loss']:.5f} (un-adapted {record['global-loss']:.5f})")
    if "central-accuracy" in record:
        parts.append(f"central acc {record['central-accuracy']:.4f}")
    parts.append(f"{record['round-seconds']:.2f} s")
    return " | ".join(parts)


def run_summary(history: list[dict], name: str) -> dict:
    """Final and best metrics of a run, from its round records."""
    evaluated = [r for r in history if "accuracy" in r and np.isfinite(r["accuracy"])]
    best = max(evaluated, key=lambda r: r["accuracy"], default=None)
    return {
        "strategy": name,
        "rounds": len(history),
        "total-seconds": history[-1]["elapsed-seconds"] if history else 0.0,
        "final": evaluated[-1] if evaluated else (history[-1] if history else {}),
        "best-accuracy": best["accuracy"] if best else None,
        "best-round": best["round"] if best else None,
        "clients-failed": int(sum(r.get("clients-failed", 0) for r in history)),
        "grad-evals": int(sum(r.get("grad-evals", 0) for r in history)),
    }


def summary_line(summary: dict) -> str:
    """One human-readable line for the end of a run."""
    final = summary["final"]

    def fmt(value: object) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    return (
        f"{summary['strategy']}: {summary['rounds']} rounds in {summary['total-seconds']:.1f} s; final personalised "
        f"accuracy {fmt(final.get('accuracy'))} (client mean {fmt(final.get('accuracy-client-mean'))}), global "
        f"accuracy {fmt(final.get('global-accuracy'))}; best personalised {fmt(summary['best-accuracy'])} "
        f"(round {summary['best-round']}); failed or rejected replies {summary['clients-failed']}"
    )


def _ask_properties(proxy: ClientProxy, ins: GetPropertiesIns) -> object:
    try:
        return proxy.get_properties(ins, timeout=PREFLIGHT_REPLY_S, group_id=0)
    except Exception as err:  # the client's reason travels back in the message
        return err


def describe_failure(failure: object) -> str:
    """A failed reply or exception as one log-friendly line."""
    if isinstance(failure, BaseException):
        return f"{type(failure).__name__}: {failure}"
    proxy, res = failure  # a reply that arrived with an error status
    return f"node {proxy.cid}: {getattr(res, 'status', res)}"
