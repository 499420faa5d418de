"""The command lines of a local deployment, as a person would type them for a deployment of their own.

:class:`~app.local.deployment.LocalDeployment` starts exactly these: the SuperLink, the
Fleet gate of the LAN recipe, each SuperNode (or warm device), and writes ``flwr``'s
connection to the SuperLink into ``config.toml``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.local.credentials import Certificates, NodeKey
from app.local.flower_text import options_text, toml_string

TLS_NEEDED = {
    "--auth": "--auth needs --tls: flower-superlink refuses --enable-supernode-auth without TLS certificates",
    "--lan-host": "--lan-host needs --tls: the Fleet gate serves the SuperLink's TLS certificate to the devices",
}


AUTH_NEEDED = ("--lan-host needs --auth: the Fleet gate passes no node registration, so only devices whose keys are "
               "registered on the server may join; add --auth")  # fmt: skip


def deployment_problem(*, tls: bool, node_auth: bool, lan_host: str | None, cert_days: int = 1) -> str | None:
    """Why these options cannot make a deployment (naming the flags and the fix), or None."""
    wanted = [] if tls else [flag for flag, on in (("--auth", node_auth), ("--lan-host", lan_host)) if on]
    problems = ["; ".join(TLS_NEEDED[flag] for flag in wanted) + "; add --tls"] if wanted else []
    if lan_host and not node_auth:
        problems.append(AUTH_NEEDED)
    if cert_days < 1:
        problems.append(f"--cert-days must be a whole number of days >= 1, got {cert_days}")
    return "; ".join(problems) or None


def url_host(host: str) -> str:
    """``host`` as it goes before ``:port`` (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def _server_tls(certificates: Certificates) -> list[str]:
    return ["--ssl-certfile", str(certificates.server_cert), "--ssl-keyfile", str(certificates.server_key),
            "--ssl-ca-certfile", str(certificates.ca_cert)]  # fmt: skip


def superlink_command(*, port: int, database: Path, tls: bool, certificates: Certificates | None,
                      node_auth: bool) -> list[str]:  # fmt: skip
    """``flower-superlink`` on 127.0.0.1:``port``, with TLS ``certificates`` and node authentication if asked."""
    # 127.0.0.1 only, whatever else: this listener also serves the Control API, which asks for no credential
    link = ["flower-superlink", *([] if tls else ["--insecure"]), "--host", "127.0.0.1", "--port", str(port),
            "--database", str(database), "--disable-runtime-dependency-installation"]  # fmt: skip
    if certificates:
        link += _server_tls(certificates)
    if node_auth:
        link.append("--enable-supernode-auth")
    return link


def gate_command(*, package: str, lan_host: str, port: int, superlink: str, certificates: Certificates) -> list[str]:
    """The Fleet gate (``python -m <package>.fleet_gate``) on ``lan_host``:``port``, in front of ``superlink``."""
    return [sys.executable, "-m", f"{package}.fleet_gate", "--listen", f"{url_host(lan_host)}:{port}",
            "--superlink", superlink, *_server_tls(certificates)]  # fmt: skip


def node_config(partition: int, num_nodes: int, *, data_dir: Path | None = None, numbered: bool = False,
                slowdown: float = 1.0) -> str:  # fmt: skip
    """A SuperNode's ``--node-config``: its partition, or its own data folder (and, ``numbered``, its partition).

    ``slowdown`` > 1 adds ``emulated-slowdown`` (an emulated slower device, docs/fleets.md).
    """
    config: dict[str, object] = {} if data_dir is None else {"data-dir": str(data_dir)}
    if data_dir is None or numbered:
        config |= {"partition-id": partition, "num-partitions": num_nodes}
    if slowdown != 1.0:
        config["emulated-slowdown"] = float(slowdown)
    return options_text(config)


def supernode_options(*, superlink: str, node_config: str, tls: bool, certificates: Certificates | None,
                      key: NodeKey | None) -> list[str]:  # fmt: skip
    """The options every kind of SuperNode (plain, warm device, installed device) gets."""
    options = [*([] if tls else ["--insecure"]), "--superlink", superlink, "--node-config", node_config]
    if certificates:
        options += ["--root-certificates", str(certificates.ca_cert)]
    if key:
        options += ["--auth-supernode-private-key", str(key.private)]
    return options


def connection_file(connection: str, *, address: str, certificates: Certificates | None) -> str:
    """``config.toml`` text naming ``connection`` (``flwr``'s default) to the SuperLink at ``address``."""
    lines = ["[superlink]", f"default = {toml_string(connection)}", "", f"[superlink.{connection}]",
             f"address = {toml_string(address)}"]  # fmt: skip
    if certificates:
        lines.append(f"root-certificates = {toml_string(str(certificates.ca_cert))}")
    else:
        lines.append("insecure = true")
    return "\n".join(lines) + "\n"
