"""A run's folder: its name (``run-name``), claiming it, and files written new, never replacing one.

Nothing a user wrote is lost or mixed: a run writes only into a folder of its own (a
new default folder, made atomically, or a ``run-name`` folder that holds no earlier
run), never through a symbolic link. A refused run's record never replaces a file
(:func:`write_refusal`).
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import Mapping
from logging import INFO
from pathlib import Path

from flwr.common.logger import log

from app.workdir import resolved
from strategies.contracts.keys import ConfigError
from strategies.rounds.checkpoint import FILE_NAME, synced_temporary

SUMMARY = "summary.json"
REFUSAL_PREFIX = "refused-"  # refused-<timestamp>.json: a refused run's record beside an earlier run's files
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# one policy for a run's folder (docs/running.md#what-a-run-writes): its owner alone reads the model, the data's class
# counts and the run config; every file is 0600 (the atomic writes' mkstemp, metrics.jsonl's own open) in a 0700 folder
RUN_FOLDER_MODE, RUN_FILE_MODE = 0o700, 0o600
RUN_NAME_RULE = ("a run-name is one folder name under results-dir: no '/' or '\\', not '.' or '..', not blank, "
                 "at most 255 bytes (empty: <strategy>-<dataset>-<timestamp>)")  # fmt: skip
REFUSAL_SIZE_LIMIT = 1 << 20  # a refused run's summary.json is a few lines; a bigger file is an earlier run's


def jsonable(value: object) -> object:
    """NaN/inf become null so every line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def json_bytes(payload: object) -> bytes:
    """``payload`` as indented strict JSON (:func:`jsonable`), one file's bytes."""
    return (json.dumps(jsonable(payload), indent=2) + "\n").encode()


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
            os.mkdir(path, RUN_FOLDER_MODE)
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
        summary = json.loads(read_nofollow(path))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("refused") is True


def read_nofollow(path: Path) -> bytes:
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
    kept = write_new_numbered(run_dir, _refusal_stem(), read_nofollow(summary))
    summary.unlink()
    log(INFO, "stamen: a refused run's summary in %s is kept as %s", run_dir, kept.name)


def make_run_folder(run_dir: Path) -> None:
    """Create ``run_dir`` where absent; refuse a symbolic link or a file in its place."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(run_dir, RUN_FOLDER_MODE)
    except FileExistsError:
        info = run_dir.lstat()
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "a file"
            raise ConfigError(f"the results folder {run_dir} is {what}; stamen writes a run only into a folder of "
                              "its own, never through a link") from None  # fmt: skip
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != RUN_FOLDER_MODE:
            os.chmod(run_dir, RUN_FOLDER_MODE)  # a folder made by hand (or before this policy) is closed too


def write_refusal(*, run_dir: Path, reason: str, run_config: Mapping[str, object]) -> Path | None:
    """A refused run's record: ``status`` ``failed``, ``refused`` and the reason; the path written, or ``None``.

    ``flwr run --stream`` exits 0 whatever happens to the run, so a script finds why the
    run was refused in its folder. The record never replaces a file: it is the folder's
    ``summary.json`` where the folder is new or empty, and ``refused-<timestamp>.json``
    beside the files of an earlier run (whose ``summary.json`` stays as it was). Nothing
    is written where ``run_dir`` is a symbolic link or a file.
    """
    try:
        make_run_folder(run_dir)
    except ConfigError:
        return None
    payload = {"settings": dict(run_config), "status": "failed", "refused": True, "reason": reason,
               "completed-rounds": 0, "results-dir": str(run_dir)}  # fmt: skip
    data = json_bytes(payload)
    if not any(run_dir.iterdir()) and write_new(run_dir / SUMMARY, data):
        return run_dir / SUMMARY
    return write_new_numbered(run_dir, _refusal_stem(), data)
