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

import argparse
import datetime
import ipaddress
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.config import ConfigError, parse_settings, run_config_from_text
from app.local.simulation import FINISHED_OK, RunOutcome, free_port, run_config_text

CONNECTION = "stamen-local"
FLOWER_ENV = {
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # else the SuperLink `uv sync`s GBs of CUDA torch
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
}
PORT_IN_USE = "address already in use"  # what a SuperLink or SuperNode logs when another process took its port
PORT_TRIES = 3  # starts of one process, each on a fresh port, before the deployment gives up
PACKAGE = __package__ or "app"  # app.local in a clone, stamen.app.local where installed
PACKAGE_ROOT = Path(__file__).resolve().parents[len(PACKAGE.split("."))]  # the clone, or site-packages
TLS_NEEDED = {
    "--auth": "--auth needs --tls: flower-superlink refuses --enable-supernode-auth without TLS certificates",
    "--lan-host": "--lan-host needs --tls: the Fleet gate serves the SuperLink's TLS certificate to the devices",
}


# ------------------------------------------------------------------ credentials


@dataclass(frozen=True)
class Certificates:
    """A private CA and a server certificate it signed (PEM files)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only, from the moment it exists.

    The key goes into a new file created with mode 0600 (``O_EXCL``: never one somebody
    else created), which then replaces ``path``; a key written first and chmod'ed after
    would be readable by others in between, or for good if the process died there.
    """
    spare = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    descriptor = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(spare, path)
    except BaseException:
        spare.unlink(missing_ok=True)
        raise


def make_certificates(folder: Path, *, host: str = "127.0.0.1", days: int = 30) -> Certificates:
    """A CA and a server certificate for ``host`` and 127.0.0.1 (IP or DNS ``subjectAltName``), PEM files in ``folder``.

    The SuperLink serves with the server certificate; SuperNodes and the ``flwr``
    CLI verify it against the CA (``--root-certificates`` / ``root-certificates``).
    127.0.0.1 is always named: on a LAN the SuperLink itself listens there, where the
    operator submits runs and the Fleet gate (``app/local/fleet_gate.py``) reaches it.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stamen local CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys([host, "127.0.0.1"]):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = Certificates(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    paths.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    unencrypted = serialization.NoEncryption()  # the SuperLink reads it unattended; its mode 0600 guards it
    pem = server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, unencrypted)
    write_private(paths.server_key, pem)
    return paths


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's authentication key pair (OpenSSH format, NIST P-384, as Flower expects)."""

    private: Path
    public: Path


