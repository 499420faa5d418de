"""Run stamen through Flower's simulation engine from Python, and check how the run ended.

``flwr run --stream`` exits 0 even when the run failed, so scripts and tests use
this launcher instead: it starts a private local SuperLink (its own FLWR_HOME and
ports, so it never reuses a SuperLink started elsewhere with other settings),
submits the app with ``flwr run --format json``, polls ``flwr ls --run-id`` until
the run finishes, and stops every process it started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

FINISHED_OK = "finished:completed"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill_matching(marker: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        for pid in (int(p) for p in pids if int(p) != os.getpid()):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if pids and sig == signal.SIGTERM:
            time.sleep(1.0)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value + "'"
    return repr(value)


def run_config_text(config: dict[str, object]) -> str:
    """``{"lr": 0.1, "dataset": "mnist"}`` -> ``lr=0.1 dataset='mnist'`` for ``--run-config``."""
    return " ".join(f"{key}={_toml_value(value)}" for key, value in config.items())


@dataclass(frozen=True)
class RunOutcome:
    """How a submitted run ended."""

    run_id: str
    status: str
    wall_seconds: float
    log: str

    @property
    def log_tail(self) -> str:
        return self.log[-4000:]

    @property
    def ok(self) -> bool:
        return self.status == FINISHED_OK


class LocalSimulation:
    """A private local SuperLink in simulation mode; use as a context manager.

    Parameters
    ----------
    app_dir
        The Flower app (the folder holding ``pyproject.toml``).
    workdir
        Working directory of the SuperLink (Ray puts it first on workers' ``sys.path``);
        a fresh temporary folder by default.
    pythonpath
        Folders put on ``PYTHONPATH`` of the SuperLink and every process it starts. An app
        that imports stamen's folders by their short names (the test apps in ``tests/``)
        needs the clone here: installing stamen provides only ``stamen.*``.
    env
        More environment for the SuperLink and what it starts; ``{"RAY_ADDRESS": "host:port"}``
        runs the simulation on that existing Ray cluster instead of a private local one.

    """

    def __init__(
        self,
        *,
        app_dir: Path,
        workdir: Path | None = None,
        pythonpath: Sequence[Path] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.app_dir = Path(app_dir).resolve()
        self._tmp = tempfile.TemporaryDirectory(prefix="stamen-flwr-")
        self.home = Path(self._tmp.name) / "flwr-home"
        self.workdir = Path(workdir) if workdir else Path(self._tmp.name) / "cwd"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.http_port, self.control_port = free_port(), free_port()
        self._submitted: dict[str, float] = {}  # run id -> when it was submitted (perf_counter)
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port),
            **(env or {}),
        }
        if pythonpath:
            inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
            self.env["PYTHONPATH"] = os.pathsep.join([*(str(Path(p).resolve()) for p in pythonpath), *inherited])

    def __enter__(self) -> LocalSimulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flwr(self, args: list[str], timeout: float = 180) -> dict:
        out = subprocess.run(
            ["flwr", *args, "--format", "json"], env=self.env, cwd=self.workdir,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError as err:
            raise RuntimeError(f"`flwr {args[0]}` printed no JSON:\n{out.stdout}\n{out.stderr}") from err

    def submit(self, *, run_config: dict[str, object], num_supernodes: int, extra_federation: str = "") -> str:
        """Submit one run and return its run id, without waiting for it (see :meth:`wait`)."""
        federation = f"num-supernodes={num_supernodes} {extra_federation}".strip()
        submitted = self._flwr(["run", str(self.app_dir), "--run-config", run_config_text(run_config),
                                "--federation-config", federation])  # fmt: skip
        if not submitted.get("success"):
            raise RuntimeError(f"flwr run refused the submission: {submitted}")
        run_id = str(submitted["run-id"])
        self._submitted[run_id] = time.perf_counter()
        return run_id

    def wait(self, run_id: str, *, timeout_s: float = 1800) -> RunOutcome:
        """Wait for a submitted run to end; its status, and the seconds since it was submitted."""
        # `flwr log --stream` blocks until the run ends: one idle process instead of a
        # polling loop that would compete with the simulation for the CPU.
        try:
            streamed = subprocess.run(
                ["flwr", "log", run_id, "--stream"], env=self.env, cwd=self.workdir,
                capture_output=True, text=True, timeout=timeout_s,
            ).stdout  # fmt: skip
        except subprocess.TimeoutExpired as err:
            streamed = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else err.stdout
        wall = time.perf_counter() - self._submitted.pop(run_id, time.perf_counter())
        status = self._flwr(["ls", "--run-id", run_id])["runs"][0]["status"]
        return RunOutcome(run_id=run_id, status=status, wall_seconds=wall, log=streamed or "")

    def run(
        self, *, run_config: dict[str, object], num_supernodes: int, timeout_s: float = 1800, extra_federation: str = ""
    ) -> RunOutcome:
        """Submit one run, wait for it to finish, and return its final status."""
        run_id = self.submit(run_config=run_config, num_supernodes=num_supernodes, extra_federation=extra_federation)
        return self.wait(run_id, timeout_s=timeout_s)

    def run_many(
        self, runs: dict[str, dict[str, object]], *, num_supernodes: int, ahead: int = 3, timeout_s: float = 1800,
        extra_federation: str = "",
    ) -> dict[str, RunOutcome]:
        """Run several configs, keeping up to ``ahead`` submitted at a time; their outcomes by name.

        The SuperLink starts every submitted run at once, each in its own simulation
        process with its own Ray, so up to ``ahead`` run side by side: their start-up and
        polling overlap. Each holds a ServerApp and Ray workers in memory; keep ``ahead``
        small. Submissions go one after another: the first starts the local SuperLink, and
        two at once would both try to.
        """
        outcomes: dict[str, RunOutcome] = {}
        in_flight: deque[tuple[str, str]] = deque()
        for name, config in runs.items():
            if len(in_flight) >= max(1, ahead):
                done, run_id = in_flight.popleft()
                outcomes[done] = self.wait(run_id, timeout_s=timeout_s)
            in_flight.append((name, self.submit(run_config=config, num_supernodes=num_supernodes,
                                                extra_federation=extra_federation)))  # fmt: skip
        while in_flight:
            done, run_id = in_flight.popleft()
            outcomes[done] = self.wait(run_id, timeout_s=timeout_s)
        return {name: outcomes[name] for name in runs}

    def close(self) -> None:
        """Stop the SuperLink and everything it started, then delete the private home."""
        _kill_matching(str(self.home))
        _kill_matching(f"127.0.0.1:{self.http_port}")
        self._tmp.cleanup()
