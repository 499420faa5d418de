"""The result writer: ``metrics.jsonl``, ``summary.json`` and ``accuracy.png`` per run, and reading records back.

Created by the ServerApp and handed to the strategy as its recorder, so
strategies never import ``app``.

The writer claims its folder by the rules of :mod:`app.results.run_folder`; every file but
``metrics.jsonl`` is replaced atomically (:func:`strategies.rounds.checkpoint.write_atomically`),
and ``metrics.jsonl`` grows a whole line at a time, so a kill leaves at most its last
line cut short, which a resumed run drops (:func:`read_metrics`). The figures are
:mod:`app.results.plots`'.
"""

from __future__ import annotations

import errno
import io
import json
import os
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
from flwr.common.logger import log

from app.results.plots import plot_accuracy, plot_tuning
from app.results.provenance import data_provenance
from app.results.run_folder import (
    NOFOLLOW,
    RUN_FILE_MODE,
    SUMMARY,
    earlier_run_problem,
    json_bytes,
    jsonable,
    make_run_folder,
    read_nofollow,
    run_directory,
    run_name_problem,
    set_refusals_aside,
    write_new_numbered,
    write_refusal,
)
from strategies.contracts.keys import ConfigError
from strategies.rounds.checkpoint import FILE_NAME, Checkpoint, save_checkpoint, write_atomically

# what other code imports from here: the writer, reading records back, and the folder rules it follows
__all__ = ["METRICS", "ResultWriter", "ResultsError", "earlier_run_problem", "plot_accuracy", "plot_tuning",
           "read_metrics", "run_directory", "run_name_problem", "write_refusal"]  # fmt: skip

METRICS = "metrics.jsonl"


class ResultsError(ValueError):
    """A results file that is not what stamen writes (a line of ``metrics.jsonl`` that is no round record)."""