def make_node_key(folder: Path, name: str) -> NodeKey:
    """A fresh EC key pair ``<name>`` / ``<name>.pub`` in ``folder`` (what ``ssh-keygen -t ecdsa -b 384`` makes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    paths = NodeKey(folder / name, folder / f"{name}.pub")
    unencrypted = serialization.NoEncryption()  # flower-supernode reads it unattended; its mode 0600 guards it
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, unencrypted)
    write_private(paths.private, pem)
    paths.public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return paths


# ------------------------------------------------------------------ configuration text

TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _control(char: str) -> bool:
    """Whether TOML forbids ``char`` unescaped in a string (U+0000-U+001F but tab, and U+007F)."""
    return (ord(char) < 0x20 and char != "\t") or ord(char) == 0x7F


def toml_string(text: str) -> str:
    r"""``text`` as a TOML basic string (``"..."``), every character escaped that TOML asks to be.

    A path holding ``'``, ``"`` or ``\`` written between quotes as it is would end the
    string early or start an escape, and ``flwr`` would refuse the whole config file.
    """
    escaped = (TOML_ESCAPES.get(char) or (f"\\u{ord(char):04x}" if _control(char) else char) for char in text)
    return '"' + "".join(escaped) + '"'


def option_string(text: str) -> str:
    """``text`` as a string value in Flower's ``key=value`` options (``--node-config``, ``--run-config``).

    Flower finds each value with a pattern that ends a quoted value at its first quote
    (``flwr/common/config.py``, ``parse_config_args``) and then reads it as TOML: a literal
    string ``'...'`` (taken as it is) where ``text`` has no ``'``, else a basic string
    where it has no ``"``.

    Raises
    ------
    ValueError
        For text holding both quotes, which that syntax cannot carry.

    """
    if "'" not in text and not any(_control(char) for char in text):
        return f"'{text}'"
    if '"' not in text:
        return toml_string(text)
    raise ValueError(f"{text!r} holds both ' and \", which Flower's key=value options cannot carry; rename it")


def tls_problem(*, tls: bool, node_auth: bool, lan_host: str | None) -> str | None:
    """Why these options cannot run without TLS (naming the flags and the fix), or None."""
    if tls:
        return None
    wanted = [flag for flag, on in (("--auth", node_auth), ("--lan-host", lan_host)) if on]
    return "; ".join(TLS_NEEDED[flag] for flag in wanted) + "; add --tls" if wanted else None


# ------------------------------------------------------------------ processes


@dataclass
class Started:
    """A process this deployment started: its command, log file and handle."""

    name: str
    command: list[str]
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the process group (the SuperNode's ClientApp and the SuperLink's ServerApp with it)."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass


def listener_of(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a TCP socket listening on ``port``; None where ``/proc`` cannot tell.

    Something answering on the port is not enough: when another process took the port,
    a connection succeeds while the process started for it is about to exit.
    """
    listening = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.exists():
            continue
        for row in table.read_text().splitlines()[1:]:
            fields = row.split()  # sl, local address:port (hex), remote, state (0A: listen), ..., inode
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                listening.add(f"socket:[{fields[9]}]")
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # no /proc (macOS) or not ours to read
        return None
    for descriptor in descriptors:
        try:
            if os.readlink(descriptor) in listening:
                return True
        except OSError:  # closed while we looked
            continue
    return False


def _wait_for_port(port: int, process: subprocess.Popen, log_path: Path, timeout_s: float = 60, *,
                   host: str = "127.0.0.1") -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before listening; log:\n{_tail(log_path)}")
        owned = listener_of(process.pid, port)
        if owned is None:
            with socket.socket() as sock:
                owned = sock.connect_ex((host, port)) == 0
        if owned:
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s; log:\n{_tail(log_path)}")


def _runtime_port(command: Sequence[str]) -> int | None:
    """The ``--port`` a command names (a plain SuperNode's Runtime API), or None."""
    return int(command[command.index("--port") + 1]) if "--port" in command else None


def _listens(started: Started, port: int, timeout_s: float = 60, *, host: str = "127.0.0.1") -> bool:
    """Wait until ``port`` listens; False when the process exited because another process holds the port.

    ``free_port`` only says that a port was free when it looked: on a busy machine another
    process may bind it before the SuperLink or SuperNode does, which then exits at once.
    A SuperNode lost that way would leave the ServerApp waiting for ``min-available-clients``.
    """
    try:
        _wait_for_port(port, started.process, started.log_path, timeout_s, host=host)
    except RuntimeError:
        if PORT_IN_USE in _tail(started.log_path).lower():
            return False
        raise
    return True


