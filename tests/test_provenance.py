"""Which code ran: the code fingerprint, the refusal of a run that mixes two stamens, and provenance in every result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest
from conftest import REPO, FakeFleet, FakeNode, settings, started_by_this_session
from helpers import PACKAGES, change_a_function, copy_of_the_code

import app.workdir as workdir
from app.config import ConfigError, check_on_server
from app.results.provenance import data_provenance, run_provenance, source_checkout
from app.results.writer import ResultWriter, run_directory
from clients.fedavg import FedAvgClient
from clients.models import build_model
from datasets import load_client_data
from strategies.contracts.code import CODE_FILES, code_fingerprint, code_identity, code_mismatch, folder_fingerprint
from strategies.nodes.directory import NodeDirectory
from strategies.nodes.preflight import MixedCodeError, PreflightError, connected, preflight

ELSEWHERE = {"code-fingerprint": "f" * 64, "code-location": "/elsewhere/stamen"}


# ------------------------------------------------------------------------------------ the code fingerprint


def test_the_fingerprinted_files_are_the_fabs():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert tuple(pyproject["tool"]["flwr"]["app"]["fab-include"]) == CODE_FILES


def test_the_fingerprint_follows_the_files_not_the_folder(tmp_path):
    first, second = copy_of_the_code(tmp_path / "first"), copy_of_the_code(tmp_path / "second")
    assert code_fingerprint(first) == code_fingerprint(second) == code_fingerprint(REPO)
    (second / "app" / "__pycache__").mkdir(exist_ok=True)
    (second / "app" / "__pycache__" / "stray.py").write_text("x = 1\n")  # not code a FAB carries
    folder_fingerprint.cache_clear()
    assert code_fingerprint(second) == code_fingerprint(first)
    change_a_function(second)
    folder_fingerprint.cache_clear()
    assert code_fingerprint(second) != code_fingerprint(first)
    (first / "strategies" / "extra.py").write_text("")  # a new module is new code
    folder_fingerprint.cache_clear()
    assert code_fingerprint(first) != code_fingerprint(REPO)


def test_a_mismatch_names_both_locations_and_an_old_node_is_told_apart():
    server = {"fingerprint": "a" * 64, "location": "/fab/of/this/run"}
    assert code_mismatch({"code-fingerprint": "a" * 64}, **server) is None
    line = code_mismatch(ELSEWHERE, **server)
    assert line == ("the node runs stamen code from /elsewhere/stamen (fingerprint ffffffffffff), but the server runs "
                    "/fab/of/this/run (fingerprint aaaaaaaaaaaa)")  # fmt: skip
    assert "older than the server's (it reports no code fingerprint)" in code_mismatch({}, **server)


# ------------------------------------------------------------------------------ the preflight refuses mixed code


class ReportingNode(FakeNode):
    """A node answering with the properties of a real client, its code identity replaced by ``code``."""

    def __init__(self, cid: str, *, code: dict | None = None, data_dir: str = "", ray_node: str = "ray-1") -> None:
        super().__init__(cid)
        self.code, self.data_dir, self.ray_node = code, data_dir, ray_node

    def get_properties(self, config):
        properties = super().get_properties(config)
        properties.update({"num-partitions": 4, "data-dir": self.data_dir, "ray-node": self.ray_node})
        if self.code is not None:
            properties.update(self.code)
        if self.code == {}:
            del properties["code-fingerprint"], properties["code-location"]
        return properties


def test_a_simulated_node_running_other_code_stops_the_run_naming_both_locations():
    fleet = FakeFleet(ReportingNode("0"), ReportingNode("1", code=ELSEWHERE), ReportingNode("2"))
    with pytest.raises(PreflightError) as raised:
        preflight(NodeDirectory(), fleet, {})
    [line] = raised.value.lines
    assert line.startswith("1 of 3 clients (partition 1): the node runs stamen code from /elsewhere/stamen")
    assert f"but the server runs {REPO} (fingerprint {code_fingerprint()[:12]})" in line
    assert "docs/troubleshooting.md#two-checkouts" in line
    old = FakeFleet(ReportingNode("0", code={}))
    with pytest.raises(PreflightError, match="runs stamen code older than the server's"):
        preflight(NodeDirectory(), old, {})


def test_a_device_running_other_code_is_left_out_and_the_run_goes_on():
    devices = [ReportingNode(cid, ray_node="") for cid in ("0", "1")]  # deployed, serving partitions
    stale = ReportingNode("9", code=ELSEWHERE, data_dir="/data/device-9", ray_node="")
    nodes = NodeDirectory()
    left_out = preflight(nodes, FakeFleet(*devices, stale), {})
    assert isinstance(left_out, PreflightError) and "/elsewhere/stamen" in left_out.lines[0]
    assert "restart its SuperNode" in left_out.lines[0]
    assert set(nodes.excluded) == {"9"} and set(nodes.properties) == {"0", "1"}


def test_without_a_preflight_round_1_finds_mixed_code_and_stops_before_any_training():
    nodes = NodeDirectory()
    assert set(connected(nodes, FakeFleet(ReportingNode("0"), ReportingNode("1")))) == {0, 1}
    with pytest.raises(MixedCodeError, match="^stamen: before round 1: 1 of 1 clients .*/elsewhere/stamen"):
        connected(nodes, FakeFleet(ReportingNode("0"), ReportingNode("1"), ReportingNode("2", code=ELSEWHERE)))
    device = ReportingNode("7", code=ELSEWHERE, ray_node="")  # a deployed node: only it is stale
    assert set(connected(nodes, FakeFleet(ReportingNode("0"), device))) == {0}
    assert "7" in nodes.excluded


def test_a_real_client_reports_the_code_it_imported_and_a_fingerprint_of_its_data():
    run = settings(strategy="fedavg", device="cpu")

    def client(partition: int) -> FedAvgClient:
        data = load_client_data(run.data_spec(10), run.partition_spec(10), partition)
        model = build_model("mlp", input_shape=data.train_x.shape[1:], num_classes=data.num_classes)
        return FedAvgClient(model=model, data=data, settings=run, partition_id=partition, num_partitions=10)

    first, again, other = (client(p).get_properties({}) for p in (3, 3, 4))
    assert {k: first[k] for k in code_identity()} == code_identity()
    assert first["data-fingerprint"] == again["data-fingerprint"] != other["data-fingerprint"]
    nodes = NodeDirectory()
    nodes.admit([("3", first), ("4", other)])
    report = nodes.data_report()
    assert [entry["data-fingerprint"] for entry in report] == [first["data-fingerprint"], other["data-fingerprint"]]
    combined = data_provenance(report)
    assert combined["clients"] == 2 and combined["train-examples"] == first["num-train"] + other["num-train"]
    assert combined["fingerprint"] != data_provenance(report[:1])["fingerprint"]


def test_a_node_answering_through_flower_reports_its_code():
    from app.local.message_grid import NODE_BASE, InProcessGrid
    from strategies.flower.fleet import GridFleet

    # stamen's ClientApp answering the preflight's query message, through Flower's wire encoding
    grid = InProcessGrid(run_config=settings(strategy="fedavg", device="cpu").as_run_config(), num_clients=2)
    [answer] = GridFleet(grid=grid).ask([str(NODE_BASE + 1)], {}, reply_s=30)
    assert answer["code-fingerprint"] == code_fingerprint() and answer["partition-id"] == 1


# ----------------------------------------------------------------------- paths the command alone predicts


def test_relative_server_paths_are_taken_under_the_home_folder_and_absolute_ones_kept(tmp_path):
    home = Path("~/stamen").expanduser()
    assert workdir.resolved("results") == home / "results"
    assert workdir.resolved(str(tmp_path)) == tmp_path
    assert workdir.resolved("~/elsewhere") == Path("~/elsewhere").expanduser()
    assert run_directory("results", "named", "x") == home / "results" / "named"
    with pytest.raises(ConfigError, match=r"'resume-from': 'results/gone' \(.*stamen/results/gone\) does not exist"):
        check_on_server(settings(resume_from="results/gone"))


def test_a_relative_data_dir_is_refused_before_any_work():
    with pytest.raises(ConfigError, match=r"run config key 'data-dir': 'data/mnist' is relative; give an absolute"):
        settings(dataset="mnist", data_dir="data/mnist")
    assert settings(dataset="mnist", data_dir="/abs/mnist").data.data_dir == "/abs/mnist"


def test_the_simulation_process_moves_into_the_fab_and_nowhere_else(tmp_path, monkeypatch):
    fab = tmp_path / "flwr-home" / "apps" / "stamen.stamen.0.1.0.abcdef12"
    fab.mkdir(parents=True)
    started = tmp_path / "other-checkout"
    started.mkdir()
    monkeypatch.chdir(started)
    monkeypatch.setattr(workdir, "code_root", lambda: fab)
    monkeypatch.delenv(workdir.KEEP_WORKDIR, raising=False)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/pytest"])
    assert not workdir.serve_workers_from_the_fab() and Path.cwd() == started
    monkeypatch.setattr(sys, "argv", ["/venv/bin/flwr-simulation", "--app", "..."])
    monkeypatch.setenv(workdir.KEEP_WORKDIR, "1")
    assert not workdir.serve_workers_from_the_fab() and Path.cwd() == started
    monkeypatch.delenv(workdir.KEEP_WORKDIR)
    monkeypatch.setattr(workdir, "code_root", lambda: started)  # a checkout, not a FAB
    assert not workdir.serve_workers_from_the_fab() and Path.cwd() == started
    monkeypatch.setattr(workdir, "code_root", lambda: fab)
    assert workdir.serve_workers_from_the_fab() and Path.cwd() == fab


# --------------------------------------------------------------------------------------- provenance


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def repo_checkout() -> dict[str, object]:
    try:
        commit = git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"{REPO} is not a git checkout")
    dirty = bool(git("status", "--porcelain", "--", *PACKAGES, "pyproject.toml"))
    return {"git-checkout": str(REPO), "git-commit": commit, "git-dirty": dirty}


def test_provenance_names_the_code_its_commit_the_versions_and_the_machine():
    found = run_provenance("cpu")
    code = found["code"]
    assert code["fingerprint"] == code_fingerprint() and code["location"] == str(REPO) and not code["from-fab"]
    assert {k: code[k] for k in ("git-checkout", "git-commit", "git-dirty")} == repo_checkout()
    assert found["versions"]["flwr"] == metadata.version("flwr") and found["versions"]["torch"] == metadata.version(
        "torch")  # fmt: skip
    assert found["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert found["machine"]["cpus"] == os.cpu_count() and found["machine"]["device"] == "cpu"
    unknown = source_checkout("0" * 64)
    assert unknown["commit"] is None and "(FAB) carries no git data" in unknown["why"]


def test_the_result_writer_records_provenance_at_the_start_and_in_the_summary(tmp_path):
    provenance = run_provenance("cpu")
    writer = ResultWriter(run_dir=tmp_path / "run", settings={"seed": 0}, provenance=provenance)
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"settings": {"seed": 0},
                                                                       "provenance": provenance}  # fmt: skip
    nodes = [{"partition": 0, "num-train": 5, "num-test": 2, "data-fingerprint": "ab"}]
    summary = json.loads(writer.write_summary({"status": "completed", "nodes": nodes}).read_text())
    assert summary["provenance"] == {**provenance, "data": data_provenance(nodes)}


# ------------------------------------------------------------------------------------ nothing left running


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the session's check reads Linux's /proc")
def test_the_session_end_check_finds_a_process_this_session_left_running():
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "flower-superlink"])
    try:
        deadline = time.monotonic() + 10
        while stray.pid not in started_by_this_session() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "flower-superlink" in started_by_this_session()[stray.pid]
    finally:
        stray.kill()
        stray.wait()
    assert stray.pid not in started_by_this_session()
