"""The fork server of a warm device: imports torch, Flower and stamen once, then forks one child per ClientApp task.

:mod:`app.device.warm_exec` (Flower's SuperExec with a warm executor) starts it before Flower
opens any connection or thread. Each task child runs Flower's own task code for one
message and exits; the app it serves comes from the FAB, kept warm by its hash
(see :mod:`app.device.warm_exec` for the whole design). Parent death takes the children along.
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import os
import select
import signal
import sys
import time
from multiprocessing.connection import Connection, Pipe
from pathlib import Path

from app import FORKED_AT_ENV  # set in each task child: app.message_cost splits its cost from there

STAMEN_PACKAGES = ("app", "clients", "strategies", "datasets")
TASK_NAME = b"stamen-task"  # the task child's name in ps/top (/proc/<pid>/comm)
_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1
PRELOAD = ("numpy", "torch", "flwr.supernode.runtime.run_clientapp")  # what every message paid for, imported once


def log(text: str) -> None:
    """One line on stderr, naming the warm executor and this process."""
    print(f"stamen warm executor [{os.getpid()}]: {text}", file=sys.stderr, flush=True)


def _prctl(option: int, value: int | bytes) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: parent death is then caught through the pipe only
        pass


def die_with_parent(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; a no-op elsewhere)."""
    _prctl(_PR_SET_PDEATHSIG, sig)


# ------------------------------------------------------------------ the app the fork server keeps warm


def app_folder(fab_hash: str) -> Path | None:
    """The folder Flower installed the FAB ``fab_hash`` into, once it exists."""
    from flwr.common.constant import FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    found = glob.glob(str(get_flwr_home() / "apps" / f"*.{fab_hash[:FAB_HASH_TRUNCATION]}" / "pyproject.toml"))
    return Path(found[0]).parent if found else None


def drop_app(folder: str | None) -> None:
    """Forget stamen's modules (and ``folder`` on ``sys.path``) so the next import reads a FAB afresh."""
    for name in [m for m in sys.modules if m.split(".")[0] in STAMEN_PACKAGES]:
        del sys.modules[name]
    if folder and folder in sys.path:
        sys.path.remove(folder)
    importlib.invalidate_caches()


def import_client_app(folder: str | None) -> None:
    """Import the ClientApp module (from ``folder``, a FAB install, else wherever stamen is importable)."""
    if folder:
        sys.path.insert(0, folder)
    importlib.import_module("app.client_app")


# ------------------------------------------------------------------ fork server and task child


def _run_task(spec: dict, warm_hash: str | None, warm_folder: str | None) -> int:
    """In a fresh child: run Flower's ClientApp task code for one message; the exit code."""
    die_with_parent(signal.SIGKILL)  # the fork server
    _prctl(_PR_SET_NAME, TASK_NAME)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.environ[FORKED_AT_ENV] = repr(time.time())
    if spec["suppress_output"]:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    if spec["fab_hash"] is None or spec["fab_hash"] != warm_hash:
        drop_app(warm_folder)  # another FAB: its own code, never the warm one
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    path = spec["root_certificates_path"]
    certificates = Path(path).read_bytes() if path else None
    try:
        run_clientapp(runtime_api_address=spec["runtime_api_address"], token=spec["token"],
                      insecure=spec["insecure"], certificates=certificates, parent_pid=spec["parent_pid"],
                      runtime_dependency_install=spec["runtime_dependency_install"])  # fmt: skip
    except SystemExit as done:  # Flower's task code ends with flwr_exit(): sys.exit(0 or 1)
        return done.code if isinstance(done.code, int) else 1
    return 0


class ForkServer:
    """The single-threaded process that imports once and forks one task child per ClientApp message."""

    def __init__(self, *, warm_stamen: bool = True, preload: tuple[str, ...] = PRELOAD) -> None:
        self.warm_stamen, self.preload = warm_stamen, preload
        self.pid = 0
        self._send: Connection | None = None

    def start(self) -> None:
        """Fork the server now, while this process has no threads and no connections."""
        receive, send = Pipe(duplex=False)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            send.close()
            die_with_parent(signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(0)
            code = 1
            try:
                code = self._serve(receive)
            finally:
                os._exit(code)
        receive.close()
        self.pid, self._send = pid, send

    def submit(self, spec: dict) -> bool:
        """Hand a task spec to the fork server; ``False`` if it is gone."""
        try:
            self._send.send(spec)
            return True
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        if self._send is not None:
            self._send.close()
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def _serve(self, receive: Connection) -> int:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        started = time.process_time()
        for module in self.preload:
            importlib.import_module(module)
        warm_hash: str | None = None
        warm_folder: str | None = None
        if self.warm_stamen:
            # stamen's client modules pull in their third-party imports; the modules themselves are dropped
            # again: each task must import the FAB it is sent (warmed below, per FAB hash)
            import_client_app(None)
            drop_app(None)
        log(f"fork server ready: {', '.join(self.preload)}{' and stamen' if self.warm_stamen else ''} imported "
             f"once ({time.process_time() - started:.2f} CPU-s)")  # fmt: skip
        children: dict[int, tuple[int, str | None]] = {}  # pid -> (task id, FAB hash)
        to_warm: str | None = None
        while True:
            ready, _, _ = select.select([receive], [], [], 0.2)
            if ready:
                try:
                    spec = receive.recv()
                except EOFError:  # SuperExec is gone: stop, and the children die with us
                    return 0
                pid = os.fork()
                if pid == 0:
                    receive.close()
                    code = 1
                    try:
                        code = _run_task(spec, warm_hash, warm_folder)
                    except BaseException as err:  # noqa: BLE001  the child must never return into the loop
                        log(f"task {spec['task_id']}: {err!r}")
                    finally:
                        os._exit(code)
                children[pid] = (spec["task_id"], spec["fab_hash"])
                if spec["fab_hash"] and spec["fab_hash"] != warm_hash:
                    to_warm = spec["fab_hash"]
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                task_id, fab_hash = children.pop(pid)
                if os.WIFSIGNALED(status):
                    log(f"task {task_id}: process {pid} was killed by signal {os.WTERMSIG(status)}; "
                         "its message is answered with an error when its heartbeat lapses (Flower: 60 s), "
                         "the next message gets a fresh process")  # fmt: skip
                if fab_hash is not None and fab_hash == to_warm and self.warm_stamen:
                    warm_folder = self._warm(fab_hash, warm_folder)
                    warm_hash = fab_hash if warm_folder else None
                    to_warm = None

    def _warm(self, fab_hash: str, old_folder: str | None) -> str | None:
        """Import the app of ``fab_hash`` (installed by the task that just ended); its folder, or ``None``."""
        drop_app(old_folder)
        folder = app_folder(fab_hash)
        if folder is None:
            return None
        started = time.process_time()
        try:
            import_client_app(str(folder))
        except Exception as err:  # noqa: BLE001  a broken app stays cold; its tasks report the error themselves
            drop_app(str(folder))
            log(f"could not warm the app in {folder}: {err!r}")
            return None
        log(f"app {folder.name} warm ({time.process_time() - started:.2f} CPU-s)")
        return str(folder)


def run_one_task() -> int:
    """``python -m app.device.fork_server``: one ClientApp task whose spec (JSON) comes on stdin, never in argv.

    The warm executor's fallback when its fork server is gone: Flower's own executor would
    pass the task's token on ``flwr-clientapp``'s command line, where every local account
    can read it (``ps``); this reads it from a pipe instead.
    """
    import json

    return _run_task(json.loads(sys.stdin.read()), None, None)


if __name__ == "__main__":
    sys.exit(run_one_task())
