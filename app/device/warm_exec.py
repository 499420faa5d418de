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

The fork server and its task children live in ``app/device/fork_server.py``; this module is the
SuperExec around it. ``app/device/console.py`` starts a device this way: ``flower-supernode --isolation process``
beside ``python -m app.device.warm_exec``. When the installed Flower lacks what this module
relies on (:func:`warm_path_problem`), it says so in one line and runs Flower's own
``flower-superexec`` instead.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import sys

from app.device.fork_server import ForkServer, log

# What the warm path takes from Flower's internals; warm_path_problem() checks every item.
RUN_CLIENTAPP_PARAMETERS = ("runtime_api_address", "token", "insecure", "certificates", "parent_pid",
                            "runtime_dependency_install")
FORK_SERVER = f"{__package__}.fork_server"  # run as a module: one task whose spec comes on stdin
SPEC_FIELDS = ("task_type", "runtime_api_address", "token", "insecure", "root_certificates_path", "parent_pid",
               "suppress_output", "task_id", "fab_hash", "runtime_dependency_install")  # fmt: skip


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
            fields = {name: getattr(spec, name) for name in SPEC_FIELDS if name != "task_type"}
            if self.server.submit(fields):
                return LaunchResult.accepted()
            log(f"the fork server is gone; task {spec.task_id} runs in a fresh process")
            # not Flower's flwr-clientapp: it takes the task's token on its command line, readable by every account
            quiet = subprocess.DEVNULL if spec.suppress_output else None
            child = subprocess.Popen([sys.executable, "-m", FORK_SERVER], stdin=subprocess.PIPE, stdout=quiet,
                                     stderr=quiet)  # fmt: skip
            child.stdin.write(json.dumps(fields).encode())
            child.stdin.close()
            return LaunchResult.accepted()

        def close(self) -> None:
            self.server.close()

    return WarmExecutor


def main(argv: list[str] | None = None) -> None:
    """``flower-superexec``'s command line, with ClientApp tasks served warm (or Flower's own, with a warning)."""
    argv = sys.argv[1:] if argv is None else argv
    problem = warm_path_problem()
    if problem:
        log(f"the warm executor does not support flwr {flower_version()} ({problem}); this device runs "
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
