"""Checkpoints: a run's models and strategy state after a round, in one ``.npz`` written atomically.

A checkpoint holds named arrays (the global model, diffusion's agents, FATHOM's
smoothed update) and a JSON document (the round, the run's settings, the round
records so far, scalar state such as hyperparameters and RNG states). Writing goes
to a temporary file in the same folder, flushed to disk, then renamed over the
old checkpoint, so a crash mid-write leaves the previous checkpoint intact.

A checkpoint read back is input, not a fact (a file can be truncated, edited or
written by another program): :func:`load_checkpoint` checks the document's shape
and the arrays' kinds, and every problem is one :class:`CheckpointError` line.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "stamen-checkpoint/1"
FILE_NAME = "checkpoint.npz"
_META = "__meta__"
NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integers, floats: what models and strategy states hold
# What a damaged or foreign archive raises while numpy and zipfile read it; each means "not readable".
_UNREADABLE = (OSError, ValueError, EOFError, KeyError, TypeError, NotImplementedError, RecursionError, MemoryError,
               UnicodeDecodeError, zipfile.BadZipFile, zlib.error)  # fmt: skip
# The state's entries that every stamen checkpoint may hold, with the JSON type each must have, and its name.
STATE_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "settings": ((dict,), "a JSON object"), "history": ((list,), "a JSON list"), "strategy": ((str,), "a string"),
    "elapsed-seconds": ((int, float), "a number"), "node-properties": ((dict,), "a JSON object"),
    "own": ((dict,), "a JSON object"), "tuner": ((dict,), "a JSON object"),
}  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit the run resuming from it."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Checkpoint:
    """What a run needs to continue after ``round``.

    Attributes
    ----------
    round
        The last completed round.
    arrays
        Named arrays (``global/0`` ... for the global model's tensors, and each
        strategy's own).
    state
        JSON-serialisable state: ``settings`` (the run config), ``history`` (the
        round records), ``elapsed-seconds`` and each strategy's scalars.

    """

    round: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    state: dict = field(default_factory=dict)


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file of ``path``: the file itself, or ``checkpoint.npz`` in a run folder.

    The folders above ``path`` are resolved, ``path`` itself is not: a symbolic link
    stays one, so that :func:`load_checkpoint` and the result writer can refuse it.
    """
    path = Path(path).expanduser()
    path = path.parent.resolve() / path.name
    return path / FILE_NAME if path.is_dir() and not path.is_symlink() else path


def synced_temporary(path: Path, data: bytes) -> str:
    """A new temporary file beside ``path`` (``.<name>.*.partial``, created exclusively) holding ``data``, synced.

    Removed again if writing fails; the caller renames or links it into place.
    """
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return partial


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data``: a temporary file in the same folder, synced, then renamed over it.

    A reader sees the old file or the new one, never half of one; a crash leaves at most
    a ``.<name>.*.partial`` file. The temporary file is created exclusively (never through
    a planted symbolic link), and the rename replaces a link at ``path`` instead of
    writing where it points.
    """
    partial = synced_temporary(path, data)
    try:
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the system allows opening a folder)."""
    try:
        handle = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass  # some file systems refuse to sync a folder; the rename is still atomic
    finally:
        os.close(handle)


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (:func:`write_atomically`)."""
    if _META in checkpoint.arrays:
        raise ValueError(f"array name {_META!r} is reserved")
    meta = json.dumps({"format": FORMAT, "round": checkpoint.round, "state": checkpoint.state})
    buffer = io.BytesIO()
    np.savez(buffer, **checkpoint.arrays, **{_META: np.array(meta)})
    write_atomically(path, buffer.getvalue())


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`, checking everything the run will use.

    Raises
    ------
    CheckpointError
        If the file is missing, a symbolic link, truncated or corrupted, not a stamen
        checkpoint, or if its document or arrays are not what a checkpoint holds
        (:func:`meta_problem`, non-numeric arrays).

    """
    path = checkpoint_file(path)
    if path.is_symlink():
        raise CheckpointError(f"checkpoint {path} is a symbolic link; give the checkpoint file itself")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (give the file or the run folder holding {FILE_NAME})")
    meta, arrays = _read_archive(path)
    if problem := meta_problem(meta):
        raise CheckpointError(f"checkpoint {path} {problem}")
    odd = sorted(name for name, a in arrays.items() if a.dtype.kind not in NUMERIC_KINDS)
    if odd:
        raise CheckpointError(f"checkpoint {path} has non-numeric arrays {odd} ({arrays[odd[0]].dtype})")
    return Checkpoint(round=meta["round"], arrays=arrays, state=meta["state"])


def _read_archive(path: Path) -> tuple[object, dict[str, np.ndarray]]:
    """The decoded ``__meta__`` document and the other arrays of the ``.npz`` at ``path``."""
    try:
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb") as handle:
            archive = np.load(handle, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise CheckpointError(f"{path} is not a stamen checkpoint (a single array, not an .npz archive)")
            with archive:
                if _META not in archive.files:
                    raise CheckpointError(f"{path} is not a stamen checkpoint (no {_META} entry)")
                text = archive[_META]
                if text.dtype.kind != "U" or text.ndim != 0:
                    raise CheckpointError(f"checkpoint {path} has a {_META} entry that is not a JSON text")
                meta = json.loads(str(text))
                arrays = {name: archive[name] for name in archive.files if name != _META}
    except CheckpointError:
        raise
    except _UNREADABLE as err:
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated or corrupted?): "
                              f"{type(err).__name__}: {err}") from err  # fmt: skip
    return meta, arrays


