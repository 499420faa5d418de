r"""Start one device (a SuperNode) whose ClientApp pays for torch's import once, not per message.

    stamen-device --superlink <host>:9092 ...      # installed (pip install stamen's wheel): from any folder
    python -m app.device.console --superlink <host>:9092 --root-certificates ca.crt \\
        --auth-supernode-private-key keys/device-0 --node-config "data-dir='/data/mine'"

takes ``flower-supernode``'s own options and starts two processes:

- ``flower-supernode <your options> --isolation process --port <free port>``: the SuperNode
  as you would start it, talking to the SuperLink (TLS, authentication, heartbeats,
  ``--node-config``) and serving its Runtime API on 127.0.0.1 only;
- ``python -m app.device.warm_exec --insecure --runtime-api-address 127.0.0.1:<port>``: Flower's
  SuperExec with a warm executor (``app/device/warm_exec.py``), which forks one child per message
  from a process that imported torch once.

The link between the two is the loopback interface of the device, as in Flower's own
``--isolation subprocess`` (which starts ``flower-superexec --insecure`` the same way).
``--cold`` runs ``flower-supernode <your options>`` alone instead (Flower's executor,
one fresh process per message). Either way the SuperExec asks the SuperNode for a new
task every ``--task-poll`` seconds (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, Flower's own
variable: 1 s by default, which each message waits half of on average); a value already
in the environment is kept. On a Flower that the warm executor does not support,
``app.device.warm_exec`` says so in one line and runs Flower's own ``flower-superexec`` in its
place. Stopping this command (Ctrl-C, SIGTERM, or its death) stops both
processes and every task child.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.device.fork_server import die_with_parent
from app.local.processes import free_port

TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"  # flwr/supercore/superexec/run_superexec.py reads it
TASK_POLL = 0.2  # seconds: bench/edge_rounds.py (docs/deployment.md#what-a-round-costs)
# the device sets these for the SuperNode-SuperExec link
RESERVED = ("--isolation", "--port", "--host", "--superexec-auth-secret-file")
# app.device.warm_exec in a clone, stamen.app.device.warm_exec installed: the package this module was imported from
WARM_EXEC = f"{__package__}.warm_exec"


def commands(supernode_args: list[str], *, port: int, parent_pid: int, cold: bool = False,
             secret_file: Path | None = None) -> list[list[str]]:  # fmt: skip
    """The processes a device runs: the SuperNode, and (unless ``cold``) the warm SuperExec beside it.

    Both get ``secret_file`` (``--superexec-auth-secret-file``): Flower then signs every
    call between them, so another account on the device cannot pose as the SuperExec and
    take the node's tasks (the global model, the right to answer as the node).

    Raises
    ------
    ValueError
        When ``supernode_args`` sets an option the device sets itself.

    """
    for arg in supernode_args:
        option = arg.split("=")[0]
        if option in RESERVED:
            raise ValueError(f"option {option}: the device sets {', '.join(RESERVED)} itself (the SuperNode's "
                             "Runtime API on 127.0.0.1 for the warm executor); leave it out")  # fmt: skip
    if cold:
        return [["flower-supernode", *supernode_args]]
    node = ["flower-supernode", *supernode_args, "--isolation", "process", "--host", "127.0.0.1", "--port", str(port)]
    executor = [sys.executable, "-m", WARM_EXEC, "--insecure", "--runtime-api-address", f"127.0.0.1:{port}",
                "--parent-pid", str(parent_pid)]  # fmt: skip
    secret = ["--superexec-auth-secret-file", str(secret_file)] if secret_file is not None else []
    return [node + secret, executor + secret]


def make_secret(folder: Path) -> Path:
    """A fresh random SuperExec secret, 32 bytes in a 0600 file in ``folder`` (a 0700 folder of this start's)."""
    path = folder / "superexec.secret"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secrets.token_bytes(32))
    return path


def device_environment(environ: dict[str, str], task_poll: float) -> dict[str, str]:
    """``environ`` with the SuperExec's task poll set to ``task_poll`` seconds, unless it sets one itself."""
    return {**environ, TASK_POLL_ENV: environ.get(TASK_POLL_ENV) or f"{task_poll:g}"}


def console() -> int:
    """``stamen-device``, the installed package's console script: :func:`main` under the command as typed."""
    return main(prog=Path(sys.argv[0]).name)


def main(argv: list[str] | None = None, *, prog: str = "") -> int:
    """Start the device's processes and keep them up until a signal or until one of them exits."""
    prog = prog or f"python -m {__package__}.device"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                     epilog="Every other option goes to flower-supernode unchanged.")  # fmt: skip
    parser.add_argument("--cold", action="store_true", help="Flower's own executor: a fresh process per message")
    parser.add_argument("--runtime-port", type=int, default=0, help="the SuperNode's Runtime API port (default: free)")
    parser.add_argument("--task-poll", type=float, default=TASK_POLL, metavar="SECONDS",
                        help=f"seconds between the SuperExec's asks for a new task, 0.01-60 (default {TASK_POLL:g}; "
                             f"Flower's: 1); {TASK_POLL_ENV} in the environment wins")  # fmt: skip
    args, supernode_args = parser.parse_known_args(argv)
    # No Flower import here (2 CPU-s on this machine): app.device.warm_exec checks the installed Flower itself and runs
    # Flower's own flower-superexec, with one warning, when the warm path cannot work.
    private = Path(tempfile.mkdtemp(prefix="stamen-device-"))  # 0700: this start's secret, gone when it stops
    try:
        to_start = commands(supernode_args, port=args.runtime_port or free_port(), parent_pid=os.getpid(),
                            cold=args.cold, secret_file=None if args.cold else make_secret(private))  # fmt: skip
        return _run(to_start, args.task_poll, parser)
    except ValueError as err:
        parser.error(str(err))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _run(to_start: list[list[str]], task_poll: float, parser: argparse.ArgumentParser) -> int:
    if not 0.01 <= task_poll <= 60:
        parser.error(f"--task-poll: {task_poll:g} s is outside Flower's 0.01-60 s")
    environment = device_environment(dict(os.environ), task_poll)
    print("stamen device: " + "\n  ".join(" ".join(c) for c in to_start), file=sys.stderr, flush=True)
    processes = [subprocess.Popen(command, env=environment, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
                 for command in to_start]  # fmt: skip
    stop = {"signal": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while not stop["signal"] and all(p.poll() is None for p in processes):
        time.sleep(0.2)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    return 0 if stop["signal"] else next((p.returncode for p in processes if p.returncode), 0)


if __name__ == "__main__":
    sys.exit(main())
