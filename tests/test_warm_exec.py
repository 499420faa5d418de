"""The warm executor's parts without a deployment: the guard on Flower's internals, the device's
commands and its fallback, and the fork server's processes (with Flower's task code replaced
by a stand-in that records where it ran). ``tests/test_warm_device.py`` runs the real thing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO

import app.device.console as device
import app.device.fork_server as fork_server
import app.device.warm_exec as warm_exec
from app.device.fork_server import ForkServer
from app.device.warm_exec import warm_path_problem


def test_the_installed_flower_has_everything_the_warm_path_uses():
    # fails when a Flower upgrade moves or changes an internal the warm executor relies on
    assert warm_path_problem() is None


@pytest.mark.parametrize(("module", "name", "expected"), [
    ("flwr.supercore.superexec.run_superexec", "get_executor", "run_superexec.get_executor is missing"),
    ("flwr.supernode.runtime.run_clientapp", "run_clientapp", "run_clientapp.run_clientapp is missing"),
    ("flwr.supercore.cli", "flower_superexec", "flwr.supercore.cli.flower_superexec is missing"),
])  # fmt: skip
def test_a_missing_internal_is_named(monkeypatch, module, name, expected):
    monkeypatch.delattr(sys.modules.get(module) or __import__(module, fromlist=["_"]), name)
    assert expected in warm_path_problem()


def test_a_changed_task_signature_is_named(monkeypatch):
    import flwr.supernode.runtime.run_clientapp as runtime

    monkeypatch.setattr(runtime, "run_clientapp", lambda address, token, insecure: None)
    assert warm_path_problem() == ("run_clientapp() lacks the parameter(s) runtime_api_address, certificates, "
                                   "parent_pid, runtime_dependency_install")


def test_a_warm_device_runs_the_supernode_and_the_warm_superexec_on_one_loopback_port():
    node, executor = device.commands(["--insecure", "--superlink", "10.0.0.2:9092"], port=4321, parent_pid=77)
    assert node == ["flower-supernode", "--insecure", "--superlink", "10.0.0.2:9092", "--isolation", "process",
                    "--host", "127.0.0.1", "--port", "4321"]  # fmt: skip
    assert executor[1:] == ["-m", "app.device.warm_exec", "--insecure", "--runtime-api-address", "127.0.0.1:4321",
                            "--parent-pid", "77"]  # fmt: skip
    assert device.commands(["--insecure"], port=1, parent_pid=1, cold=True) == [["flower-supernode", "--insecure"]]


@pytest.mark.parametrize("option", ["--isolation=subprocess", "--port", "--host"])
def test_a_device_refuses_the_options_it_sets_itself(option):
    with pytest.raises(ValueError, match=f"option {option.split('=')[0]}: the device sets --isolation, --port, --host"):
        device.commands([option], port=1, parent_pid=1)


def test_a_flower_the_warm_path_does_not_support_gets_flowers_superexec_and_one_warning(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(warm_exec, "warm_path_problem", lambda: "ExecutionSpec lacks fab_hash")
    monkeypatch.setattr(warm_exec.os, "execvp", lambda program, args: started.append(args))
    monkeypatch.setattr(warm_exec, "ForkServer", None)  # the warm path is never reached
    warm_exec.main(["--insecure", "--runtime-api-address", "127.0.0.1:9094"])
    assert started == [["flower-superexec", "--insecure", "--runtime-api-address", "127.0.0.1:9094"]]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "does not support" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith(f"the warm executor does not support flwr {warm_exec.flower_version()} "
                                "(ExecutionSpec lacks fab_hash); this device runs Flower's own flower-superexec, "
                                "one cold process per message")  # fmt: skip


# ------------------------------------------------------------------ the fork server, with a stand-in task


def record_task(runtime_api_address, token, insecure, certificates, parent_pid, runtime_dependency_install):
    """Flower's task code, replaced: note where this task ran, then act on the token."""
    out = Path(runtime_api_address) / f"{token}.json"
    seen = {"pid": os.getpid(), "ppid": os.getppid(), "warm-app": "app.client_app" in sys.modules,
            "forked-at": os.environ.get("STAMEN_FORKED_AT"), "cpu": time.process_time()}  # fmt: skip
    out.write_text(json.dumps(seen))
    if token.startswith("die"):
        os.kill(os.getpid(), signal.SIGKILL)
    if token.startswith("sleep"):
        time.sleep(120)
    sys.exit(0)  # as Flower's flwr_exit() ends a task


def spec(folder: Path, token: str, fab_hash: str | None = None) -> dict:
    return {"runtime_api_address": str(folder), "token": token, "insecure": True, "root_certificates_path": None,
            "parent_pid": None, "suppress_output": False, "task_id": 1, "fab_hash": fab_hash,
            "runtime_dependency_install": False}  # fmt: skip


