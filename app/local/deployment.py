"""A real Flower deployment on this machine: one SuperLink, N SuperNodes, optional TLS and node authentication.

Run it to try stamen as a deployment before moving to real devices::

    python -m app.local.deployment --nodes 2                        # insecure, loopback
    python -m app.local.deployment --nodes 3 --tls --auth            # TLS + SuperNode authentication
    python -m app.local.deployment --nodes 2 --tls --auth --lan-host 127.0.0.2  # LAN: devices through the Fleet gate
    python -m app.local.deployment --nodes 2 --run-config "strategy='fathom' num-server-rounds=5"
    python -m app.local.deployment --nodes 2 --serve                 # keep it up; submit with `flwr run . <connection>`

Read it as the reference for a deployment of your own: every process is started
with exactly the command a person would type (see ``commands``), the SuperLink
and each SuperNode log to ``<workdir>/logs/``, and everything it started is
stopped by process group on exit (also on errors and Ctrl-C).
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from app.local.credentials import CERT_DAYS, Certificates, NodeKey, make_certificates
from app.local.deployment_commands import (
    connection_file,
    deployment_problem,
    gate_command,
    node_config,
    superlink_command,
    supernode_options,
    url_host,
)
from app.local.deployment_nodes import DeploymentNodes
from app.local.deployment_runs import CONNECTION, DeploymentRuns
from app.local.flwr_cli import FlwrCli, flower_environment
from app.local.processes import (
    PORT_IN_USE,
    Started,
    first_exit,
    free_port,
    group_processes,
    hold_port,
    live_processes,
    report,
    spawn,
    stop,
)

# what tests and benchmarks import from here beside LocalDeployment
__all__ = ["CONNECTION", "PORT_IN_USE", "LocalDeployment", "group_processes", "live_processes"]
PACKAGE = __package__ or "app"  # app.local in a clone, stamen.app.local where installed
PACKAGE_ROOT = Path(__file__).resolve().parents[len(PACKAGE.split("."))]  # the clone, or site-packages


class LocalDeployment(DeploymentNodes, DeploymentRuns):
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1; a context manager that stops them all.

    The SuperLink always listens on 127.0.0.1: flwr 1.42 serves its Control API (runs,
    node registration) on the same listener as the Fleet API, without credentials
    (docs/deployment.md#on-a-lan-with-edge-devices). With ``lan_host`` the devices reach the
    Fleet API through the Fleet gate (``app/local/fleet_gate.py``) on that address instead.
    Its SuperNodes' methods are :class:`~app.local.deployment_nodes.DeploymentNodes`', its runs'
    :class:`~app.local.deployment_runs.DeploymentRuns`'.

    Parameters
    ----------
    app_dir
        The Flower app (folder with ``pyproject.toml``) that ``run`` submits.
    num_nodes
        SuperNodes to start; node i gets ``--node-config "partition-id=i num-partitions=num_nodes"``.
    node_data
        Each node's own data folder instead (a device that brings its data): node i gets
        ``--node-config "data-dir='node_data[i]'"`` and no partition; ``num_nodes`` must
        be its length.
    numbered
        With ``node_data``: node i also gets ``partition-id=i``. Without a partition id the
        server numbers devices by Flower node id, which a new SuperLink draws anew, so two
        deployments of the same devices train different partitions' batches; a fixed number
        makes them the same run.
    tls
        Serve the SuperLink over TLS: a server certificate made at each start, signed by the
        CA of ``workdir/certificates`` (made there the first time and kept: a restart with the
        same ``workdir`` renews the server certificate under it).
    cert_days
        How long each server certificate is valid (``--cert-days``; a year by default).
    node_auth
        Start the SuperLink with ``--enable-supernode-auth``, give every SuperNode a
        key pair and register its public key before the node starts. Needs ``tls``.
    lan_host
        Start the Fleet gate on this address (the LAN recipe of docs/deployment.md, the
        server's LAN address there; 127.0.0.2 on one machine) and have every SuperNode dial
        it; the connection in ``flwr-home`` stays on the SuperLink's 127.0.0.1. Needs ``tls``.
    slowed
        Partition -> an emulated slowdown factor (``emulated-slowdown`` in its node config:
        it answers each train message after that many times its work; docs/fleets.md).
    node_env
        Environment variables for the SuperNodes alone, beside this process's
        (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``: how often each node's SuperExec asks for a task).
    workdir
        Holds ``flwr-home``, certificates, keys, the SuperLink database and logs; a
        fresh temporary folder (deleted on exit) by default.
    warm
        Start each SuperNode as a warm device (``python -m app.device.console``: the SuperNode
        beside a SuperExec that forks each message's ClientApp from a process that
        imported torch once) instead of ``flower-supernode`` alone.
    devices
        Partition -> the command that starts that node as a device of its own, given the
        SuperNode's options (``["/venv/bin/stamen-device"]``: stamen installed there, no
        clone). It runs in an empty folder of its own, without the app's folder on its path.

    """

    def __init__(
        self,
        *,
        app_dir: Path,
        num_nodes: int,
        tls: bool = False,
        node_auth: bool = False,
        workdir: Path | None = None,
        node_data: list[Path] | None = None,
        numbered: bool = False,
        warm: bool = False,
        devices: Mapping[int, Sequence[str]] | None = None,
        lan_host: str | None = None,
        node_env: Mapping[str, str] | None = None,
        slowed: Mapping[int, float] | None = None,
        cert_days: int = CERT_DAYS,
    ) -> None:
        # every refusal comes before the temporary workdir below: a refused deployment leaves nothing behind
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        if node_data is not None and len(node_data) != num_nodes:
            raise ValueError(f"node_data names {len(node_data)} folders for {num_nodes} nodes")
        if problem := deployment_problem(tls=tls, node_auth=node_auth, lan_host=lan_host, cert_days=cert_days):
            raise ValueError(problem)
        self.node_data = [Path(folder).resolve() for folder in node_data] if node_data else None
        self.numbered = numbered
        self.cert_days = cert_days
        self.app_dir = Path(app_dir).resolve()
        self.num_nodes, self.tls, self.node_auth, self.warm = num_nodes, tls, node_auth, warm
        self.lan_host = lan_host
        self.devices = {int(k): list(v) for k, v in (devices or {}).items()}
        self.node_env = dict(node_env or {})
        self.slowed = {int(k): float(v) for k, v in (slowed or {}).items()}
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="stamen-deploy-")
        self.workdir = Path(workdir or self._tmp.name).resolve()
        self.home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = flower_environment(self.home)
        self.cli = FlwrCli(env=self.env, cwd=self.workdir, connection=CONNECTION)
        self.certificates: Certificates | None = None
        self.superlink: Started | None = None
        self.gate: Started | None = None
        self.gate_port: int | None = None
        self.nodes: dict[int, Started] = {}
        self.extra_nodes: list[Started] = []
        self.killed: set[int] = set()  # partitions whose SuperNode kill_node stopped on purpose

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the SuperLink, register the connection (and node keys), then start every SuperNode."""
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the SuperLink's database: see docs/deployment.md
        for folder in (self.home, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self.certificates = make_certificates(self.workdir / "certificates", host=self.lan_host or "127.0.0.1",
                                                  days=self.cert_days)  # fmt: skip
        self.superlink, self.port = self._start_server("superlink", self._superlink_command, self.port)
        self.address = f"127.0.0.1:{self.port}"
        self.superlink.adopt_descendants()  # its SuperExec, in a session of its own
        if self.lan_host:
            # the gate is stamen's own module: it runs from the folder holding this package, as installed or cloned
            path = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), self.env.get("PYTHONPATH")]))
            env = {**self.env, "PYTHONPATH": path}
            self.gate, self.gate_port = self._start_server("fleet-gate", self._gate_command, free_port(),
                                                           host=self.lan_host, env=env)  # fmt: skip
        self._write_connection()
        for partition in range(self.num_nodes):
            self.start_node(partition)
        for partition in range(self.num_nodes):
            self._await_node(partition)

    @property
    def fleet_address(self) -> str:
        """The address the SuperNodes dial: the Fleet gate's with ``lan_host``, else the SuperLink's."""
        return f"{url_host(self.lan_host)}:{self.gate_port}" if self.lan_host else self.address

    def _start_server(self, name: str, command: Callable[[int], list[str]], port: int, *, host: str = "127.0.0.1",
                      env: dict[str, str] | None = None) -> tuple[Started, int]:  # fmt: skip
        """Start ``command(port)`` until it holds its port (a fresh one after each loss); the process and port."""
        return hold_port(self._spawn(name, command(port), env=env), port,
                         lambda fresh: self._spawn(name, command(fresh), env=env), host=host)  # fmt: skip

    def _gate_command(self, port: int) -> list[str]:
        return gate_command(package=PACKAGE, lan_host=self.lan_host, port=port, superlink=self.address,
                            certificates=self.certificates)  # fmt: skip

    def _superlink_command(self, port: int) -> list[str]:
        return superlink_command(port=port, database=self.workdir / "superlink.db", tls=self.tls,
                                 certificates=self.certificates, node_auth=self.node_auth)  # fmt: skip

    def _write_connection(self) -> None:
        """``flwr``'s connection to the SuperLink (never the Fleet gate: it refuses the Control API)."""
        text = connection_file(CONNECTION, address=self.address, certificates=self.certificates)
        (self.home / "config.toml").write_text(text)

    def _spawn(self, name: str, command: list[str], *, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> Started:  # fmt: skip
        return spawn(name, command, log_path=self.logs / f"{name}.log", env=env or self.env, cwd=cwd or self.workdir)

    # here, not in deployment_nodes.py: every first port is picked in this module (tests/test_deploy_ports.py
    # hands out taken ones through its free_port)
    def node_command(self, partition: int, *, key: NodeKey | None = None) -> list[str]:
        """The ``flower-supernode`` command for partition ``partition``."""
        own_data = self.node_data[partition] if self.node_data and partition < len(self.node_data) else None
        options = supernode_options(superlink=self.fleet_address, tls=self.tls, certificates=self.certificates,
                                    node_config=node_config(partition, self.num_nodes, data_dir=own_data,
                                                            numbered=self.numbered,
                                                            slowdown=self.slowed.get(partition, 1.0)),
                                    key=key)  # fmt: skip
        if partition in self.devices:  # a device of its own: it picks its Runtime API port itself
            return [*self.devices[partition], *options]
        if self.warm:  # the device picks the port of its SuperNode's Runtime API itself
            return [sys.executable, "-m", "app.device.console", *options]
        return ["flower-supernode", *options, "--port", str(free_port())]

    def exited(self) -> str | None:
        """The first of the SuperLink, the Fleet gate and the federation's SuperNodes that exited, with its log.

        A SuperNode ``kill_node`` stopped and the extra nodes (``start_node(name=...)``) are expected to end.
        """
        nodes = [node for partition, node in self.nodes.items() if partition not in self.killed]
        return first_exit(item for item in (self.superlink, self.gate, *nodes) if item)

    def _started(self) -> list[Started]:
        """Every process this deployment started: the SuperLink, the Fleet gate, the SuperNodes."""
        return [item for item in (self.superlink, self.gate, *self.nodes.values(), *self.extra_nodes) if item]

    def process_groups(self) -> list[int]:
        """The process group of every process this deployment started (each leads its own)."""
        return [item.process.pid for item in self._started()]

    def close(self) -> None:
        """Stop every process this deployment started (by process group), then delete a temporary workdir."""
        stop(self._started()[::-1])  # the SuperNodes first, the SuperLink last
        if self._tmp:
            self._tmp.cleanup()

    def report(self, chars: int = 1500) -> str:
        """Each process this deployment started: running or its exit code, and the end of its log.

        For a failure message: a run stuck before round 1 usually means a SuperNode that
        never connected, which only its own log shows.
        """
        return report(self._started(), chars)

    def commands(self) -> list[str]:
        """The commands this deployment ran, for copying into a real one."""
        return [shlex.join(item.command) for item in [self.superlink, self.gate, *self.nodes.values()] if item]


if __name__ == "__main__":  # the command line lives in app/local/deployment_cli.py
    from app.local.deployment_cli import main

    sys.exit(main())
