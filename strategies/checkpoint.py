"""Checkpoints: a run's models and strategy state after a round, in one ``.npz`` written atomically.

A checkpoint holds named arrays (the global model, diffusion's agents, FATHOM's
smoothed update) and a JSON document (the round, the run's settings, the round
records so far, scalar state such as hyperparameters and RNG states). Writing goes
to a temporary file in the same folder, flushed to disk, then renamed over the
old checkpoint, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "stamen-checkpoint/1"
FILE_NAME = "checkpoint.npz"
_META = "__meta__"


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
    """The checkpoint file of ``path``: the file itself, or ``checkpoint.npz`` in a run folder."""
    path = Path(path).expanduser().resolve()
    return path / FILE_NAME if path.is_dir() else path


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (temporary file, fsync, rename)."""
    if _META in checkpoint.arrays:
        raise ValueError(f"array name {_META!r} is reserved")
    meta = json.dumps({"format": FORMAT, "round": checkpoint.round, "state": checkpoint.state})
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as handle:
        np.savez(handle, **checkpoint.arrays, **{_META: np.array(meta)})
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(path)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises
    ------
    CheckpointError
        If the file is missing, truncated or corrupted, or is not a stamen checkpoint.

    """
    path = checkpoint_file(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (give the file or the run folder holding {FILE_NAME})")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if _META not in archive.files:
                raise CheckpointError(f"{path} is not a stamen checkpoint (no {_META} entry)")
            meta = json.loads(str(archive[_META]))
            arrays = {name: archive[name] for name in archive.files if name != _META}
    except CheckpointError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated or corrupted?): {err}") from err
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')!r}; this stamen reads {FORMAT!r}")
    return Checkpoint(round=int(meta["round"]), arrays=arrays, state=meta["state"])


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


def check_shapes(expected: list[tuple[int, ...]], stored: list[np.ndarray], what: str = "model") -> None:
    """Raise if the checkpoint's tensors do not have the shapes the run's model has."""
    shapes = [tuple(a.shape) for a in stored]
    if shapes != [tuple(s) for s in expected]:
        raise CheckpointError(f"checkpoint {what} has tensor shapes {shapes}; this run's model has {expected}")
