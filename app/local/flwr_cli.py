"""One client for Flower's ``flwr`` command line, shared by the local simulation and the local deployment.

``flwr run --stream`` exits 0 even when the run failed, so the launchers submit with
``flwr run --format json``, follow the run with ``flwr log --stream`` (one idle process
instead of a polling loop competing with the run for the CPU) and read its final status
from ``flwr ls``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.local.processes import ProcessExitedError

FINISHED_OK = "finished:completed"
FLOWER_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # else the SuperLink `uv sync`s GBs of CUDA torch
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
}


def flower_environment(home: Path, more: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of this process, Flower's home at ``home``, its checks and telemetry off, and ``more``."""
    return {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(home), **(more or {})}


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


class FlwrCli:
    """``flwr`` with one environment (its ``FLWR_HOME``), working directory and connection.

    Parameters
    ----------
    env
        The environment every ``flwr`` call gets (see :func:`flower_environment`).
    cwd
        The working directory of every call.
    connection
        The connection named in ``config.toml`` (a deployment's); None for ``flwr``'s default
        (the local SuperLink of a simulation).
    timeout_s
        Seconds a call that answers at once may take.

    """

    def __init__(self, *, env: dict[str, str], cwd: Path, connection: str | None = None,
                 timeout_s: float = 120) -> None:  # fmt: skip
        self.env, self.cwd, self.timeout_s = env, cwd, timeout_s
        self.connection = [connection] if connection else []

    def json(self, args: list[str], timeout: float | None = None) -> dict:
        """``flwr <args> --format json``, parsed."""
        out = subprocess.run(["flwr", *args, "--format", "json"], env=self.env, cwd=self.cwd, capture_output=True,
                             text=True, timeout=timeout or self.timeout_s)  # fmt: skip
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError as err:
            raise RuntimeError(f"`flwr {' '.join(args)}` printed no JSON:\n{out.stdout}\n{out.stderr}") from err

    def submit(self, app_dir: Path, run_config: str, options: Sequence[str] = ()) -> str:
        """``flwr run`` the app with ``--run-config`` text (and more ``options``); the run id."""
        reply = self.json(["run", str(app_dir), *self.connection, "--run-config", run_config, *options])
        if not reply.get("success"):
            raise RuntimeError(f"flwr run refused the submission: {reply}")
        return str(reply["run-id"])

    def status(self, run_id: str) -> str:
        """The run's status as ``flwr ls`` reports it (``finished:completed`` when it succeeded)."""
        return self.json(["ls", "--run-id", run_id, *self.connection])["runs"][0]["status"]

    def statuses(self) -> dict[str, str]:
        """Run id -> status of every run, from one ``flwr ls``."""
        return {str(run["run-id"]): run["status"] for run in self.json(["ls", *self.connection])["runs"]}

    def follow(self, run_id: str, *, timeout_s: float, watch: Callable[[], str | None] | None = None) -> str:
        """The run's log from ``flwr log --stream``, which returns when the run ends (or after ``timeout_s``).

        ``watch`` is asked twice a second what went wrong (None: nothing): a SuperNode or
        SuperLink that died leaves its run pending until the timeout, so its report ends the wait at once.

        Raises
        ------
        ProcessExitedError
            With ``watch``'s report (the process's name and log), as soon as it has one.

        """
        with tempfile.TemporaryFile() as out:  # a file, not a pipe: a long log never blocks the stream
            stream = subprocess.Popen(["flwr", "log", run_id, *self.connection, "--stream"], env=self.env,
                                      cwd=self.cwd, stdout=out, stderr=subprocess.DEVNULL)  # fmt: skip
            deadline = time.monotonic() + timeout_s
            try:
                while stream.poll() is None and time.monotonic() < deadline:
                    if watch is not None and (problem := watch()):
                        raise ProcessExitedError(f"run {run_id} is pending, but {problem}")
                    try:
                        stream.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                if stream.poll() is None:
                    stream.kill()
                    stream.wait()
            out.seek(0)
            return out.read().decode(errors="replace")

    def wait(self, run_id: str, *, timeout_s: float, since: float | None = None,
             watch: Callable[[], str | None] | None = None) -> RunOutcome:  # fmt: skip
        """Follow the run until it ends (or ``timeout_s``, or ``watch`` reports a death), then read its final status.

        ``since`` (a ``time.perf_counter()``) starts the outcome's wall time; by default, now.
        """
        since = time.perf_counter() if since is None else since
        log = self.follow(run_id, timeout_s=timeout_s, watch=watch)
        wall = time.perf_counter() - since  # the run ended with its log, before the `flwr ls` that reads its status
        return RunOutcome(run_id=run_id, status=self.status(run_id), wall_seconds=wall, log=log)

    def wait_all(self, run_ids: list[str], *, timeout_s: float, poll_s: float,
                 watch: Callable[[], str | None] | None = None,
                 ready: Callable[[], bool] | None = None) -> dict[str, str]:  # fmt: skip
        """Wait until every run in ``run_ids`` has a final status (or ``timeout_s``); run id -> status.

        One ``flwr ls`` every ``poll_s`` seconds covers all runs (each call costs about 2
        CPU-seconds here, which the runs themselves need on a small machine); ``watch`` is
        asked twice a second in between, as in :meth:`follow`, and so is ``ready``: once it
        says the runs have ended (a cheap sign, such as their result files), ``flwr ls``
        confirms at once, and again a second later while a run is still finishing.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = self.statuses()
            mine = {run_id: statuses.get(run_id, "unknown") for run_id in run_ids}
            if all(s.startswith("finished") for s in mine.values()) or time.monotonic() > deadline:
                return mine
            polled, was_ready = time.monotonic(), ready is not None and ready()
            wait_s = 1.0 if was_ready else poll_s
            while time.monotonic() - polled < wait_s:
                if watch is not None and (problem := watch()):
                    raise ProcessExitedError(f"runs {', '.join(run_ids)} are pending, but {problem}")
                if not was_ready and ready is not None and ready():
                    break
                time.sleep(0.5)