def meta_problem(meta: object) -> str | None:
    """Why a checkpoint's decoded document is not one :func:`save_checkpoint` writes, or ``None``."""
    if not isinstance(meta, dict):
        return f"has a {_META} document that is no JSON object: {_shown(meta)}"
    if meta.get("format") != FORMAT:
        return f"has format {meta.get('format')!r}; this stamen reads {FORMAT!r}"
    round_ = meta.get("round")
    if not _is_int(round_) or round_ < 0:
        return f"has round {round_!r}; a checkpoint's round is a whole number from 0"
    state = meta.get("state")
    if not isinstance(state, dict):
        return f"has state {_shown(state)}; a checkpoint's state is a JSON object"
    return state_problem(state)


def state_problem(state: dict) -> str | None:
    """Why a checkpoint's ``state`` has an entry of the wrong type (:data:`STATE_TYPES`), or ``None``."""
    for key, (types, name) in STATE_TYPES.items():
        if key in state and (not isinstance(state[key], types) or isinstance(state[key], bool)):
            return f"has state {key!r} = {_shown(state[key])}; it must be {name}"
    seconds = state.get("elapsed-seconds", 0.0)
    if not math.isfinite(seconds) or seconds < 0:
        return f"has state 'elapsed-seconds' = {seconds!r}; it must be a finite number from 0"
    for number, record in enumerate(state.get("history", []), start=1):
        if not isinstance(record, dict) or not _is_int(record.get("round")):
            return f"has round record {number} = {_shown(record)}; each is a JSON object with an integer 'round'"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object, limit: int = 60) -> str:
    """``value`` as a short repr for an error line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def model_arrays(arrays: list[np.ndarray], prefix: str = "global") -> dict[str, np.ndarray]:
    """A model's tensors as named checkpoint arrays ``<prefix>/0``, ``<prefix>/1``, ..."""
    return {f"{prefix}/{i}": a for i, a in enumerate(arrays)}


def arrays_of_model(checkpoint: Checkpoint, prefix: str = "global") -> list[np.ndarray]:
    """The tensors stored by :func:`model_arrays`, in order."""
    count = sum(1 for name in checkpoint.arrays if name.startswith(f"{prefix}/"))
    try:
        return [checkpoint.arrays[f"{prefix}/{i}"] for i in range(count)]
    except KeyError as err:
        raise CheckpointError(f"checkpoint lacks model tensor {err}") from err


def check_model(expected: Sequence[np.ndarray], stored: list[np.ndarray], what: str = "model") -> None:
    """Raise if the checkpoint's tensors are not as many, or not of the shapes and dtypes, as the run's model's."""
    shapes = [tuple(a.shape) for a in stored]
    wanted = [tuple(a.shape) for a in expected]
    if shapes != wanted:
        raise CheckpointError(f"checkpoint {what} has tensor shapes {shapes}; this run's model has {wanted}")
    dtypes = [str(a.dtype) for a in stored]
    wanted_dtypes = [str(a.dtype) for a in expected]
    if dtypes != wanted_dtypes:
        raise CheckpointError(f"checkpoint {what} has tensor dtypes {dtypes}; this run's model has {wanted_dtypes}")
