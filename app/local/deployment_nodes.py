"""The SuperNodes of a local deployment: each one's start (its key registered), a restart on a lost port, a kill.

:class:`~app.local.deployment.LocalDeployment` takes these methods from :class:`DeploymentNodes`.
A node starts as one of three kinds: a plain ``flower-supernode``, a warm device
(``python -m app.device.console``) or a device installed apart (``devices``), each with its own
environment and folder; its command is the deployment's ``node_command``.
"""

from __future__ import annotations

import signal
from pathlib import Path

from app.local.credentials import make_node_key
from app.local.deployment_runs import CONNECTION
from app.local.processes import Started, hold_port, runtime_port


class DeploymentNodes:
    """Starting, restarting and killing a deployment's SuperNodes.

    A mixin: the class using it holds the attributes below (see
    :class:`~app.local.deployment.LocalDeployment`'s parameters) and defines ``_spawn``,
    ``flwr`` and ``node_command``.
    """

    node_auth: bool
    warm: bool
    devices: dict[int, list[str]]
    app_dir: Path
    workdir: Path
    env: dict[str, str]
    nodes: dict[int, Started]
    extra_nodes: list[Started]
    killed: set[int]

    def _await_node(self, partition: int) -> None:
        """Wait until the SuperNode of ``partition`` serves its Runtime API; restart it on a fresh port if it lost it.

        Only a plain ``flower-supernode`` is checked: a warm or installed device picks its port itself.
        """
        node = self.nodes[partition]
        if (port := runtime_port(node.command)) is not None:
            without_port = node.command[: node.command.index("--port")]
            hold_port(node, port, lambda fresh: self._spawn_node(partition, node.name, [*without_port, "--port",
                                                                                       str(fresh)]))  # fmt: skip

    def start_node(self, partition: int, *, register: bool = True, name: str = "") -> Started:
        """Start the SuperNode of ``partition``.

        With node authentication, ``register=False`` leaves its key unknown to the
        SuperLink (a device nobody enrolled). A ``name`` starts an extra node beside
        the federation's own (``kill_node`` and the partition map ignore it).
        """
        name = name or f"supernode-{partition}"
        key = None
        if self.node_auth:
            key = make_node_key(self.workdir / "keys", name)
            if register:
                self.flwr(["supernode", "register", str(key.public), CONNECTION])
        # a warm device runs stamen's app.device.console from the app's folder (stamen's packages are not installed)
        env = {**self.env, **self.node_env}
        if self.warm:
            env["PYTHONPATH"] = str(self.app_dir)
        cwd = None
        if partition in self.devices:  # an installed device: no clone on its path, an empty folder to run in
            env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            cwd = self.workdir / f"device-{partition}"
            cwd.mkdir(parents=True, exist_ok=True)
        return self._spawn_node(partition, name, self.node_command(partition, key=key), env=env, cwd=cwd)

    def _spawn_node(self, partition: int, name: str, command: list[str], *, env: dict[str, str] | None = None,
                    cwd: Path | None = None) -> Started:  # fmt: skip
        node = self._spawn(name, command, env=env, cwd=cwd)
        if name == f"supernode-{partition}":
            self.nodes[partition] = node
        else:
            self.extra_nodes.append(node)
        return node

    def kill_node(self, partition: int) -> None:
        """SIGKILL a SuperNode (a device that loses power): the SuperLink notices when its heartbeat expires."""
        self.killed.add(partition)
        self.nodes[partition].stop(signal.SIGKILL)
