"""Which stamen code a process runs: a fingerprint of its files, which the server and every client compare.

A run must not mix two versions of stamen. With ``flwr run .`` the ServerApp runs the
app bundle (FAB) Flower installed for this run, but a client may import stamen from
elsewhere: Ray puts the working directory of the local SuperLink first on its workers'
``sys.path``, and that SuperLink may have been started in another checkout
(docs/troubleshooting.md). Each side hashes the files of the stamen it imported, the
same files the FAB holds (``[tool.flwr.app] fab-include``), and the server refuses a
node whose fingerprint differs from its own (``strategies.nodes.preflight``).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

# The FAB's files (pyproject.toml's fab-include; tests/test_provenance.py checks they agree).
CODE_FILES = ("app/**/*.py", "clients/**/*.py", "strategies/**/*.py", "datasets/**/*.py", "datasets/data/*.json")
# What a node reports in its properties (and the server compares with its own).
CODE_FINGERPRINT, CODE_LOCATION = "code-fingerprint", "code-location"
SHOWN = 12  # hex digits of a fingerprint in a log line


def code_root() -> Path:
    """The folder holding the ``app``, ``clients``, ``strategies`` and ``datasets`` this process imported."""
    return Path(__file__).resolve().parents[2]


def code_fingerprint(root: Path | None = None) -> str:
    """SHA-256 over the relative path and contents of every file of :data:`CODE_FILES` under ``root``.

    ``root`` defaults to :func:`code_root`. Two folders holding the same files get the
    same fingerprint wherever they are (a checkout and the FAB built from it).
    """
    return folder_fingerprint((code_root() if root is None else Path(root)).resolve())


@lru_cache(maxsize=8)
def folder_fingerprint(root: Path) -> str:
    """:func:`code_fingerprint` of a resolved folder, hashed once per process.

    The files a process has imported do not change under it; keyed by the resolved
    folder, so the default and an explicit :func:`code_root` share one entry.
    """
    files = sorted({path for pattern in CODE_FILES for path in root.glob(pattern)
                    if path.is_file() and "__pycache__" not in path.parts})  # fmt: skip
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def code_identity() -> dict[str, str]:
    """The :data:`CODE_FINGERPRINT` and :data:`CODE_LOCATION` of the running process, as a node reports them."""
    return {CODE_FINGERPRINT: code_fingerprint(), CODE_LOCATION: str(code_root())}


def code_mismatch(answer: dict, *, fingerprint: str, location: str) -> str | None:
    """Why a node's reported code is not the server's (one line naming both locations), or ``None``.

    A node that reports no fingerprint runs a stamen older than this check.
    """
    theirs = answer.get(CODE_FINGERPRINT)
    if theirs == fingerprint:
        return None
    if not theirs:
        where = "stamen code older than the server's (it reports no code fingerprint)"
    else:
        where = f"stamen code from {answer.get(CODE_LOCATION, '?')} (fingerprint {str(theirs)[:SHOWN]})"
    return f"the node runs {where}, but the server runs {location} (fingerprint {fingerprint[:SHOWN]})"
