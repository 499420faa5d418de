"""Decoded datasets kept on disk as ``.npz``, keyed by the files they came from.

Parsing LEAF's JSON or decoding thousands of images costs seconds in every process
that needs the data: each simulation worker, and on a deployed device every message
(Flower starts a fresh ClientApp process per message). The arrays are written once
under :func:`cache_dir` and read back in milliseconds; a changed source file changes
the key. An unwritable cache is skipped: it only costs the decoding again. An entry
holds a copy of data that may sit in a folder only its owner can read, so it is
created readable by its owner alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    """Where decoded datasets are kept: ``$STAMEN_CACHE_DIR``, else ``~/.cache/stamen``."""
    return Path(os.environ.get("STAMEN_CACHE_DIR", Path.home() / ".cache" / "stamen")).expanduser()


def fingerprint(root: Path, files: Iterable[Path], *extra: object) -> str:
    """Names (relative to ``root``), sizes and modification times of ``files``, and ``extra``, hashed."""
    stats = [(str(f.relative_to(root)), stat.st_size, stat.st_mtime_ns) for f in files for stat in (f.stat(),)]
    blob = json.dumps([str(root.resolve()), stats, [str(e) for e in extra]])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays stored at ``path``, or ``None`` when there is no (readable) entry."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as stored:
            return {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # a damaged entry is decoded again and replaced
        return None


def store_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically (concurrent processes never read half a file), mode 0600."""
    partial = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkstemp creates the file with os.open(..., O_EXCL, 0o600): it is never readable by others, not even while
        # it is written (a chmod afterwards would leave that moment open)
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f"{path.stem}.", suffix=".partial.npz")
        partial = Path(name)
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **arrays)
        partial.replace(path)
    except OSError:  # a read-only home only costs the decoding time again
        if partial is not None:
            partial.unlink(missing_ok=True)
