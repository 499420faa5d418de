"""A local deployment whose SuperLink and SuperNode find their ports taken starts them again on fresh ones.

``free_port`` only tells that a port was free when it looked. On a busy machine another
process can bind it first; the SuperNode then exits at once ("address already in use")
and the ServerApp waits for ``min-available-clients`` until the run times out (a CI run
stuck at ``[INIT]`` for 400 s). Here the first port handed to each process is held by
this test, so both must lose it, and the deployment must still come up with both connected.
"""

from __future__ import annotations

import socket
import time

import pytest
from conftest import REPO

import app.local.deployment as deploy
import app.local.processes as processes
from app.local.deployment import CONNECTION, LocalDeployment
from app.local.processes import PORT_IN_USE, free_port

pytestmark = pytest.mark.e2e


def test_a_superlink_and_a_supernode_whose_ports_are_taken_start_again_on_fresh_ones(tmp_path, monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # calls: the SuperLink's port (taken), its second, the SuperNode's port (taken), its second
        handed = iter([taken, free_port(), taken, free_port()])
        monkeypatch.setattr(deploy, "free_port", lambda: next(handed))  # first ports
        monkeypatch.setattr(processes, "free_port", lambda: next(handed))  # ports after a loss
        with LocalDeployment(app_dir=REPO, num_nodes=1, workdir=tmp_path / "deployment") as deployment:
            assert deployment.port != taken and deployment.superlink.process.poll() is None
            node = deployment.nodes[0]
            assert node.process.poll() is None and str(taken) not in node.command
            deadline, nodes = time.monotonic() + 60, []
            while not nodes and time.monotonic() < deadline:  # the node registers with the SuperLink once it runs
                nodes = [n for n in deployment.flwr(["supernode", "ls", CONNECTION])["nodes"]
                         if n.get("status") == "online"]  # fmt: skip
                time.sleep(1)
            report = deployment.report()
    assert len(nodes) == 1, report
    for name in ("superlink", "supernode-0"):
        lost = (tmp_path / "deployment" / "logs" / f"{name}.log.port-taken-0").read_text()
        assert PORT_IN_USE in lost.lower() and str(taken) in lost
    assert "supernode-0 (running)" in report and "superlink (running)" in report
