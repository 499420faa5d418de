"""Run stamen through Flower's simulation engine from Python, and check how the run ended.

``flwr run --stream`` exits 0 even when the run failed, so scripts and tests use
this launcher instead: it starts a private local SuperLink (its own FLWR_HOME and
ports, so it never reuses a SuperLink started elsewhere with other settings) with the
command ``flwr`` itself would use, submits the app and waits for the run's final status
through :class:`~app.local.flwr_cli.FlwrCli`, and stops every process it started by
process group (:mod:`app.local.processes`).
"""

from __future__ import annotations

import os
import tempfile
import time
import urllib.request
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from app.local.flower_text import options_text
from app.local.flwr_cli import FINISHED_OK, FlwrCli, RunOutcome, flower_environment
from app.local.processes import Started, first_exit, free_port, spawn, stop, tail

__all__ = ["FINISHED_OK", "LocalSimulation", "RunOutcome", "free_port"]  # what scripts and tests import from here
SUPERLINK_START_S = 60  # flwr's own start waits 15 s, too short for a busy 2-core machine


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
        ports = {"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
                 "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port)}  # fmt: skip
        self.env = flower_environment(self.home, {**ports, **(env or {})})
        if pythonpath:
            inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
            self.env["PYTHONPATH"] = os.pathsep.join([*(str(Path(p).resolve()) for p in pythonpath), *inherited])
        self.cli = FlwrCli(env=self.env, cwd=self.workdir, timeout_s=180)
        self.superlink: Started | None = None

    def __enter__(self) -> LocalSimulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _superlink_command(self) -> list[str]:
        """The local SuperLink as ``flwr`` starts it (``flwr/cli/local_superlink.py``), on this simulation's ports."""
        runtime = self.home / "local-superlink"
        return ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess", "--control-api-address",
                f"127.0.0.1:{self.control_port}", "--host", "127.0.0.1", "--port", str(self.http_port), "--log-file",
                str(runtime / "superlink.log"), "--log-rotation-interval-hours", "24", "--log-rotation-backup-count",
                "7", "--database", str(runtime / "state.db")]  # fmt: skip

    def start(self) -> None:
        """Start the private SuperLink (in a process group of its own) and wait until it answers.

        ``flwr`` would start it at the first submission, detached, where only a search by
        command line could find it again; started here, it is stopped by process group.
        """
        if self.superlink is not None:
            return
        (self.home / "local-superlink").mkdir(parents=True, exist_ok=True)
        # the SuperLink's output and that of what it starts (SuperExec, simulation): --log-file holds its own only
        self.superlink = spawn("superlink", self._superlink_command(), env=self.env, cwd=self.workdir,
                               log_path=self.home / "local-superlink" / "output.log")  # fmt: skip
        deadline = time.monotonic() + SUPERLINK_START_S
        while not self._healthy():
            if self.superlink.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the local SuperLink did not start; log:\n{tail(self.superlink.log_path)}")
            time.sleep(0.2)
        self.superlink.adopt_descendants()  # its SuperExec, in a session of its own

    def _healthy(self) -> bool:
        """Whether the SuperLink answers ``/health``, as ``flwr`` asks before it would start one itself."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=0.4) as reply:
                return reply.status == 200
        except OSError:
            return False

    def submit(self, *, run_config: dict[str, object], num_supernodes: int, extra_federation: str = "") -> str:
        """Submit one run and return its run id, without waiting for it (see :meth:`wait`)."""
        self.start()
        self.superlink.adopt_descendants()  # a SuperExec that was late at the start
        federation = f"num-supernodes={num_supernodes} {extra_federation}".strip()
        run_id = self.cli.submit(self.app_dir, options_text(run_config), ["--federation-config", federation])
        self._submitted[run_id] = time.perf_counter()
        return run_id

    def wait(self, run_id: str, *, timeout_s: float = 1800) -> RunOutcome:
        """Wait for a submitted run to end; its status, and the seconds since it was submitted.

        Raises
        ------
        ProcessExitedError
            As soon as the SuperLink has exited while the run is pending (with its log).

        """
        since = self._submitted.pop(run_id, None)
        return self.cli.wait(run_id, timeout_s=timeout_s, since=since, watch=lambda: first_exit([self.superlink]))

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
        """Stop the SuperLink and everything it started (by process group), then delete the private home."""
        if self.superlink is not None:
            stop([self.superlink])
        self._tmp.cleanup()
