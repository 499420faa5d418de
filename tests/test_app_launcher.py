"""The launchers' run config text and outcomes; a process that dies ends a wait at once; nothing is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO

from app.local.deployment import LocalDeployment
from app.local.flower_text import options_text
from app.local.flwr_cli import FINISHED_OK, RunOutcome
from app.local.processes import ProcessExitedError, live_processes, with_descendant_groups
from app.local.simulation import LocalSimulation


def test_options_text_is_the_key_value_text_flwr_run_takes():
    text = options_text({"lr": 0.1, "dataset": "mnist", "download": True, "local-steps": 4, "data-dir": "/a b"})
    assert text == 'lr=0.1 dataset="mnist" download=true local-steps=4 data-dir="/a b"'


def test_outcome_is_ok_only_when_completed():
    assert RunOutcome("1", FINISHED_OK, 1.0, "").ok
    assert not RunOutcome("1", "finished:failed", 1.0, "x" * 5000).ok
    assert len(RunOutcome("1", "finished:failed", 1.0, "x" * 5000).log_tail) == 4000


# ------------------------------------------------------------------ a dead process ends the wait at once


FEDAVG = {"strategy": "fedavg", "num-server-rounds": 1, "fraction-evaluate": 0.0, "preflight": False}
FAST_S = 30  # a wait that noticed the death; the run's own timeout below is 600 s


@pytest.mark.e2e
def test_a_deployment_whose_node_dies_fails_at_once_with_that_nodes_log(tmp_path):
    """A device that cannot start (as a device without Flower installed) ends the wait, not the 600 s timeout."""
    broken = [sys.executable, "-c", "import sys; print('PackageNotFoundError: no flwr here'); sys.exit(3)"]
    with LocalDeployment(app_dir=REPO, num_nodes=1, workdir=tmp_path / "d", devices={0: broken}) as deployment:
        run_id = deployment.submit({**FEDAVG, "results-dir": str(tmp_path)})
        started = time.monotonic()
        with pytest.raises(ProcessExitedError) as failure:
            deployment.wait(run_id, timeout_s=600)
        waited = time.monotonic() - started
        groups = deployment.process_groups()
    assert waited < FAST_S, waited
    assert f"run {run_id} is pending, but supernode-0 exited with 3" in str(failure.value)
    assert "PackageNotFoundError: no flwr here" in str(failure.value)  # the node's log
    assert not live_processes(groups)


@pytest.mark.e2e
def test_a_simulation_whose_superlink_dies_fails_at_once_and_leaves_nothing_behind(tmp_path):
    with LocalSimulation(app_dir=REPO) as sim:
        run_id = sim.submit(run_config=FEDAVG, num_supernodes=2)
        groups = with_descendant_groups([sim.superlink.process.pid])  # the SuperLink's and its SuperExec's
        assert len(groups) == 2
        sim.superlink.stop(signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ProcessExitedError, match=f"run {run_id} is pending, but superlink exited with -9"):
            sim.wait(run_id, timeout_s=600)
        assert time.monotonic() - started < FAST_S
    assert not live_processes(groups)


@pytest.mark.e2e
def test_a_finished_simulation_stops_every_process_it_started(tmp_path):
    with LocalSimulation(app_dir=REPO) as sim:
        outcome = sim.run(run_config={**FEDAVG, "results-dir": str(tmp_path)}, num_supernodes=2, timeout_s=600)
        groups = with_descendant_groups([sim.superlink.process.pid])
        home = str(sim.home)
    assert outcome.ok, outcome.log_tail
    assert not live_processes(groups)
    assert subprocess.run(["pgrep", "-f", home], capture_output=True).stdout == b""
