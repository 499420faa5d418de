"""Runs on a local deployment: ``flwr`` against its SuperLink, runs submitted, followed and waited for.

:class:`~app.local.deployment.LocalDeployment` takes these methods from :class:`DeploymentRuns`;
they only need its ``flwr`` client (``cli``), its app folder and its watch for processes that
exited (``exited``), so a run is read apart from how the processes were started.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.local.flower_text import options_text
from app.local.flwr_cli import FlwrCli, RunOutcome

CONNECTION = "stamen-local"  # the connection a deployment's flwr-home/config.toml names (flwr's default there)


class DeploymentRuns:
    """The runs of a deployment, through ``cli`` (a :class:`~app.local.flwr_cli.FlwrCli` on its connection).

    A mixin: the class using it sets ``cli`` and ``app_dir`` and defines ``exited``.
    """

    cli: FlwrCli
    app_dir: Path
    exited: Callable[[], str | None]

    def flwr(self, args: list[str], timeout: float = 120) -> dict:
        """``flwr <args> --format json`` against this deployment, parsed."""
        return self.cli.json(args, timeout)

    def status(self, run_id: str) -> str:
        """The run's status as ``flwr ls`` reports it (``finished:completed`` when it succeeded)."""
        return self.cli.status(run_id)

    def submit(self, run_config: dict[str, object] | str, *, app_dir: Path | None = None) -> str:
        """Submit the app (``app_dir``, default the deployment's) with ``run_config``; returns the run id.

        ``run_config`` is a dict, or ``--run-config`` text.
        """
        text = run_config if isinstance(run_config, str) else options_text(run_config)
        return self.cli.submit(app_dir or self.app_dir, text)

    def wait(self, run_id: str, *, timeout_s: float = 600) -> RunOutcome:
        """Follow the run's log until it ends (or ``timeout_s``), then read its final status from ``flwr ls``.

        Raises
        ------
        ProcessExitedError
            As soon as a process of the deployment exits while the run is pending (:meth:`exited`).

        """
        return self.cli.wait(run_id, timeout_s=timeout_s, watch=self.exited)

    def wait_all(self, run_ids: list[str], *, timeout_s: float = 600, poll_s: float = 10.0,
                 ready: Callable[[], bool] | None = None) -> dict[str, str]:  # fmt: skip
        """Wait until every run in ``run_ids`` has a final status; returns run id -> status.

        One ``flwr ls`` every ``poll_s`` seconds covers all runs (each call costs about
        2 CPU-seconds here, which the runs themselves need on a small machine), or as soon
        as ``ready()`` says they have ended (every run's ``summary.json`` written, say).
        Raises :class:`~app.local.processes.ProcessExitedError` as soon as a process of the
        deployment exits.
        """
        return self.cli.wait_all(run_ids, timeout_s=timeout_s, poll_s=poll_s, watch=self.exited, ready=ready)

    def run(self, run_config: dict[str, object] | str, *, timeout_s: float = 600) -> RunOutcome:
        """Submit, and wait for the run's final status and log."""
        return self.wait(self.submit(run_config), timeout_s=timeout_s)
