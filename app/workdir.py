"""Where the processes of a simulation look for stamen's code, and where a run's relative paths point.

``flwr run .`` hands the app bundle (FAB) to a local SuperLink that outlives the run and
that any later ``flwr run`` from any folder reuses. Its simulation process installs the
FAB and runs the ServerApp from it, but Ray puts that process's working directory (the
folder the SuperLink was started in) first on every worker's ``sys.path``: when that
folder is another checkout of stamen, the clients import its code, not this run's
(measured; docs/troubleshooting.md#two-checkouts).

:func:`serve_workers_from_the_fab` moves the simulation process into the FAB's folder
before Ray starts, so the workers import this run's code. It runs when the ClientApp
module is first imported in that process, which Flower does (to check that the
ClientApp loads) before it starts Ray. The code fingerprint in the preflight
(``strategies.contracts.code``) still refuses a run that mixes two stamens when this
cannot act (a stale SuperLink of an older stamen, Ray nodes on other machines).
"""

from __future__ import annotations

import os
import sys
from logging import INFO
from pathlib import Path

from flwr.common.logger import log

from strategies.contracts.code import code_root

# The working directory this process started in, read before anything can change it.
STARTED_IN = Path.cwd()
# Set to 1 in the SuperLink's environment to leave its working directory alone (the workers then import
# what that folder holds: only for comparing, or should the move ever misbehave).
KEEP_WORKDIR = "STAMEN_KEEP_SUPERLINK_WORKDIR"
SIMULATION_PROCESS = "flwr-simulation"
# Where a relative results-dir or resume-from points: predictable from the command alone.
RESULTS_HOME = Path("~/stamen")


def installed_from_a_fab(root: Path) -> bool:
    """Whether ``root`` is an app Flower installed from a FAB (``<FLWR_HOME>/apps/<publisher>.<name>.<ver>.<hash>``)."""
    return root.parent.name == "apps" and root.name.count(".") >= 3


def fab_root_of(path: Path) -> Path | None:
    """The folder of the installed FAB that holds ``path`` (an app's module), or ``None`` outside one."""
    for folder in Path(path).resolve().parents:
        if installed_from_a_fab(folder):
            return folder
    return None


def serve_workers_from_the_fab(root: Path | None = None) -> bool:
    """In Flower's simulation process, before Ray starts, move into the FAB's folder; whether it moved.

    ``root``: the FAB of the app being run (an outside app's, which imports an installed
    stamen); default: the one stamen's code runs from. Nothing happens elsewhere (a
    deployed ClientApp process, an in-process simulation, the tests) or when
    ``STAMEN_KEEP_SUPERLINK_WORKDIR=1``.
    """
    root = root if root is not None else code_root()
    if Path(sys.argv[0]).name != SIMULATION_PROCESS or os.environ.get(KEEP_WORKDIR) == "1":
        return False
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() or not installed_from_a_fab(root) or Path.cwd() == root:
        return False
    os.chdir(root)
    log(INFO, "stamen: simulation workers import this run's app from %s (the SuperLink runs in %s)", root, STARTED_IN)
    return True


def resolved(path: str) -> Path:
    """``path`` as an absolute path: ``~`` expanded, a relative one under ``~/stamen/``."""
    expanded = Path(path).expanduser()
    return expanded if expanded.is_absolute() else RESULTS_HOME.expanduser() / expanded
