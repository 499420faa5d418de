"""Which code, data, libraries and machine made a result: the ``provenance`` of ``run.json`` and ``summary.json``.

Enough to rerun a result or to tell two apart: the fingerprint of the stamen code the
server ran (the same files every client proved to run in the preflight), the git commit
and a dirty flag of the checkout that code came from where the server can find it, the
versions that change numbers, the machine, and (in the summary) a fingerprint of the
data every client trained on.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from app.workdir import STARTED_IN, installed_from_a_fab
from strategies.contracts.client_reports import DATA_FINGERPRINT, NUM_TEST, NUM_TRAIN
from strategies.contracts.code import code_fingerprint, code_root

LIBRARIES = ("flwr", "torch", "numpy", "ray")
# What decides a run's numbers in a checkout: a change here makes it dirty.
CODE_PATHS = ("app", "clients", "strategies", "datasets", "pyproject.toml")


def git_checkout(folder: Path) -> dict[str, object] | None:
    """``folder``'s commit and whether its code differs from it (``dirty``), or ``None`` outside a git work tree."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()  # fmt: skip

    try:
        if git("rev-parse", "--show-toplevel") != str(folder.resolve()):
            return None
        changed = git("status", "--porcelain", "--", *CODE_PATHS)
        return {"checkout": str(folder), "commit": git("rev-parse", "HEAD"), "dirty": bool(changed)}
    except (OSError, subprocess.SubprocessError):
        return None


def source_checkout(fingerprint: str) -> dict[str, object]:
    """The git checkout holding the code that ran (same fingerprint), or why none is known.

    Looked for where the code was imported from (a run in this process, or a checkout
    on ``PYTHONPATH``) and in the folder the process started in (for ``flwr run .``,
    where the local SuperLink was started). A FAB carries no git data: a run whose
    SuperLink started elsewhere records no commit.
    """
    for folder in dict.fromkeys((code_root(), STARTED_IN)):
        found = git_checkout(folder)
        if found is not None and code_fingerprint(folder) == fingerprint:
            return found
    return {"checkout": None, "commit": None, "dirty": None,
            "why": "no git checkout holding this code was found where the code came from or where the server "
                   f"started ({STARTED_IN}); the app bundle (FAB) carries no git data"}  # fmt: skip


def stamen_version(root: Path) -> str:
    """``[project] version`` of the app's ``pyproject.toml`` (a FAB holds one), else the installed package's."""
    found = re.search(r'(?m)^version\s*=\s*"([^"]+)"', (root / "pyproject.toml").read_text()) \
        if (root / "pyproject.toml").is_file() else None  # fmt: skip
    if found:
        return found.group(1)
    try:
        return metadata.version("stamen")
    except metadata.PackageNotFoundError:
        return "unknown"


def versions() -> dict[str, str]:
    """stamen's, Python's and :data:`LIBRARIES`' versions."""
    found = {"stamen": stamen_version(code_root()), "python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def machine(device: str) -> dict[str, object]:
    """The server's machine, and the device its clients were asked to use (``device``, CUDA's name where used)."""
    import torch

    cuda = torch.cuda.is_available() and device in ("auto", "cuda")
    return {"host": platform.node(), "platform": platform.platform(), "processor": platform.machine(),
            "cpus": os.cpu_count(), "device": device,
            "cuda": torch.cuda.get_device_name(0) if cuda else None}  # fmt: skip


def code_provenance() -> dict[str, object]:
    """The code part: fingerprint, where the server imported it from, whether that is a FAB, and its checkout."""
    root = code_root()
    fingerprint = code_fingerprint()
    return {"fingerprint": fingerprint, "location": str(root), "from-fab": installed_from_a_fab(root),
            "interpreter": sys.executable, **{f"git-{k}": v for k, v in source_checkout(fingerprint).items()}}


def run_provenance(device: str) -> dict[str, object]:
    """What ``run.json`` records at the start of a run: code, versions and machine."""
    return {"code": code_provenance(), "versions": versions(), "machine": machine(device)}


def data_provenance(nodes: list[dict[str, object]]) -> dict[str, object]:
    """One fingerprint over every client's data fingerprint (by partition), with the clients and examples it covers."""
    known = sorted((int(n["partition"]), str(n[DATA_FINGERPRINT])) for n in nodes if n.get(DATA_FINGERPRINT))
    text = "\n".join(f"{partition}:{fingerprint}" for partition, fingerprint in known)
    return {"fingerprint": hashlib.sha256(text.encode()).hexdigest() if known else None, "clients": len(known),
            "train-examples": sum(int(n.get(NUM_TRAIN, 0)) for n in nodes),
            "test-examples": sum(int(n.get(NUM_TEST, 0)) for n in nodes)}  # fmt: skip
