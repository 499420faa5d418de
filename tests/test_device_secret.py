"""A device's SuperNode-SuperExec link is signed: another local account cannot take the node's tasks.

``stamen-device`` hands the SuperNode and its warm SuperExec a fresh random secret
(``--superexec-auth-secret-file``, a 0600 file in a 0700 folder of that start, removed when it
stops); Flower then refuses an unsigned ``acquire-task``, the call that hands out a ClientApp
task and its token. Flower's own SuperNode without a secret serves the same call to anyone.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import REPO
from flwr.proto.runtime_pb2 import AcquireTaskRequest

from app.device.console import commands, make_secret
from app.local.flwr_cli import FLOWER_ENV
from app.local.processes import free_port

pytestmark = pytest.mark.e2e
NO_SUPERLINK = "127.0.0.1:1"  # the SuperNode keeps retrying it; its Runtime API serves meanwhile


def acquire_task(port: int, timeout_s: float = 90) -> int:
    """The status an unsigned ``acquire-task`` gets from the SuperNode on ``port`` (waiting for it to listen)."""
    body = AcquireTaskRequest().SerializeToString()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.post(f"http://127.0.0.1:{port}/v1/runtime/acquire-task", content=body, timeout=10,
                              headers={"content-type": "application/protobuf"}).status_code  # fmt: skip
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def secret_files(pid: int) -> list[Path]:
    """The secret files named on the command lines of ``pid``'s children."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        args = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"--superexec-auth-secret-file" in args:
            found.append(Path(args[args.index(b"--superexec-auth-secret-file") + 1].decode()))
    return found


def test_the_secret_is_fresh_random_and_owner_only(tmp_path):
    (tmp_path / "a").mkdir()
    first, second = make_secret(tmp_path / "a"), make_secret(tmp_path)
    assert len(first.read_bytes()) == 32 and first.read_bytes() != second.read_bytes()
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    node, executor = commands(["--insecure", "--superlink", "x:1"], port=5, parent_pid=1, secret_file=first)
    assert node[-2:] == executor[-2:] == ["--superexec-auth-secret-file", str(first)]
    assert commands(["--superlink", "x:1"], port=5, parent_pid=1, cold=True) == [["flower-supernode", "--superlink",
                                                                                    "x:1"]]  # fmt: skip
    with pytest.raises(ValueError, match="option --superexec-auth-secret-file: the device sets"):
        commands(["--superexec-auth-secret-file", "mine"], port=5, parent_pid=1)


def test_another_local_process_cannot_take_a_device_s_task_without_its_secret():
    env = {**os.environ, **FLOWER_ENV, "PYTHONPATH": str(REPO), "STAMEN_WARM_STAMEN": "0"}
    port = free_port()
    device = subprocess.Popen([sys.executable, "-m", "app.device.console", "--insecure", "--superlink", NO_SUPERLINK,
                               "--runtime-port", str(port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert acquire_task(port) == 401  # Flower: "SuperExec authentication failed"
        (secret,) = set(secret_files(device.pid))
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    finally:
        stop(device)
    assert not secret.exists() and not secret.parent.exists()  # gone with the device

    plain_port = free_port()  # the control: Flower's SuperNode as a device ran it before, without a secret
    plain = subprocess.Popen(["flower-supernode", "--insecure", "--superlink", NO_SUPERLINK, "--isolation", "process",
                              "--host", "127.0.0.1", "--port", str(plain_port)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert acquire_task(plain_port) == 200  # anyone on the device gets the next task
    finally:
        stop(plain)
