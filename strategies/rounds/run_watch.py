"""The run's records and its end: the rounds so far, how long things took, ``summary.json`` however the run ends.

:class:`RunWatch` is handed each round's record (a value the round built) when the round
closes: it writes it through the recorder with a progress line, hands it to the
divergence watch, checkpoints when due, and ends the run as completed, stopped
(diverged, with the last good model) or failed, with its summary. It keeps the run's
history and timing. :func:`divergence_reason` words a diverged run's end.
"""

from __future__ import annotations

import time
from logging import ERROR, INFO
from typing import Protocol

import numpy as np
from flwr.common.logger import log

from strategies.contracts.client_reports import ACCURACY, GLOBAL_ACCURACY
from strategies.contracts.payload import Scalar
from strategies.contracts.settings import Settings
from strategies.nodes.directory import NodeDirectory
from strategies.rounds.checkpoint import Checkpoint
from strategies.rounds.divergence import Diverged, DivergenceWatch
from strategies.rounds.global_model import GlobalModel
from strategies.rounds.recorder import Recorder
from strategies.rounds.records import progress_line, run_summary, summary_line
from strategies.rounds.wreck import Wrecked, WreckWatch, majority_floor

CENTRAL_ACCURACY = "central-accuracy"  # the server's test of the global model (central-eval)


class RunDivergedError(Exception):
    """The strategy ended the run early (it diverged); the message says why. Not a failure of the run."""


class RunWreckedError(RunDivergedError):
    """The run ended early, wrecked: most sampled replies rejected, round after round (``wreck.py``)."""


def divergence_reason(verdict: Diverged, steps: dict[str, float], hint: str) -> str:
    """Why a run stopped: the rounds and what went wrong, the step sizes in force (``steps``), the likeliest cause."""
    shown = ", ".join(f"{k} = {v:g}" for k, v in steps.items()) or "the method's step sizes"
    return (f"diverged: in rounds {verdict.first_round}-{verdict.last_round} {verdict.what}; the step sizes in force "
            f"were {shown}; {hint}; kept the model after round {verdict.good_round}, the last whose replies were "
            "finite")  # fmt: skip


class RunEnd(Protocol):
    """What :class:`RunWatch` asks of the method (its strategy) when a round or the run ends."""

    name: str

    def checkpoint(self, server_round: int) -> Checkpoint: ...
    def finish(self) -> None: ...
    def in_force(self, key: str, default: Scalar) -> Scalar: ...
    def step_values(self) -> dict[str, float]: ...
    def divergence_hint(self) -> str: ...


