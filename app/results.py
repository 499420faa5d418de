"""The result writer: ``metrics.jsonl``, ``summary.json`` and ``accuracy.png`` per run.

Created by the ServerApp and handed to the strategy as its recorder, so
strategies never import ``app``.

Nothing a user wrote is lost or mixed: a run writes only into a folder of its own
(a new default folder, made atomically, or a ``run-name`` folder that holds no earlier
run), never through a symbolic link; every file but ``metrics.jsonl`` is replaced
atomically (:func:`strategies.checkpoint.write_atomically`), and ``metrics.jsonl``
grows a whole line at a time, so a kill leaves at most its last line cut short, which
a resumed run drops (:func:`read_metrics`). A refused run's record never replaces a
file (:func:`write_refusal`).
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import stat
import time
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
from flwr.common.logger import log

from app.provenance import data_provenance
from app.workdir import resolved
from strategies.checkpoint import FILE_NAME, Checkpoint, save_checkpoint, synced_temporary, write_atomically
from strategies.contracts.keys import ConfigError

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
REFUSAL_PREFIX = "refused-"  # refused-<timestamp>.json: a refused run's record beside an earlier run's files
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
RUN_NAME_RULE = ("a run-name is one folder name under results-dir: no '/' or '\\', not '.' or '..', not blank, "
                 "at most 255 bytes (empty: <strategy>-<dataset>-<timestamp>)")  # fmt: skip
REFUSAL_SIZE_LIMIT = 1 << 20  # a refused run's summary.json is a few lines; a bigger file is an earlier run's


class ResultsError(ValueError):
    """A results file that is not what stamen writes (a line of ``metrics.jsonl`` that is no round record)."""


def _jsonable(value: object) -> object:
    """NaN/inf become null so every line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _json_bytes(payload: object) -> bytes:
    return (json.dumps(_jsonable(payload), indent=2) + "\n").encode()


