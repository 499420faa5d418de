"""The run's watch and records: a record per round, the divergence watch, the summary, a failed run's end.

:class:`RunWatch` writes each round's record through the recorder and logs its progress
line, stops a run whose replies stay non-finite (keeping the last good model and naming
the step sizes in force), and builds ``summary.json``.
"""

from __future__ import annotations

import time
from logging import ERROR, INFO

from flwr.common.logger import log

from strategies.records import progress_line, run_summary, summary_line


class RunDivergedError(Exception):
    """The strategy ended the run early (it diverged); the message says why. Not a failure of the run."""


class RunWatch:
    """A part of :class:`strategies.base.FederatedStrategy` (see the module's docstring)."""

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
        """Hand the round to the divergence watch; when it says stop, stop the run with the last good model.

        Stopping puts back the last good model, writes it as the checkpoint, and ends the
        run with ``status: stopped`` and the reason, naming the step sizes in force.

        Raises
        ------
        RunDivergedError
            When the run stops.

        """
        verdict = self.divergence.observe(server_round, record, self.sent_model)
        if verdict is None:
            return
        steps = {k: self.in_force(k, v) for k, v in self.step_values().items()}
        shown = ", ".join(f"{k} = {v:g}" for k, v in steps.items()) or "the method's step sizes"
        reason = (f"diverged: in rounds {verdict.first_round}-{verdict.last_round} {verdict.what}; the step sizes in "
                  f"force were {shown}; {self.divergence_hint()}; kept the model after round {verdict.good_round}, "
                  "the last whose replies were finite")  # fmt: skip
        self._use_model(verdict.good_model)
        self.recorder.save_checkpoint(self.checkpoint(verdict.good_round))
        self.finish()
        self.recorder.finish(self.summary("stopped", reason=reason, **{"last-good-round": verdict.good_round}))
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
        if self.failure_groups:
            out["failure-groups"] = self.failure_groups
        if ray_nodes := self.nodes.ray_nodes():
            out["ray-nodes"] = ray_nodes
        if self.nodes.sampled:
            out["nodes-asked"] = len(self.nodes.sampled)  # "nodes" then holds only their data
        out["timing"] = dict(self.timing)
        return out