class ResultWriter:
    """Writes one run's results; implements the strategies' ``Recorder`` protocol.

    Parameters
    ----------
    run_dir
        The run's folder (created where absent; absolute path logged). A new run
        claims it by creating ``metrics.jsonl`` exclusively, so it refuses a folder
        holding an earlier run, even one that appeared since it was checked; a
        symbolic link is refused, never written through.
    settings
        The run's settings, copied into ``summary.json`` and every checkpoint.
    resume_after
        Continue a run resumed from its checkpoint after this round: the records of
        later rounds (written after the checkpoint, before the run stopped) are
        dropped, since the resumed run repeats those rounds, and so is a last line cut
        short by the stop (:func:`read_metrics`). ``None`` starts afresh.
    provenance
        Which code, versions and machine make the run (:func:`app.results.provenance.run_provenance`):
        written to ``run.json`` at once and, with the fingerprint of the clients' data,
        into ``summary.json``.

    Raises
    ------
    ConfigError
        If the folder is a link or a file, a new run's folder holds an earlier run, or a
        resumed run's ``metrics.jsonl`` holds a line that is no round record.

    """

    def __init__(self, *, run_dir: Path, settings: dict, resume_after: int | None = None,
                 provenance: dict | None = None) -> None:  # fmt: skip
        self.run_dir = run_dir
        self.settings = settings
        self.provenance = provenance
        self.metrics_path = run_dir / METRICS
        make_run_folder(run_dir)
        if resume_after is None:
            self._claim_folder()
            self.rounds: list[dict] = []
        else:
            self.rounds = self._kept_records(resume_after)
        if provenance is not None:  # written at the start, so even a run that dies early says what made it
            self._write_run_record(resume_after)
        log(INFO, "stamen results: %s", self.run_dir)

    def _claim_folder(self) -> None:
        """Create an empty ``metrics.jsonl`` exclusively: of two runs given one folder, one gets it."""
        if problem := earlier_run_problem(self.run_dir):
            raise ConfigError(problem)
        try:
            os.close(os.open(self.metrics_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, RUN_FILE_MODE))
        except FileExistsError as err:
            raise ConfigError(earlier_run_problem(self.run_dir) or f"{self.metrics_path} exists") from err
        set_refusals_aside(self.run_dir)

    def _kept_records(self, resume_after: int) -> list[dict]:
        """The records up to round ``resume_after``, which become the whole ``metrics.jsonl``."""
        try:
            kept = [r for r in read_metrics(self.metrics_path) if r["round"] <= resume_after]
        except ResultsError as err:
            raise ConfigError(f"run config key 'resume-from': {err}") from err
        write_atomically(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept).encode())
        return kept

    def _write_run_record(self, resume_after: int | None) -> None:
        """``run.json``, or for a resumed run ``run-resumed-after-<k>.json`` (numbered on, never replaced)."""
        data = json_bytes({"settings": self.settings, "provenance": self.provenance})
        if resume_after is None:
            write_atomically(self.run_dir / "run.json", data)
        else:
            write_new_numbered(self.run_dir, f"run-resumed-after-{resume_after}", data)

    def record_round(self, record: dict) -> None:
        """Append the round's line with one write, never through a symbolic link."""
        line = (json.dumps(jsonable(record)) + "\n").encode()
        self.rounds.append(record)
        handle = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, RUN_FILE_MODE)
        try:
            written = 0
            while written < len(line):
                written += os.write(handle, line[written:])
        finally:
            os.close(handle)

    def save_arrays(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        """``<run_dir>/<name>.npz``, written atomically so a reader never sees half a file."""
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        write_atomically(self.run_dir / f"{name}.npz", buffer.getvalue())

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """``<run_dir>/checkpoint.npz``, atomically, with the run's settings added."""
        state = {**checkpoint.state, "settings": self.settings}
        save_checkpoint(self.run_dir / FILE_NAME, Checkpoint(round=checkpoint.round, arrays=checkpoint.arrays,
                                                             state=jsonable(state)))  # fmt: skip
        log(INFO, "checkpoint after round %d: %s", checkpoint.round, self.run_dir / FILE_NAME)

    def save_text(self, name: str, text: str) -> str:
        path = self.run_dir / name
        write_atomically(path, text.encode())
        return str(path)

    def write_summary(self, summary: dict) -> Path:
        """``<run_dir>/summary.json``: the run's settings, ``summary`` and where the results are."""
        payload = {"settings": self.settings, **summary, "results-dir": str(self.run_dir)}
        if self.provenance is not None:
            payload["provenance"] = {**self.provenance, "data": data_provenance(summary.get("nodes", []))}
        path = self.run_dir / SUMMARY
        write_atomically(path, json_bytes(payload))
        return path

    def fail(self, summary: dict) -> None:
        """``summary.json`` with ``status`` ``failed`` and the reason, so a failed run is told from a running one."""
        log(INFO, "stamen wrote %s (status failed)", self.write_summary(summary))

    def finish(self, summary: dict) -> None:
        self.write_summary(summary)
        title = f"{summary.get('strategy')} - {self.run_dir.name}"
        plot_accuracy(self.rounds, self.run_dir / "accuracy.png", title=title)
        written = ["summary.json", "accuracy.png"]
        if any("H" in r for r in self.rounds):  # a tuned run (fathom, or tune = "fathom")
            plot_tuning(self.rounds, self.run_dir / "tuning.png", title=title)
            written.append("tuning.png")
        log(INFO, "stamen wrote %s, %s", self.metrics_path, ", ".join(written))


def read_metrics(path: Path) -> list[dict]:
    """The round records of a ``metrics.jsonl`` (an absent file has none).

    A last line without its newline that is no JSON record was cut short (the run was
    stopped while appending it): it is dropped, with a warning. Any other line that is
    not a JSON object with an integer ``round`` raises.

    Raises
    ------
    ResultsError
        Naming the file and the line, or if the file is a symbolic link.

    """
    try:
        data = read_nofollow(path)
    except FileNotFoundError:
        return []
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ResultsError(f"{path} is a symbolic link; stamen reads a run's records from its own file") from err
        raise
    *whole, tail = data.split(b"\n")
    records = [_round_record(path, number, line) for number, line in enumerate(whole, start=1) if line.strip()]
    if tail.strip():
        try:
            records.append(_round_record(path, len(whole) + 1, tail))
        except ResultsError as err:
            log(WARNING, "stamen: dropped the last line of %s, cut short when the run was stopped (%s)", path, err)
    return records


def _round_record(path: Path, number: int, line: bytes) -> dict:
    """Line ``number`` of ``path`` as a round record: a JSON object with an integer ``round``."""
    try:
        record = json.loads(line.decode())
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError both are
        raise ResultsError(f"{path} line {number} is no JSON record ({err}); mend or delete that line") from err
    if not isinstance(record, dict) or not isinstance(record.get("round"), int) or isinstance(record["round"], bool):
        raise ResultsError(f"{path} line {number} is no round record (a JSON object with an integer 'round'): "
                           f"{line[:60]!r}; mend or delete that line")  # fmt: skip
    return record