def run_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a ``run-name``, as the line refusing it, or ``None`` (``""`` asks for the default).

    A run name is a folder name under ``results-dir``, never a path: a separator, ``..``
    or an absolute path would put the run's files outside ``results-dir``.
    """
    if name == "":
        return None
    flaw = _name_flaw(name)
    return None if flaw is None else f"run config key 'run-name': {name!r} {flaw}; {RUN_NAME_RULE}"


def _name_flaw(name: str) -> str | None:
    if not name.strip():
        return "is blank"
    if name in (".", ".."):
        return "names results-dir or the folder above it, not a folder of its own"
    if "/" in name or "\\" in name:
        return "is a path, not a name" + (" (absolute)" if name.startswith(("/", "\\")) else "")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds a control character"
    if len(name.encode()) > 255:
        return f"is {len(name.encode())} bytes long"
    return None


def run_directory(results_dir: str, run_name: str, default_name: str) -> Path:
    """``<results-dir>/<run-name>`` as an absolute path; a fresh timestamped folder by default.

    A relative ``results-dir`` is taken under ``~/stamen/`` (:func:`app.workdir.resolved`),
    never under a working directory: with ``flwr run .`` that is the folder where a
    reused local SuperLink was started, which the command does not tell.

    The default folder is made here, atomically (``os.mkdir``, a suffix ``-1``, ``-2``, ...
    where another run made it first), so two runs started in the same second get two
    folders. A ``run-name`` folder is only named: :func:`earlier_run_problem` says whether
    it is free, and the writer claims it (:class:`ResultWriter`).

    Raises
    ------
    ConfigError
        If ``run_name`` is not a name (:func:`run_name_problem`).

    """
    if problem := run_name_problem(run_name):
        raise ConfigError(problem)
    results = resolved(results_dir).resolve()
    if run_name:
        return results / run_name
    results.mkdir(parents=True, exist_ok=True)
    name = f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, suffix = results / name, 1
    while True:
        try:
            os.mkdir(path)
            return path
        except FileExistsError:  # another run started in the same second
            path, suffix = results / f"{name}-{suffix}", suffix + 1


def earlier_run_problem(run_dir: Path) -> str | None:
    """Why a new run may not write to ``run_dir`` (the line refusing it), or ``None`` where it may.

    It may where the folder does not exist or holds nothing but refused runs' records;
    not where it is a symbolic link or a file, or holds any other file (an earlier run's).
    """
    try:
        mode = run_dir.lstat().st_mode
    except FileNotFoundError:
        return None
    key = "run config key 'run-name'"
    if stat.S_ISLNK(mode):
        return f"{key}: {run_dir} is a symbolic link; stamen writes a run only into a folder of its own: pick another"
    if not stat.S_ISDIR(mode):
        return f"{key}: {run_dir} is a file, not a folder: pick another run-name"
    earlier = earlier_run_files(run_dir)
    if not earlier:
        return None
    shown = ", ".join(earlier[:4]) + (f" and {len(earlier) - 4} more" if len(earlier) > 4 else "")
    how = (f"continue it with resume-from='{run_dir}'" if FILE_NAME in earlier
           else f"it holds no {FILE_NAME} to resume from")  # fmt: skip
    return f"{key}: {run_dir} holds an earlier run ({shown}); {how}, or pick another run-name"


def earlier_run_files(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` other than refused runs' records (:func:`is_refusal_record`), sorted."""
    with os.scandir(run_dir) as entries:
        return sorted(e.name for e in entries if not is_refusal_record(Path(e.path)))


def is_refusal_record(path: Path) -> bool:
    """Whether ``path`` is what :func:`write_refusal` writes: a ``refused-*.json``, or a refused run's summary."""
    if path.name.startswith(REFUSAL_PREFIX) and path.suffix == ".json":
        return True
    if path.name != SUMMARY:
        return False
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > REFUSAL_SIZE_LIMIT:
            return False
        summary = json.loads(_read_nofollow(path))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("refused") is True


def _read_nofollow(path: Path) -> bytes:
    """The bytes of ``path``, refusing (``OSError`` ``ELOOP``) to read through a symbolic link."""
    with open(os.open(path, os.O_RDONLY | NOFOLLOW), "rb") as handle:
        return handle.read()


def write_new(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data``, atomically, unless something is there (then ``False``); never replaces.

    The data goes to a temporary file, synced, which is then hard-linked to ``path``:
    the link fails where the name is taken, and a reader never sees half a file.
    """
    partial = synced_temporary(path, data)
    try:
        try:
            os.link(partial, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(partial)


def write_new_numbered(folder: Path, stem: str, data: bytes) -> Path:
    """``<folder>/<stem>.json``, or ``<stem>-1.json``, ``-2``, ... where taken (:func:`write_new`); the path written."""
    path, number = folder / f"{stem}.json", 1
    while not write_new(path, data):
        path, number = folder / f"{stem}-{number}.json", number + 1
    return path


def _refusal_stem() -> str:
    return f"{REFUSAL_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"


def set_refusals_aside(run_dir: Path) -> None:
    """Keep a refused run's ``summary.json`` as ``refused-<timestamp>.json``, before a new run's takes its name."""
    summary = run_dir / SUMMARY
    if not is_refusal_record(summary):
        return
    kept = write_new_numbered(run_dir, _refusal_stem(), _read_nofollow(summary))
    summary.unlink()
    log(INFO, "stamen: a refused run's summary in %s is kept as %s", run_dir, kept.name)


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
        Which code, versions and machine make the run (:func:`app.provenance.run_provenance`):
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
        _make_run_folder(run_dir)
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
            os.close(os.open(self.metrics_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644))
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
        data = _json_bytes({"settings": self.settings, "provenance": self.provenance})
        if resume_after is None:
            write_atomically(self.run_dir / "run.json", data)
        else:
            write_new_numbered(self.run_dir, f"run-resumed-after-{resume_after}", data)

    def record_round(self, record: dict) -> None:
        """Append the round's line with one write, never through a symbolic link."""
        line = (json.dumps(_jsonable(record)) + "\n").encode()
        self.rounds.append(record)
        handle = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o644)
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
                                                             state=_jsonable(state)))  # fmt: skip
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
        write_atomically(path, _json_bytes(payload))
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


