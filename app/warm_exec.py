"""A SuperExec that pays for torch's import once per device: each ClientApp task runs in a forked child.

Flower's SuperExec starts one ``flwr-clientapp`` process per message; on a device every
message then pays for a fresh Python importing torch, numpy and Flower (about 2 CPU-s
here, several seconds on a small ARM board). This module is Flower's own
``flower-superexec`` (same command line, same polling, same Runtime API) with one part
swapped: the executor that starts a ClientApp task.

- At start, before Flower opens any connection or thread, the process forks a
  **fork server**: a single-threaded child that imports torch, numpy, Flower's ClientApp
  runtime and stamen's client modules once, then waits for task specs on a pipe.
- For every ClientApp task, the fork server forks a **task child**, which runs Flower's
  own task code (``flwr.supernode.runtime.run_clientapp.run_clientapp``) for that one
  message and exits. A fault in one message (an exception, a crash, a SIGKILL) ends only
  that child; the next message gets a fresh one.
- The app comes from the FAB the SuperLink sends, as in Flower's executor. The fork
  server keeps one app warm, keyed by its FAB hash: a task of another hash gets a child
  that first drops the warm app's modules, so it imports the FAB it installed (never a
  stale app); once that task ends the fork server warms the new FAB instead.
- Parent death takes the children along: the fork server dies with this process
  (``PR_SET_PDEATHSIG``, and it exits when its pipe closes), and every task child dies
  with the fork server.

``app/device.py`` starts a device this way: ``flower-supernode --isolation process``
beside ``python -m app.warm_exec``. When the installed Flower lacks what this module
relies on (:func:`warm_path_problem`), it says so in one line and runs Flower's own
``flower-superexec`` instead.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import importlib
import inspect
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
# What the warm path takes from Flower's internals; warm_path_problem() checks every item.
RUN_CLIENTAPP_PARAMETERS = ("runtime_api_address", "token", "insecure", "certificates", "parent_pid",
                            "runtime_dependency_install")
SPEC_FIELDS = ("task_type", "runtime_api_address", "token", "insecure", "root_certificates_path", "parent_pid",
               "suppress_output", "task_id", "fab_hash", "runtime_dependency_install")  # fmt: skip
_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1
PRELOAD = ("numpy", "torch", "flwr.supernode.runtime.run_clientapp")  # what every message paid for, imported once


def _log(text: str) -> None:
    print(f"stamen warm executor [{os.getpid()}]: {text}", file=sys.stderr, flush=True)


def flower_version() -> str:
    """The installed Flower's version."""
    from importlib.metadata import version

    return version("flwr")


def warm_path_problem() -> str | None:
    """Why the installed Flower cannot run the warm path, or ``None`` when it can.

    Checks every internal the warm path uses: SuperExec's module-level ``get_executor``
    (replaced), ``flower_superexec`` (the command line), the executor types, and the
    parameters of ``run_clientapp`` (the task code each child runs).
    """
    try:
        superexec = importlib.import_module("flwr.supercore.superexec.run_superexec")
        cli = importlib.import_module("flwr.supercore.cli")
        types = importlib.import_module("flwr.supercore.superexec.executor.types")
        subprocess_executor = importlib.import_module("flwr.supercore.superexec.executor.subprocess_executor")
        constant = importlib.import_module("flwr.supercore.constant")
        runtime = importlib.import_module("flwr.supernode.runtime.run_clientapp")
    except ImportError as err:
        return f"a Flower module is missing ({err})"
    needs = [(superexec, "get_executor"), (superexec, "run_superexec"), (cli, "flower_superexec"),
             (types, "ExecutionSpec"), (types, "LaunchResult"), (subprocess_executor, "SubprocessExecutor"),
             (constant, "TaskType"), (runtime, "run_clientapp")]  # fmt: skip
    for module, name in needs:
        if not hasattr(module, name):
            return f"{module.__name__}.{name} is missing"
    if not hasattr(constant.TaskType, "CLIENT_APP"):
        return "flwr.supercore.constant.TaskType.CLIENT_APP is missing"
    fields = {f.name for f in dataclasses.fields(types.ExecutionSpec)}
    if missing := [name for name in SPEC_FIELDS if name not in fields]:
        return f"ExecutionSpec lacks {', '.join(missing)}"
    parameters = inspect.signature(runtime.run_clientapp).parameters
    if missing := [name for name in RUN_CLIENTAPP_PARAMETERS if name not in parameters]:
        return f"run_clientapp() lacks the parameter(s) {', '.join(missing)}"
    if "get_executor" not in superexec.run_superexec.__code__.co_names:
        return "run_superexec() no longer calls the module's get_executor()"
    return None


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
        _log(f"fork server ready: {', '.join(self.preload)}{' and stamen' if self.warm_stamen else ''} imported "
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
                        _log(f"task {spec['task_id']}: {err!r}")
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
                    _log(f"task {task_id}: process {pid} was killed by signal {os.WTERMSIG(status)}; "
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
            _log(f"could not warm the app in {folder}: {err!r}")
            return None
        _log(f"app {folder.name} warm ({time.process_time() - started:.2f} CPU-s)")
        return str(folder)


# ------------------------------------------------------------------ the executor SuperExec uses


def warm_executor_class():
    """Flower's ``SubprocessExecutor`` with ClientApp tasks sent to the fork server."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
    from flwr.supercore.superexec.executor.types import ExecutionSpec, LaunchResult

    class WarmExecutor(SubprocessExecutor):
        """ClientApp tasks run in children of the fork server; every other task as Flower runs it."""

        def __init__(self, server: ForkServer) -> None:
            self.server = server

        def launch(self, spec: ExecutionSpec) -> LaunchResult:
            if spec.task_type != TaskType.CLIENT_APP:
                return super().launch(spec)
            if self.server.submit({name: getattr(spec, name) for name in SPEC_FIELDS if name != "task_type"}):
                return LaunchResult.accepted()
            _log(f"the fork server is gone; task {spec.task_id} runs in Flower's own flwr-clientapp process")
            return super().launch(spec)

        def close(self) -> None:
            self.server.close()

    return WarmExecutor


def main(argv: list[str] | None = None) -> None:
    """``flower-superexec``'s command line, with ClientApp tasks served warm (or Flower's own, with a warning)."""
    argv = sys.argv[1:] if argv is None else argv
    problem = warm_path_problem()
    if problem:
        _log(f"the warm executor does not support flwr {flower_version()} ({problem}); this device runs "
             "Flower's own flower-superexec, one cold process per message")  # fmt: skip
        os.execvp("flower-superexec", ["flower-superexec", *argv])
        return  # execvp replaced this process; reached only where it is stood in for (the tests)
    server = ForkServer(warm_stamen=os.environ.get("STAMEN_WARM_STAMEN", "1") != "0")
    server.start()
    import flwr.supercore.superexec.run_superexec as run_superexec
    from flwr.supercore.cli import flower_superexec

    executor = warm_executor_class()(server)
    run_superexec.get_executor = lambda *args, **kwargs: executor
    sys.argv = ["flower-superexec", *argv]
    try:
        flower_superexec()
    finally:
        server.close()


if __name__ == "__main__":
    main()