class RunWatch:
    """The run's history, timing and summary, and the end of each round (see the module's docstring).

    Parameters
    ----------
    hooks
        The method's hooks for a round's and the run's end (its strategy).
    settings
        The run's settings (its length, ``checkpoint-every``).
    recorder
        Where records and the summary go.
    nodes
        The node directory: each node's data, the nodes left out (for the summary).
    model
        The global model (a diverged run puts back the last good one).
    divergence
        The divergence watch each closed round's record goes to.
    class_names
        The run's class names where it names them, for the nodes' data in the summary.

    """

    def __init__(self, *, hooks: RunEnd, settings: Settings, recorder: Recorder, nodes: NodeDirectory,
                 model: GlobalModel, divergence: DivergenceWatch, class_names: tuple[str, ...]) -> None:  # fmt: skip
        self.hooks = hooks
        self.name = hooks.name
        self.num_rounds = settings.run.num_server_rounds
        self.checkpoint_every = settings.execution.checkpoint_every
        self.recorder = recorder
        self.nodes = nodes
        self.model = model
        self.divergence = divergence
        self.wreck = WreckWatch(patience=settings.run.wreck_rounds)
        self.class_names = class_names
        self.history: list[dict] = []
        self.failure_groups: list[dict] = []  # why the run could not start, by cause (summary.json)
        self.started = time.perf_counter()
        # when the server started (Unix time) and how long it took to reach round 1, for summary.json
        self.timing: dict[str, float] = {"server-started-unix": time.time()}

    def elapsed(self) -> float:
        """Seconds since the run started (a resumed run counts its earlier rounds' time)."""
        return time.perf_counter() - self.started

    def mark(self, name: str) -> float:
        """Note ``name`` in the timing, seconds since the start, unless already noted; its value."""
        return self.timing.setdefault(name, self.elapsed())

    def mark_since(self, name: str, since: float) -> float:
        """Note ``name`` in the timing: the seconds from ``since`` (seconds since the start) to now; its value."""
        self.timing[name] = self.elapsed() - since
        return self.timing[name]

    def resumed(self, history: list[dict], elapsed_seconds: float) -> None:
        """Continue the records of a checkpointed run: its rounds, and the time they took."""
        self.history = history
        self.started = time.perf_counter() - elapsed_seconds

    def end_round(self, server_round: int, record: dict, *, started: float, sent_model: list[np.ndarray]) -> None:
        """Close ``server_round``: write its record, watch for divergence, checkpoint when due, end the run at the last.

        ``record`` is the round's (begun at ``started``); ``sent_model`` the model it sent.

        Raises
        ------
        RunDivergedError
            When the divergence watch stops the run: the last good model is put back and
            checkpointed, and the run ends ``stopped`` with the reason, naming the step
            sizes in force.

        """
        record = self.close_round(record, started)
        verdict = self.divergence.observe(server_round, record, sent_model)
        if verdict is not None:
            steps = {k: self.hooks.in_force(k, v) for k, v in self.hooks.step_values().items()}
            reason = divergence_reason(verdict, steps, self.hooks.divergence_hint())
            self.model.use(verdict.good_model)
            self.recorder.save_checkpoint(self.hooks.checkpoint(verdict.good_round))
            self.hooks.finish()
            self.stop(reason, verdict.good_round)
            raise RunDivergedError(reason)
        wrecked = self.wreck.observe(server_round, record)
        if wrecked is not None:
            self.recorder.save_checkpoint(self.hooks.checkpoint(server_round))
            self.hooks.finish()
            self.end_wrecked(wrecked)
            raise RunWreckedError(wrecked.reason)
        if self.checkpoint_due(server_round):
            self.recorder.save_checkpoint(self.hooks.checkpoint(server_round))
        if server_round == self.num_rounds:
            self.hooks.finish()
            floor = majority_floor(self.nodes.declared(node).test_classes for node in self.nodes.properties)
            wrecked = self.wreck.at_the_end(self.history, floor, (ACCURACY, GLOBAL_ACCURACY, CENTRAL_ACCURACY))
            if wrecked is not None:
                self.end_wrecked(wrecked)
            else:
                self.complete()

    def checkpoint_due(self, server_round: int) -> bool:
        """Whether closing ``server_round`` writes a checkpoint (every ``checkpoint-every`` rounds and the last)."""
        every = self.checkpoint_every
        return bool(every) and (server_round % every == 0 or server_round == self.num_rounds)

    def close_round(self, record: dict, started: float) -> dict:
        """Write ``record`` (the round's, begun at ``started``) with its timing, log its progress line; the record."""
        record = {**record, "round-seconds": time.perf_counter() - started, "elapsed-seconds": self.elapsed()}
        self.history.append(record)
        self.recorder.record_round(record)
        log(INFO, progress_line(record, self.num_rounds))
        return record

    def complete(self) -> None:
        """End the run after its last round: ``status`` ``completed``."""
        summary = self.summary("completed")
        self.recorder.finish(summary)
        log(INFO, "final: %s", summary_line(summary))

    def end_wrecked(self, wrecked: Wrecked) -> None:
        """End the run as wrecked (``status`` ``wrecked``): the reason in the summary, the log and the final line."""
        summary = self.summary("wrecked", reason=wrecked.reason)
        self.recorder.finish(summary)
        log(ERROR, "stamen: %s", wrecked.reason)
        log(INFO, "final: %s; status wrecked (see the reason above and in summary.json)", summary_line(summary))

    def stop(self, reason: str, good_round: int) -> None:
        """End the run early (``status`` ``stopped``), keeping the model after ``good_round``."""
        self.recorder.finish(self.summary("stopped", reason=reason, **{"last-good-round": good_round}))
        log(ERROR, "stamen: %s", reason)

    def fail(self, reason: str) -> None:
        """End the run as failed: the records so far stay, and the summary says why (``status`` ``failed``)."""
        self.recorder.fail(self.summary("failed", reason=reason))
        log(ERROR, "stamen: the run failed after %d completed round(s): %s", len(self.history), reason)

    def summary(self, status: str, **extra: object) -> dict[str, object]:
        """``summary.json``: the run's final and best metrics, how it ended, and each node's data.

        ``status`` is ``completed``, ``stopped``, ``wrecked`` or ``failed``; ``extra`` adds the reason and the like.
        The nodes left out of the run are listed with why (node id -> reason).
        """
        out: dict[str, object] = {**run_summary(self.history, self.name), "status": status, **extra,
                                  "nodes": self.nodes.data_report(self.class_names)}  # fmt: skip
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
