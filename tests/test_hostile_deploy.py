"""The LAN recipe of docs/deployment.md against a host that holds only the CA certificate.

flwr 1.42 serves the SuperLink's Fleet, Control and Runtime APIs on one listener, and the
Control API asks for no credential without Flower's (enterprise) account authentication. With
the SuperLink on the LAN address, as the guide used to say, a host holding only ``ca.crt``
registered its own node key, listed runs and nodes and submitted a run (measured, see the
guide). The recipe keeps the SuperLink on 127.0.0.1 and lets the LAN reach the Fleet API
alone, through ``app/local/fleet_gate.py``; these tests hold it to that, and hold ``app/local/deployment.py``
to refusing ``--auth`` without ``--tls`` up front, to private keys that are never readable by
others, and to configuration text that carries any path.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from flwr.common.config import parse_config_args
from helpers import can_bind, through_gate

from app.local.credentials import make_certificates, make_node_key
from app.local.deployment import CONNECTION, LocalDeployment
from app.local.fleet_gate import fleet_routes
from app.local.flower_text import options_text, toml_string
from app.local.flwr_cli import FLOWER_ENV

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ODD = "it's \"odd\" \\ here"  # a single quote, double quotes and a backslash
GATE_REFUSES = "stamen fleet gate: POST {} is not part of Flower's Fleet API"


# ------------------------------------------------------------------ app/local/deployment.py


@pytest.mark.parametrize(("flags", "message"), [
    (["--auth"], "error: --auth needs --tls: flower-superlink refuses --enable-supernode-auth without TLS "
                 "certificates; add --tls"),
    (["--lan-host", "127.0.0.2"], "error: --lan-host needs --tls: the Fleet gate serves the SuperLink's TLS "
                                  "certificate to the devices; add --tls; --lan-host needs --auth: the Fleet gate "
                                  "passes no node registration, so only devices whose keys are registered on the "
                                  "server may join; add --auth"),
    (["--lan-host", "127.0.0.2", "--auth"], "error: --auth needs --tls: flower-superlink refuses "
                                            "--enable-supernode-auth without TLS certificates; --lan-host needs "
                                            "--tls: the Fleet gate serves the SuperLink's TLS certificate to the "
                                            "devices; add --tls"),
    (["--lan-host", "127.0.0.2", "--tls"], "error: --lan-host needs --auth: the Fleet gate passes no node "
                                           "registration, so only devices whose keys are registered on the server "
                                           "may join; add --auth"),
])  # fmt: skip
def test_auth_or_the_lan_recipe_without_tls_is_refused_before_anything_exists(tmp_path, flags, message):
    workdir = tmp_path / "deployment"
    out = subprocess.run([sys.executable, "-m", "app.local.deployment", *flags, "--workdir", str(workdir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines()[-1] == f"python -m app.local.deployment: {message}"
    assert not workdir.exists()  # no certificate, key, log or process was made


@pytest.mark.parametrize("options", [{"node_auth": True}, {"lan_host": "127.0.0.2"}])
def test_a_deployment_asked_for_auth_or_the_lan_recipe_without_tls_refuses_to_be_made(tmp_path, options):
    with pytest.raises(ValueError, match=r"needs --tls: .*; add --tls"):
        LocalDeployment(app_dir=REPO, num_nodes=1, workdir=tmp_path / "deployment", **options)


def test_private_keys_are_owner_only_from_creation(tmp_path, monkeypatch):
    """With chmod out of the way (a process killed right after writing), each private key is still 0600."""
    monkeypatch.setattr(Path, "chmod", lambda self, mode, **kwargs: None)
    umask = os.umask(0o022)
    try:
        (tmp_path / "keys").mkdir()
        stale = tmp_path / "keys" / "node"  # a key left by an earlier deployment in a kept --workdir
        stale.write_text("old")
        os.chmod(stale, 0o644)
        certificates = make_certificates(tmp_path / "certs")
        key = make_node_key(tmp_path / "keys", "node")
    finally:
        os.umask(umask)
    for private in (certificates.server_key, key.private):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    assert key.private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["node", "node.pub"]  # no spare file left


def test_the_connection_file_carries_a_path_with_quotes_and_a_backslash(tmp_path):
    workdir = tmp_path / ODD
    deployment = LocalDeployment(app_dir=REPO, num_nodes=1, tls=True, workdir=workdir)
    deployment.home.mkdir(parents=True)
    deployment.certificates = make_certificates(workdir / "certificates")
    deployment._write_connection()
    config = tomllib.loads((deployment.home / "config.toml").read_text())
    assert config["superlink"]["default"] == CONNECTION
    ca_cert = str(workdir / "certificates" / "ca.crt")
    assert config["superlink"][CONNECTION] == {"address": deployment.address, "root-certificates": ca_cert}


@pytest.mark.parametrize("text", [ODD, "tab\tnew\nline\x7f\x01"])
def test_toml_strings_round_trip(text):
    assert tomllib.loads(f"key = {toml_string(text)}")["key"] == text


# every text a run or node config may hold: both quotes, backslashes, escapes written out, newlines and other
# controls, '=' and spaces (a second key in disguise), a value ending like a TOML file name, and none at all
OPTION_TEXTS = [ODD, "x' strategy='fedprox", "/data/O'Brien", 'a" lr="9', "back\\slash \\u0022 \\n", "tab\tnew\nline\r",
                "\x00\x1b\x7f", "k=v w=x", "  spaced  ", "run.toml", "é ☃", ""]  # fmt: skip


@pytest.mark.parametrize("text", OPTION_TEXTS)
def test_every_text_reaches_flower_through_its_own_parser_as_it_was(text):
    config = {"run-name": text, "lr": 0.1, "local-steps": 4, "download": False, "data-dir": text, "seed": -1}
    assert parse_config_args([options_text(config)]) == config
    assert parse_config_args([options_text({"data-dir": text})]) == {"data-dir": text}  # last, and alone


def test_a_config_value_flower_cannot_hold_is_refused_naming_its_key():
    with pytest.raises(TypeError, match="config key 'classes': \\[1, 2\\] is not a bool, int, float or str"):
        options_text({"lr": 0.1, "classes": [1, 2]})


def test_a_node_folder_reaches_flower_as_it_is(tmp_path):
    for name in ("it's mine", 'a "quoted" one', "back\\slash", ODD):
        deployment = LocalDeployment(app_dir=REPO, num_nodes=1, node_data=[tmp_path / name], workdir=tmp_path / "w",
                                     numbered=True, slowed={0: 5})  # fmt: skip
        node_config = deployment.node_command(0)[deployment.node_command(0).index("--node-config") + 1]
        assert parse_config_args([node_config]) == {"data-dir": str(tmp_path / name), "partition-id": 0,
                                                    "num-partitions": 1, "emulated-slowdown": 5.0}  # fmt: skip


# ------------------------------------------------------------------ app/local/fleet_gate.py, without processes


@pytest.fixture(scope="module")
def ca_cert(tmp_path_factory) -> Path:
    return make_certificates(tmp_path_factory.mktemp("gate")).ca_cert


@pytest.mark.parametrize("path", ["/v1/control/start-run", "/v1/control/register-node", "/v1/control/list-runs",
                                  "/v1/runtime/acquire-task", "/docs", "/health", "/v1/fleet/",
                                  "/v1/fleet/get-run/../../control/start-run", "/V1/FLEET/GET-RUN"])  # fmt: skip
def test_the_gate_refuses_anything_but_the_fleet_api_without_reaching_the_superlink(ca_cert, path):
    response, reached = through_gate(ca_cert, "POST", path, content=b"x")
    assert response.status_code == 403 and not reached
    assert response.json()["detail"].startswith("stamen fleet gate: POST /")


def test_the_gate_refuses_another_method_on_a_fleet_path(ca_cert):
    response, reached = through_gate(ca_cert, "GET", "/v1/fleet/get-run")
    assert response.status_code == 403 and not reached


def test_the_gate_passes_each_fleet_route_with_its_body_and_signature_unchanged(ca_cert):
    routes = fleet_routes()
    assert ("POST", "/v1/fleet/activate-node") in routes and ("POST", "/v1/fleet/pull-messages") in routes
    assert not [path for _, path in routes if not path.startswith("/v1/fleet/")]
    for method, path in sorted(routes):
        headers = {"flwr-public-key": "cHVi", "flwr-signature": "c2ln", "flwr-timestamp": "now"}
        response, reached = through_gate(ca_cert, method, path + "?ignored=1", content=b"\x00protobuf",
                                          headers=headers)  # fmt: skip
        assert response.status_code == 200 and response.content == b"reply:\x00protobuf"
        assert response.headers["x-from"] == "superlink"
        (request,) = reached
        assert (request.method, request.url.path, request.url.query) == (method, path, b"")
        assert {k: request.headers[k] for k in headers} == headers


# ------------------------------------------------------------------ the recipe, run


@pytest.mark.e2e
@pytest.mark.skipif(not can_bind("127.0.0.2"), reason="127.0.0.2 is not a local address here (Linux has it)")
def test_an_outsider_with_only_the_ca_certificate_can_neither_enrol_nor_submit(tmp_path):
    """The guide's recipe, with 127.0.0.2 as the LAN: the outsider dials the only address the LAN reaches."""
    app = _tiny_app(tmp_path / "app")
    with LocalDeployment(app_dir=app, num_nodes=1, tls=True, node_auth=True, lan_host="127.0.0.2",
                         workdir=tmp_path / "deployment") as deployment:  # fmt: skip
        assert deployment.superlink.command[deployment.superlink.command.index("--host") + 1] == "127.0.0.1"
        intruder_node = deployment.start_node(0, register=False, name="intruder-node")  # a device nobody enrolled
        outsider = _outsider_home(tmp_path / "outsider", deployment)
        register = _flwr(outsider, "supernode", "register", str(outsider / "intruder.pub"), "lan")
        submit = _flwr(outsider, "run", str(app), "lan")
        nodes = _online_nodes(deployment)
        operator_run = deployment.flwr(["run", str(app), CONNECTION])
        runs = deployment.flwr(["ls", CONNECTION])["runs"]
        intruder_node.process.wait(timeout=60)
        report = deployment.report()
    assert register.returncode == 1 and GATE_REFUSES.format("/v1/control/register-node") in _unboxed(register)
    assert submit.returncode == 1 and GATE_REFUSES.format("/v1/control/start-run") in _unboxed(submit)
    assert len(nodes) == 1, report  # the enrolled SuperNode, through the gate; not the intruder's key
    assert operator_run["success"], operator_run
    assert [str(run["run-id"]) for run in runs] == [operator_run["run-id"]]  # the outsider's run never existed
    assert intruder_node.process.returncode != 0, report
    assert "Failed to activate SuperNode" in intruder_node.log_path.read_text(), report


