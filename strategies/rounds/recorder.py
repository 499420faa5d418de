"""The small interface through which strategies report results (implemented in ``app``)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from strategies.rounds.checkpoint import Checkpoint


class Recorder(Protocol):
    """Receives one record per round and a summary at the end of the run."""

    def record_round(self, record: dict) -> None:
        """Store one round's record (a flat dict of JSON scalars)."""

    def finish(self, summary: dict) -> None:
        """Store the end-of-run summary."""

    def save_arrays(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        """Store named arrays under ``name`` (a run's topology, its agents' models)."""

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Keep ``checkpoint`` (replacing the previous one) so the run can resume from it."""

    def save_text(self, name: str, text: str) -> str:
        """Store a text file (a log of client tracebacks) under ``name``; return where it went."""

    def fail(self, summary: dict) -> None:
        """End a run that failed: ``summary`` holds ``status`` ``failed`` and the one-line ``reason``."""


class NullRecorder:
    """A recorder that keeps records in memory only (tests, notebooks)."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []
        self.summary: dict | None = None
        self.arrays: dict[str, dict[str, np.ndarray]] = {}
        self.checkpoints: list[Checkpoint] = []
        self.texts: dict[str, str] = {}

    def record_round(self, record: dict) -> None:
        self.rounds.append(record)

    def finish(self, summary: dict) -> None:
        self.summary = summary

    def save_arrays(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        self.arrays[name] = arrays

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.checkpoints.append(checkpoint)

    def save_text(self, name: str, text: str) -> str:
        self.texts[name] = text
        return f"<memory:{name}>"

    def fail(self, summary: dict) -> None:
        self.summary = summary
