"""Shared fixtures: where the real data lives, a skip when it is absent, settings and stand-in nodes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from app.config import parse_settings
from app.local.node_fleet import NodeFleet
from app.local.simulation import LocalSimulation
from datasets import ClientData
from strategies.contracts.code import code_identity

REPO = Path(__file__).resolve().parents[1]
# Every process the suite starts inherits this mark (the launchers copy os.environ), so the session's end can
# find any Flower or Ray process it left running, and only those.
SESSION_MARK = "STAMEN_TEST_SESSION"
FLOWER_PROCESSES = ("flower-superlink", "flower-supernode", "flower-superexec", "flwr-clientapp", "flwr-serverapp",
                    "flwr-simulation", "raylet", "gcs_server", "ray::")  # fmt: skip
LEFT_RUNNING_GRACE_S = 30.0  # a process being stopped at the end of the last test may take a moment
SHARED_DATA = Path(os.environ.get("STAMEN_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared_dataset(name: str) -> Path:
    """The real dataset folder under ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data {path} is absent (set STAMEN_SHARED_DATA to the folder holding {name}/)")
    return path


def settings(**config):
    """Run settings from keyword arguments: ``settings(strategy="fedavg", local_steps=4)``."""
    return parse_settings({key.replace("_", "-"): value for key, value in config.items()})


def regression_data(n: int = 16, seed: int = 0) -> tuple[ClientData, np.ndarray, np.ndarray]:
    """A client's least-squares data (3 features), and its training inputs and targets in float64 for hand maths."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)).astype(np.float32)
    return ClientData(x, y, x[:4], y[:4], num_classes=0), x.astype(np.float64), y.astype(np.float64)


class FakeNode:
    """A connected node as the server sees it, serving partition ``partition`` (by default its id as a number).

    It answers the preflight (``get_properties``) as a stamen client does; a subclass answers
    ``fit`` and ``evaluate`` as a stamen ``NumPyClient`` does (arrays and config in; arrays,
    example count and metrics out), or raises to fail its message.
    """

    def __init__(self, cid: str, partition: int | None = None) -> None:
        self.cid = cid
        self.partition = int(cid) if partition is None else partition

    def get_properties(self, config):
        return {"partition-id": self.partition, "num-partitions": 0, **code_identity()}

    def fit(self, parameters, config):
        raise NotImplementedError

    def evaluate(self, parameters, config):
        raise NotImplementedError


FakeFleet = NodeFleet  # nodes a test connects by hand (register, unregister), as the preflight and rounds see them


@pytest.fixture(scope="session")
def local_simulation():
    """One private local SuperLink in simulation mode for the whole session, running the checkout's app.

    The end-to-end modules that need no configuration of their own (no own app folder,
    workdir, environment, or killing of the SuperLink) submit their runs to it rather than
    start a SuperLink each; it is stopped, by process group, at the session's end.
    """
    with LocalSimulation(app_dir=REPO) as simulation:
        yield simulation


# The longest end-to-end modules, longest first (measured on two workers, 2 cores). pytest-xdist hands out whole
# modules in collection order; started first, the long ones overlap each other and the unit modules fill the gaps,
# instead of one long module running alone at the end. A stale list costs minutes, never a result.
LONGEST_FIRST = ("test_warm_device.py", "test_deployment.py", "test_install.py", "test_reproducibility.py",
                 "test_deployment_node_data.py", "test_simulation.py", "test_own_app.py", "test_failures_e2e.py",
                 "test_diffusion_simulation.py", "test_deploy_helper.py", "test_two_checkouts.py",
                 "test_misbehaving_clients.py", "test_ray_cluster.py")  # fmt: skip


def module_rank(item: pytest.Item) -> tuple[int, int]:
    """Listed long modules first, in the list's order; then the other end-to-end modules; the unit modules last."""
    name = item.path.name
    if name in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(name)
    return (1 if item.get_closest_marker("e2e") else 2), 0


def pytest_collection_modifyitems(items):
    items.sort(key=module_rank)  # stable: a module's tests keep their order


def pytest_sessionstart(session):
    os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"
    # Ray's ray.init() joins a cluster it finds running on this machine (tests/test_ray_cluster.py starts one):
    # with two pytest-xdist workers, another module's simulation would join that cluster and die when it stops.
    # "local" makes each simulation start its own; a run that must join a cluster names it in its environment.
    os.environ.setdefault("RAY_ADDRESS", "local")


def started_by_this_session() -> dict[int, str]:
    """pid -> command line of each live Flower or Ray process carrying this session's mark (Linux /proc)."""
    mark = f"{SESSION_MARK}={os.environ.get(SESSION_MARK)}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.name) == os.getpid() or mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if (proc / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue  # a zombie is dead already, its parent has yet to reap it
        except (OSError, ValueError):
            continue
        if any(name in command for name in FLOWER_PROCESSES):
            found[int(proc.name)] = command
    return found


# What each pytest-xdist worker left running, as the workers report it to the controller (pytest_testnodedown)
LEFT_BY_WORKERS: list[str] = []


def stop_what_this_session_left() -> list[str]:
    """Stop (SIGKILL) the processes this session's mark finds after a grace period; a line for each."""
    if not Path("/proc/self/environ").exists():
        return []
    deadline = time.monotonic() + LEFT_RUNNING_GRACE_S
    left = started_by_this_session()
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = started_by_this_session()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"  {pid}: {command[:200]}" for pid, command in sorted(left.items())]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    LEFT_BY_WORKERS.extend(getattr(node, "workeroutput", {}).get("left-running", []))


def pytest_sessionfinish(session, exitstatus):
    """Fail the session if any SuperLink, SuperNode, SuperExec, ClientApp or Ray process it started is still running.

    Under pytest-xdist each worker is a session with its own mark: a worker stops what it
    left and hands the lines to the controller, which reports them and fails the run (a
    worker's own exit status does not reach the controller's).
    """
    left = stop_what_this_session_left()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["left-running"] = left
        return
    left += LEFT_BY_WORKERS
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in [f"the test session left {len(left)} process(es) running (now stopped):", *left]:
        if reporter is None:
            print(line)
        else:
            reporter.write_line(line, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