def _tiny_app(folder: Path) -> Path:
    """A Flower app that builds in a moment (what is submitted does not matter here)."""
    (folder / "tiny").mkdir(parents=True)
    (folder / "tiny" / "__init__.py").write_text("")
    (folder / "tiny" / "apps.py").write_text("from flwr.clientapp import ClientApp\nfrom flwr.serverapp import "
                                             "ServerApp\n\nserver = ServerApp()\nclient = ClientApp()\n")  # fmt: skip
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "tiny"\nversion = "0.1.0"\ndescription = "x"\nlicense = "Apache-2.0"\ndependencies = []\n\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["tiny"]\n\n[tool.flwr.app]\npublisher = "outsider"\n\n'
        '[tool.flwr.app.components]\nserverapp = "tiny.apps:server"\nclientapp = "tiny.apps:client"\n\n'
        "[tool.flwr.app.config]\n"
    )
    return folder


def _outsider_home(home: Path, deployment: LocalDeployment) -> Path:
    """A FLWR_HOME holding only the CA certificate, a key of its own and a connection to the LAN address."""
    home.mkdir()
    shutil.copy(deployment.certificates.ca_cert, home / "ca.crt")
    (home / "config.toml").write_text(f'[superlink]\ndefault = "lan"\n\n[superlink.lan]\n'
                                      f"address = {toml_string(deployment.fleet_address)}\n"
                                      f"root-certificates = {toml_string(str(home / 'ca.crt'))}\n")  # fmt: skip
    make_node_key(home, "intruder")
    return home


def _flwr(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(home)}
    return subprocess.run(["flwr", *args], env=env, cwd=home, capture_output=True, text=True, timeout=120)


def _unboxed(out: subprocess.CompletedProcess) -> str:
    """What ``flwr`` printed, its error box's borders and line breaks taken out."""
    text = out.stdout + out.stderr
    return " ".join(line.strip(" │╭╮╰╯─") for line in text.splitlines() if line.strip(" │╭╮╰╯─"))


def _online_nodes(deployment: LocalDeployment, timeout_s: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = deployment.flwr(["supernode", "ls", CONNECTION])["nodes"]
        online = [node for node in nodes if node.get("status") == "online"]
        if online or time.monotonic() > deadline:
            return nodes if online else []
        time.sleep(1)