def wait_for(path: Path, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)
    time.sleep(0.05)
    return json.loads(path.read_text())


@pytest.fixture
def stand_in(monkeypatch):
    import flwr.supernode.runtime.run_clientapp as runtime

    monkeypatch.setattr(runtime, "run_clientapp", record_task)  # a fork inherits it


def test_each_task_runs_in_a_fresh_child_and_a_killed_one_does_not_stop_the_next(tmp_path, stand_in):
    server = ForkServer(warm_stamen=False)
    server.start()
    try:
        for token in ("first", "die", "after"):
            assert server.submit(spec(tmp_path, token))
        first, killed, after = (wait_for(tmp_path / f"{t}.json") for t in ("first", "die", "after"))
    finally:
        server.close()
    assert len({first["pid"], killed["pid"], after["pid"], server.pid}) == 4
    assert first["ppid"] == after["ppid"] == server.pid
    assert float(after["forked-at"]) > float(first["forked-at"])
    assert after["cpu"] < 0.3  # torch and Flower came with the fork: the child imported nothing
    assert not server.submit(spec(tmp_path, "late"))  # closed: the executor then falls back to Flower's own


def test_a_task_of_another_fab_never_sees_the_warm_app(tmp_path, stand_in, monkeypatch):
    monkeypatch.setattr(fork_server, "app_folder", lambda fab_hash: REPO if fab_hash == "a" * 64 else None)
    server = ForkServer(warm_stamen=True, preload=())  # stamen's client brings torch along
    server.start()
    try:
        server.submit(spec(tmp_path, "a-first", "a" * 64))
        seen = [wait_for(tmp_path / "a-first.json")]
        for attempt in range(40):  # until the server has warmed FAB a (it does so once a-first has ended)
            server.submit(spec(tmp_path, f"a-{attempt}", "a" * 64))
            seen.append(wait_for(tmp_path / f"a-{attempt}.json"))
            if seen[-1]["warm-app"]:
                break
        server.submit(spec(tmp_path, "b", "b" * 64))
        other = wait_for(tmp_path / "b.json")
        server.submit(spec(tmp_path, "none", None))
        unknown = wait_for(tmp_path / "none.json")
    finally:
        server.close()
    assert not seen[0]["warm-app"] and seen[-1]["warm-app"]  # FAB a: cold once, then warm
    assert not other["warm-app"] and not unknown["warm-app"]  # another FAB, or none named: the app is dropped


def test_the_fork_server_and_its_tasks_die_with_their_parent(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]
        import flwr.supernode.runtime.run_clientapp as runtime
        from test_warm_exec import record_task, spec
        from app.device.fork_server import ForkServer
        runtime.run_clientapp = record_task
        server = ForkServer(warm_stamen=False, preload=())
        server.start()
        server.submit(spec(__import__("pathlib").Path({str(tmp_path)!r}), "sleep"))
        print(server.pid, flush=True)
        time.sleep(120)
    """)  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        task_pid = wait_for(tmp_path / "sleep.json")["pid"]
    finally:
        parent.kill()  # SIGKILL: no handler of the parent runs
        parent.wait()
        parent.stdout.close()
    deadline = time.monotonic() + 10
    while alive(server_pid) or alive(task_pid):
        assert time.monotonic() < deadline, "the fork server or its task outlived their parent"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_without_its_fork_server_a_task_runs_in_a_fresh_process_that_reads_its_token_from_a_pipe(monkeypatch):
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.types import ExecutionSpec

    started = []

    class Recorded:  # a Popen that records its command line and what it was sent
        def __init__(self, args, **kwargs):
            self.args, self.sent = args, b""
            self.stdin = self
            started.append(self)

        def write(self, data):
            self.sent += data

        def close(self):
            pass

    class GoneServer:
        def submit(self, spec):
            return False

    monkeypatch.setattr(warm_exec.subprocess, "Popen", Recorded)
    fields = {name: None for name in warm_exec.SPEC_FIELDS}
    spec = ExecutionSpec(**{**fields, "task_type": TaskType.CLIENT_APP, "token": "s3cret-token", "insecure": True,
                            "runtime_api_address": "127.0.0.1:5", "suppress_output": False, "task_id": 7,
                            "runtime_dependency_install": False})  # fmt: skip
    warm_exec.warm_executor_class()(GoneServer()).launch(spec)
    (child,) = started
    assert child.args == [sys.executable, "-m", warm_exec.FORK_SERVER]
    assert "s3cret-token" not in " ".join(child.args)
    assert json.loads(child.sent)["token"] == "s3cret-token"