def _make_run_folder(run_dir: Path) -> None:
    """Create ``run_dir`` where absent; refuse a symbolic link or a file in its place."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(run_dir)
    except FileExistsError:
        mode = run_dir.lstat().st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "a file"
            raise ConfigError(f"the results folder {run_dir} is {what}; stamen writes a run only into a folder of "
                              "its own, never through a link") from None  # fmt: skip


def write_refusal(*, run_dir: Path, reason: str, run_config: Mapping[str, object]) -> Path | None:
    """A refused run's record: ``status`` ``failed``, ``refused`` and the reason; the path written, or ``None``.

    ``flwr run --stream`` exits 0 whatever happens to the run, so a script finds why the
    run was refused in its folder. The record never replaces a file: it is the folder's
    ``summary.json`` where the folder is new or empty, and ``refused-<timestamp>.json``
    beside the files of an earlier run (whose ``summary.json`` stays as it was). Nothing
    is written where ``run_dir`` is a symbolic link or a file.
    """
    try:
        _make_run_folder(run_dir)
    except ConfigError:
        return None
    payload = {"settings": dict(run_config), "status": "failed", "refused": True, "reason": reason,
               "completed-rounds": 0, "results-dir": str(run_dir)}  # fmt: skip
    data = _json_bytes(payload)
    if not any(run_dir.iterdir()) and write_new(run_dir / SUMMARY, data):
        return run_dir / SUMMARY
    return write_new_numbered(run_dir, _refusal_stem(), data)


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
        data = _read_nofollow(path)
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


def tuned_values(rounds: list[dict]) -> dict[str, list[float]]:
    """The values in force that changed during a run (``hp-*`` keys), per round: what a tuner moved."""
    first = rounds[0] if rounds else {}
    numeric = {k for k, v in first.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    keys = [k for k in first if k.startswith("hp-") and k in numeric]
    series = {k.removeprefix("hp-"): [float(r.get(k, math.nan)) for r in rounds] for k in keys}
    return {k: v for k, v in series.items() if len(set(v)) > 1}


def plot_tuning(rounds: list[dict], path: Path, *, title: str) -> None:
    """A tuned run's trajectory: every value the tuner moved, and its signals H, G and phi, per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    moved = tuned_values(rounds)
    x = [r["round"] for r in rounds]
    fig, axes = plt.subplots(len(moved) + 1, 1, figsize=(6, 2.2 * (len(moved) + 1)), sharex=True, squeeze=False)
    for ax, (name, values) in zip(axes[:, 0], moved.items(), strict=False):
        ax.plot(x, values)
        ax.set_ylabel(name)
        ax.set_yscale("log" if min(values) > 0 and max(values) / min(values) > 10 else "linear")
        ax.grid(alpha=0.3)
    signals = axes[-1, 0]
    for name in ("H", "G", "phi-mean"):
        signals.plot(x, [r.get(name, math.nan) for r in rounds], label=name)
    signals.set_ylabel("signal")
    signals.set_xlabel("round")
    signals.grid(alpha=0.3)
    probed = [r for r in rounds if "probe-round" in r]
    if probed:  # the tuner's start probe: its rounds shaded, and the factor it chose
        first, last = probed[0]["round"], probed[-1]["round"]
        chosen = next((r["probe-factor"] for r in probed if "probe-factor" in r), None)
        label = f"start probe (chose x{chosen:.3g})" if chosen is not None else "start probe"
        for ax in axes[:, 0]:
            ax.axvspan(first - 0.5, last + 0.5, color="grey", alpha=0.15, lw=0,
                       label=label if ax is signals else None)  # fmt: skip
    decays = [r["round"] for r, before in zip(rounds, [{}, *rounds], strict=False)
              if r.get("lr-decays", 0) > before.get("lr-decays", 0)]  # fmt: skip
    for k, decay in enumerate(decays):  # a decay after round r: the smaller step is in force from r + 1
        for ax in axes[:, 0]:
            ax.axvline(decay + 0.5, color="tab:red", ls=":", lw=1,
                       label="stationarity test: step divided" if ax is signals and k == 0 else None)  # fmt: skip
    signals.legend(loc="best", fontsize=8)
    axes[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    _save_figure(fig, path, dpi=110)


def plot_accuracy(rounds: list[dict], path: Path, *, title: str) -> None:
    """Personalised and global accuracy per evaluated round, with the min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = [r for r in rounds if r.get("accuracy") is not None and math.isfinite(r["accuracy"])]
    fig, ax = plt.subplots(figsize=(6, 4))
    if evaluated:
        x = [r["round"] for r in evaluated]
        ax.plot(x, [r["accuracy"] for r in evaluated], marker="o", label="personalised (mean)")
        ax.fill_between(
            x, [r["accuracy-min"] for r in evaluated], [r["accuracy-max"] for r in evaluated],
            alpha=0.2, label="personalised (min-max over clients)",
        )  # fmt: skip
        tested = [r for r in evaluated if "global-accuracy" in r]  # none where the clients keep personal layers
        if tested:
            ax.plot([r["round"] for r in tested], [r["global-accuracy"] for r in tested], marker="s",
                    label="global model (mean)")  # fmt: skip
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    _save_figure(fig, path, dpi=120)


def _save_figure(figure: object, path: Path, *, dpi: int) -> None:
    """Write ``figure`` as a PNG at ``path`` atomically (a link at ``path`` is replaced, not followed), and close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    plt.close(figure)
    write_atomically(path, buffer.getvalue())