def group_processes(groups: list[int]) -> list[int]:
    """Pids of every process, zombies aside, in the process groups ``groups``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.append(int(stat.parent.name))
    return found


def live_processes(groups: list[int]) -> list[str]:
    """``pid command`` of every process, zombies aside, in the process groups ``groups``."""
    found = []
    for pid in group_processes(groups):
        try:
            found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r}")
        except OSError:  # it ended while we looked
            continue
    return found


def _url_host(host: str) -> str:
    """``host`` as it goes before ``:port`` (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


class LocalDeployment:
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1; a context manager that stops them all.

    The SuperLink always listens on 127.0.0.1: flwr 1.42 serves its Control API (runs,
    node registration) on the same listener as the Fleet API, without credentials
    (docs/deployment.md#on-a-lan-with-edge-devices). With ``lan_host`` the devices reach the
    Fleet API through the Fleet gate (``app/local/fleet_gate.py``) on that address instead.

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
        Serve the SuperLink over TLS with a freshly made CA and server certificate.
    node_auth
        Start the SuperLink with ``--enable-supernode-auth``, give every SuperNode a
        key pair and register its public key before the node starts. Needs ``tls``.
    lan_host
        Start the Fleet gate on this address (the LAN recipe of docs/deployment.md, the
        server's LAN address there; 127.0.0.2 on one machine) and have every SuperNode dial
        it; the connection in ``flwr-home`` stays on the SuperLink's 127.0.0.1. Needs ``tls``.
    workdir
        Holds ``flwr-home``, certificates, keys, the SuperLink database and logs; a
        fresh temporary folder (deleted on exit) by default.
    warm
        Start each SuperNode as a warm device (``python -m app.device``: the SuperNode
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
    ) -> None:
        # every refusal comes before the temporary workdir below: a refused deployment leaves nothing behind
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        if node_data is not None and len(node_data) != num_nodes:
            raise ValueError(f"node_data names {len(node_data)} folders for {num_nodes} nodes")
        if problem := tls_problem(tls=tls, node_auth=node_auth, lan_host=lan_host):
            raise ValueError(problem)
        self.node_data = [Path(folder).resolve() for folder in node_data] if node_data else None
        self.numbered = numbered
        for folder in self.node_data or []:
            option_string(str(folder))  # a folder Flower's --node-config cannot name is refused now
        self.app_dir = Path(app_dir).resolve()
        self.num_nodes, self.tls, self.node_auth, self.warm = num_nodes, tls, node_auth, warm
        self.lan_host = lan_host
        self.devices = {int(k): list(v) for k, v in (devices or {}).items()}
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="stamen-deploy-")
        self.workdir = Path(workdir or self._tmp.name).resolve()
        self.home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(self.home)}
        self.certificates: Certificates | None = None
        self.superlink: Started | None = None
        self.gate: Started | None = None
        self.gate_port: int | None = None
        self.nodes: dict[int, Started] = {}
        self.extra_nodes: list[Started] = []

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

    def _security(self) -> list[str]:
        return ["--insecure"] if not self.tls else []

    def start(self) -> None:
        """Start the SuperLink, register the connection (and node keys), then start every SuperNode."""
        for folder in (self.home, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self.certificates = make_certificates(self.workdir / "certificates", host=self.lan_host or "127.0.0.1")
        self.superlink, self.port = self._start_server("superlink", self._superlink_command, self.port)
        self.address = f"127.0.0.1:{self.port}"
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
        return f"{_url_host(self.lan_host)}:{self.gate_port}" if self.lan_host else self.address

    def _start_server(self, name: str, command: Callable[[int], list[str]], port: int, *, host: str = "127.0.0.1",
                      env: dict[str, str] | None = None) -> tuple[Started, int]:  # fmt: skip
        """Start ``command(port)`` until it holds its port (a fresh one after each loss); the process and port."""
        for attempt in range(PORT_TRIES):
            started = self._spawn(name, command(port), env=env)
            if _listens(started, port, host=host):
                return started, port
            self._set_aside(started, attempt)
            port = free_port()
        raise RuntimeError(f"the {name} found its port taken {PORT_TRIES} times; logs in {self.logs}")

    def _gate_command(self, port: int) -> list[str]:
        certs = self.certificates
        return [sys.executable, "-m", f"{PACKAGE}.fleet_gate", "--listen", f"{_url_host(self.lan_host)}:{port}",
                "--superlink", self.address, "--ssl-certfile", str(certs.server_cert), "--ssl-keyfile",
                str(certs.server_key), "--ssl-ca-certfile", str(certs.ca_cert)]  # fmt: skip

    def _superlink_command(self, port: int) -> list[str]:
        # 127.0.0.1 only, whatever else: this listener also serves the Control API, which asks for no credential
        link = ["flower-superlink", *self._security(), "--host", "127.0.0.1", "--port", str(port), "--database",
                str(self.workdir / "superlink.db"), "--disable-runtime-dependency-installation"]  # fmt: skip
        if self.certificates:
            certs = self.certificates
            link += ["--ssl-certfile", str(certs.server_cert), "--ssl-keyfile", str(certs.server_key),
                     "--ssl-ca-certfile", str(certs.ca_cert)]  # fmt: skip
        if self.node_auth:
            link.append("--enable-supernode-auth")
        return link

    def _await_node(self, partition: int) -> None:
        """Wait until the SuperNode of ``partition`` serves its Runtime API; restart it on a fresh port if it lost it.

        Only a plain ``flower-supernode`` is checked: a warm or installed device picks its port itself.
        """
        for attempt in range(PORT_TRIES):
            node = self.nodes[partition]
            port = _runtime_port(node.command)
            if port is None or _listens(node, port):
                return
            self._set_aside(node, attempt)
            self._spawn_node(partition, node.name, node.command[: node.command.index("--port")]
                             + ["--port", str(free_port())])  # fmt: skip
        raise RuntimeError(f"SuperNode {partition} found its port taken {PORT_TRIES} times; logs in {self.logs}")

    def _set_aside(self, started: Started, attempt: int) -> None:
        """Keep the log of a start that lost its port beside the next one's (``<name>.log.port-taken-<n>``)."""
        started.process.wait()
        started.log_path.rename(started.log_path.with_name(f"{started.log_path.name}.port-taken-{attempt}"))

    def _write_connection(self) -> None:
        """``flwr``'s connection to the SuperLink (never the Fleet gate: it refuses the Control API)."""
        lines = ["[superlink]", f"default = {toml_string(CONNECTION)}", "", f"[superlink.{CONNECTION}]",
                 f"address = {toml_string(self.address)}"]  # fmt: skip
        if self.certificates:
            lines.append(f"root-certificates = {toml_string(str(self.certificates.ca_cert))}")
        else:
            lines.append("insecure = true")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, command: list[str], *, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> Started:  # fmt: skip
        log_path = self.logs / f"{name}.log"
        handle = log_path.open("ab")
        # A new session per process: stopping its group also stops the ServerApp /
        # ClientApp subprocesses it started.
        process = subprocess.Popen(command, env=env or self.env, cwd=cwd or self.workdir, stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        handle.close()
        return Started(name=name, command=command, log_path=log_path, process=process)

    def node_command(self, partition: int, *, key: NodeKey | None = None) -> list[str]:
        """The ``flower-supernode`` command for partition ``partition``."""
        if self.node_data is not None and partition < len(self.node_data):
            node_config = f"data-dir={option_string(str(self.node_data[partition]))}"
            if self.numbered:
                node_config += f" partition-id={partition} num-partitions={self.num_nodes}"
        else:
            node_config = f"partition-id={partition} num-partitions={self.num_nodes}"
        options = [*self._security(), "--superlink", self.fleet_address, "--node-config", node_config]
        if self.certificates:
            options += ["--root-certificates", str(self.certificates.ca_cert)]
        if key:
            options += ["--auth-supernode-private-key", str(key.private)]
        if partition in self.devices:  # a device of its own: it picks its Runtime API port itself
            return [*self.devices[partition], *options]
        if self.warm:  # the device picks the port of its SuperNode's Runtime API itself
            return [sys.executable, "-m", "app.device", *options]
        return ["flower-supernode", *options, "--port", str(free_port())]

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
        # a warm device runs stamen's app.device from the app's folder (stamen's packages are not installed)
        env = {**self.env, "PYTHONPATH": str(self.app_dir)} if self.warm else None
        cwd = None
        if partition in self.devices:  # an installed device: no clone on its path, an empty folder to run in
            env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
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
        self.nodes[partition].stop(signal.SIGKILL)

    def _started(self) -> list[Started]:
        """Every process this deployment started: the SuperLink, the Fleet gate, the SuperNodes."""
        return [item for item in (self.superlink, self.gate, *self.nodes.values(), *self.extra_nodes) if item]

    def process_groups(self) -> list[int]:
        """The process group of every process this deployment started (each leads its own)."""
        return [item.process.pid for item in self._started()]

    def close(self) -> None:
        """Stop every process this deployment started (SIGTERM, then SIGKILL), then delete a temporary workdir."""
        started = self._started()[::-1]  # the SuperNodes first, the SuperLink last
        for item in started:
            item.stop(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for item in started:
            try:
                item.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # A SuperLink stopped while runs are pending may still be starting a ServerApp in
        # its group: SIGKILL the groups until nothing lives in them.
        groups, deadline = self.process_groups(), time.monotonic() + 10
        while live_processes(groups) and time.monotonic() < deadline:
            for group in groups:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        if self._tmp:
            self._tmp.cleanup()

    # --------------------------------------------------------------------- runs

    def flwr(self, args: list[str], timeout: float = 120) -> dict:
        """``flwr <args> --format json`` against this deployment, parsed."""
        out = subprocess.run(["flwr", *args, "--format", "json"], env=self.env, cwd=self.workdir,
                             capture_output=True, text=True, timeout=timeout)  # fmt: skip
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError as err:
            raise RuntimeError(f"`flwr {' '.join(args)}` printed no JSON:\n{out.stdout}\n{out.stderr}") from err

    def status(self, run_id: str) -> str:
        """The run's status as ``flwr ls`` reports it (``finished:completed`` when it succeeded)."""
        return self.flwr(["ls", "--run-id", run_id, CONNECTION])["runs"][0]["status"]

    def submit(self, run_config: dict[str, object] | str, *, app_dir: Path | None = None) -> str:
        """Submit the app (``app_dir``, default the deployment's) with ``run_config``; returns the run id.

        ``run_config`` is a dict, or ``--run-config`` text.
        """
        text = run_config if isinstance(run_config, str) else run_config_text(run_config)
        reply = self.flwr(["run", str(app_dir or self.app_dir), CONNECTION, "--run-config", text])
        if not reply.get("success"):
            raise RuntimeError(f"flwr run refused the submission: {reply}")
        return str(reply["run-id"])

    def wait(self, run_id: str, *, timeout_s: float = 600) -> RunOutcome:
        """Follow the run's log until it ends (or ``timeout_s``), then read its final status from ``flwr ls``."""
        started = time.perf_counter()
        # `flwr log --stream` blocks until the run ends: one idle process instead of a
        # `flwr ls` loop, each call of which costs a second of CPU to import flwr.
        try:
            log = subprocess.run(["flwr", "log", run_id, CONNECTION, "--stream"], env=self.env, cwd=self.workdir,
                                 capture_output=True, text=True, timeout=timeout_s).stdout  # fmt: skip
        except subprocess.TimeoutExpired as err:
            log = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        return RunOutcome(run_id=run_id, status=self.status(run_id), wall_seconds=time.perf_counter() - started,
                          log=log)  # fmt: skip

    def wait_all(self, run_ids: list[str], *, timeout_s: float = 600, poll_s: float = 10.0) -> dict[str, str]:
        """Wait until every run in ``run_ids`` has a final status; returns run id -> status.

        One ``flwr ls`` every ``poll_s`` seconds covers all runs (each call costs about
        a CPU-second, which the runs themselves need on a small machine).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = {str(r["run-id"]): r["status"] for r in self.flwr(["ls", CONNECTION])["runs"]}
            mine = {run_id: statuses.get(run_id, "unknown") for run_id in run_ids}
            if all(s.startswith("finished") for s in mine.values()) or time.monotonic() > deadline:
                return mine
            if self.superlink.process.poll() is not None:
                raise RuntimeError(f"the SuperLink exited; log:\n{_tail(self.superlink.log_path)}")
            time.sleep(poll_s)

    def run(self, run_config: dict[str, object] | str, *, timeout_s: float = 600) -> RunOutcome:
        """Submit, and wait for the run's final status and log."""
        return self.wait(self.submit(run_config), timeout_s=timeout_s)

    def report(self, chars: int = 1500) -> str:
        """Each process this deployment started: running or its exit code, and the end of its log.

        For a failure message: a run stuck before round 1 usually means a SuperNode that
        never connected, which only its own log shows.
        """
        parts = []
        for item in self._started():
            code = item.process.poll()
            state = "running" if code is None else f"exited {code}"
            parts.append(f"--- {item.name} ({state}), {item.log_path}:\n{_tail(item.log_path, chars)}")
        return "\n".join(parts)

    def commands(self) -> list[str]:
        """The commands this deployment ran, for copying into a real one."""
        return [shlex.join(item.command) for item in [self.superlink, self.gate, *self.nodes.values()] if item]


def deployment_run_config(text: str, *, results_dir: Path) -> dict[str, object]:
    """The run config the helper submits: ``results-dir`` by default, the user's ``--run-config`` keys over it.

    Flower refuses a key given twice in one ``--run-config`` string ("The provided
    configuration string is in an invalid format"), so the helper's default cannot simply
    be prepended; it is merged, and the result is checked by stamen's own parser before
    any process starts.

    Raises
    ------
    ConfigError
        For text that is not ``key=value ...`` or a key or value stamen refuses.

    """
    user = run_config_from_text(text)
    # a relative results-dir would land in the SuperLink's working directory, not where the user ran this
    config = {"results-dir": str(results_dir), **user}
    parse_settings(config)
    return config


def main(argv: list[str] | None = None) -> int:
    """Start a local deployment, run the app once (or serve until Ctrl-C), stop everything."""
    parser = argparse.ArgumentParser(prog="python -m app.local.deployment", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2, help="SuperNodes to start (default 2)")
    parser.add_argument("--node-data", type=Path, nargs="+", metavar="FOLDER",
                        help="each SuperNode's own data folder (one node per folder; overrides --nodes)")  # fmt: skip
    parser.add_argument("--tls", action="store_true", help="serve over TLS with a generated CA")
    parser.add_argument("--auth", action="store_true",
                        help="enable SuperNode authentication (registers each key); needs --tls")  # fmt: skip
    parser.add_argument("--lan-host", metavar="ADDRESS",
                        help="the LAN recipe: SuperNodes dial the Fleet gate on ADDRESS (e.g. 127.0.0.2), the "
                             "SuperLink and its Control API stay on 127.0.0.1; needs --tls")  # fmt: skip
    parser.add_argument("--run-config", default="", help='overrides, as for flwr run: "num-server-rounds=3 ..."')
    parser.add_argument("--workdir", type=Path, help="keep certificates, keys, logs and results here")
    parser.add_argument("--warm", action="store_true",
                        help="start each SuperNode as a warm device (python -m app.device): torch imported once")
    parser.add_argument("--serve", action="store_true", help="keep the deployment up until Ctrl-C instead of running")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the run (default 3600)")
    args = parser.parse_args(argv)
    if problem := tls_problem(tls=args.tls, node_auth=args.auth, lan_host=args.lan_host):
        parser.error(problem)  # exits 2 before any file or process exists
    try:
        config = deployment_run_config(args.run_config, results_dir=Path.cwd() / "results")
    except ConfigError as err:
        print(f"error: {err}")
        return 2
    app_dir = Path(__file__).resolve().parents[2]
    num_nodes = len(args.node_data) if args.node_data else args.nodes
    with LocalDeployment(app_dir=app_dir, num_nodes=num_nodes, tls=args.tls, node_auth=args.auth,
                         workdir=args.workdir, node_data=args.node_data, warm=args.warm,
                         lan_host=args.lan_host) as deployment:  # fmt: skip
        print("started:\n  " + "\n  ".join(deployment.commands()))
        print(f"FLWR_HOME={deployment.home} (connection {CONNECTION!r}); logs in {deployment.logs}")
        if args.serve:
            print(f"submit with:  FLWR_HOME={deployment.home} flwr run {app_dir} {CONNECTION} --stream\nCtrl-C stops.")
            try:
                signal.pause()
            except KeyboardInterrupt:
                return 0
        outcome = deployment.run(config, timeout_s=args.timeout)
        print(outcome.log[-3000:])
        print(f"run {outcome.run_id}: {outcome.status} in {outcome.wall_seconds:.0f} s")
        return 0 if outcome.status == FINISHED_OK else 1


if __name__ == "__main__":
    sys.exit(main())
