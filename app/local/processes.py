"""The processes the local launchers start: each in a process group of its own, stopped by group.

One policy for :class:`~app.local.simulation.LocalSimulation` and
:class:`~app.local.deployment.LocalDeployment`: every process is started with
``start_new_session`` (so the ServerApp, ClientApp or simulation processes it starts stay in
its group), and :func:`stop` signals whole groups: SIGTERM, a grace period, then SIGKILL
until nothing lives in them. Flower starts a SuperLink's SuperExec in a session of its own;
:func:`stop` finds such groups by ancestry before it signals anything.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PORT_TRIES = 3  # starts of one process, each on a fresh port, before a launcher gives up
PORT_IN_USE = "address already in use"  # what a SuperLink or SuperNode logs when another process took its port


class ProcessExitedError(RuntimeError):
    """A process a launcher started exited while a run was pending; the message names it and ends with its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, chars: int = 3000) -> str:
    """The end of the log at ``path``, or ``(no log)``."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


@dataclass
class Started:
    """A process a launcher started, leading its own process group: its name, command, log file and handle."""

    name: str
    command: list[str]
    log_path: Path
    process: subprocess.Popen = field(repr=False)
    adopted: list[int] = field(default_factory=list)  # groups its descendants made (Flower's SuperExec)

    def adopt_descendants(self) -> None:
        """Remember the process groups of its descendants now: once it died, nothing would lead to them."""
        for group in with_descendant_groups([self.process.pid]):
            if group != self.process.pid and group not in self.adopted:
                self.adopted.append(group)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the process group (the SuperNode's ClientApp and the SuperLink's ServerApp with it)."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def exit_report(self, chars: int = 3000) -> str | None:
        """``<name> exited with <code>`` and the end of its log, once the process has exited; else None."""
        code = self.process.poll()
        if code is None:
            return None
        return f"{self.name} exited with {code}; its log {self.log_path}:\n{tail(self.log_path, chars)}"


def spawn(name: str, command: list[str], *, log_path: Path, env: Mapping[str, str], cwd: Path) -> Started:
    """Start ``command`` in a new session (its own process group), its output appended to ``log_path``."""
    with log_path.open("ab") as handle:
        process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    return Started(name=name, command=command, log_path=log_path, process=process)


def report(started: Iterable[Started], chars: int = 1500) -> str:
    """Each process: running or its exit code, and the end of its log (for a failure message)."""
    parts = []
    for item in started:
        code = item.process.poll()
        state = "running" if code is None else f"exited {code}"
        parts.append(f"--- {item.name} ({state}), {item.log_path}:\n{tail(item.log_path, chars)}")
    return "\n".join(parts)


def first_exit(started: Iterable[Started]) -> str | None:
    """The exit report of the first process in ``started`` that has exited, or None while all run."""
    return next((report for item in started if (report := item.exit_report()) is not None), None)


# ------------------------------------------------------------------ ports


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


def wait_for_port(started: Started, port: int, timeout_s: float = 60, *, host: str = "127.0.0.1") -> None:
    """Wait until ``started`` listens on ``port``.

    Raises
    ------
    RuntimeError
        When the process exits first (its log attached).
    TimeoutError
        When nothing listens after ``timeout_s``.

    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if started.process.poll() is not None:
            raise RuntimeError(f"process exited with {started.process.returncode} before listening; "
                               f"log:\n{tail(started.log_path)}")  # fmt: skip
        owned = listener_of(started.process.pid, port)
        if owned is None:
            with socket.socket() as sock:
                owned = sock.connect_ex((host, port)) == 0
        if owned:
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s; log:\n{tail(started.log_path)}")


def listens(started: Started, port: int, timeout_s: float = 60, *, host: str = "127.0.0.1") -> bool:
    """Wait until ``port`` listens; False when the process exited because another process holds the port.

    ``free_port`` only says that a port was free when it looked: on a busy machine another
    process may bind it before the SuperLink or SuperNode does, which then exits at once.
    A SuperNode lost that way would leave the ServerApp waiting for ``min-available-clients``.
    """
    try:
        wait_for_port(started, port, timeout_s, host=host)
    except RuntimeError:
        if PORT_IN_USE in tail(started.log_path).lower():
            return False
        raise
    return True


def hold_port(started: Started, port: int, restart: Callable[[int], Started], *, host: str = "127.0.0.1",
              tries: int = PORT_TRIES) -> tuple[Started, int]:  # fmt: skip
    """Wait until ``started`` listens on ``port``; each time it lost the port, ``restart`` it on a fresh one.

    The log of each lost start stays beside the next one's (``<name>.log.port-taken-<n>``).
    Returns the process that holds its port, and the port.
    """
    for attempt in range(tries):
        if listens(started, port, host=host):
            return started, port
        started.process.wait()
        started.log_path.rename(started.log_path.with_name(f"{started.log_path.name}.port-taken-{attempt}"))
        if attempt < tries - 1:
            port = free_port()
            started = restart(port)
    raise RuntimeError(f"the {started.name} found its port taken {tries} times; logs in {started.log_path.parent}")


def runtime_port(command: Sequence[str]) -> int | None:
    """The ``--port`` a command names (a plain SuperNode's Runtime API), or None."""
    return int(command[command.index("--port") + 1]) if "--port" in command else None


# ------------------------------------------------------------------ process groups and stopping


def _process_table() -> dict[int, tuple[str, int, int]]:
    """Each pid -> (state, parent pid, process group) of every process ``/proc`` shows."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        table[int(stat.parent.name)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def group_processes(groups: list[int]) -> list[int]:
    """Pids of every process, zombies aside, in the process groups ``groups``."""
    return [pid for pid, (state, _, group) in _process_table().items() if state != "Z" and group in groups]


def live_processes(groups: list[int]) -> list[str]:
    """``pid command`` of every process, zombies aside, in the process groups ``groups``."""
    found = []
    for pid in group_processes(groups):
        try:
            found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r}")
        except OSError:  # it ended while we looked
            continue
    return found


def with_descendant_groups(groups: list[int]) -> list[int]:
    """``groups`` and the process group of every process descended from theirs.

    Flower detaches some of what it starts into a session of its own (the SuperLink's
    SuperExec): stopping only the SuperLink's group would leave that one to notice its
    parent's death by itself.
    """
    table = _process_table()
    found, own = list(dict.fromkeys(groups)), os.getpgrp()
    members = {pid for pid, (_, _, group) in table.items() if group in found}
    while True:
        children = {pid for pid, (_, parent, _) in table.items() if parent in members} - members
        if not children:
            return found
        members |= children
        found += [g for g in dict.fromkeys(table[pid][2] for pid in children) if g not in found and g != own]


def _signal_groups(groups: Iterable[int], sig: int) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):  # gone, or its pid now leads another user's group
            pass


def stop(started: Sequence[Started], *, grace_s: float = 10, kill_s: float = 10) -> None:
    """Stop every process group of ``started`` (and of their descendants): SIGTERM, ``grace_s``, then SIGKILL.

    Groups a process's descendants made are found now, and the ones it adopted earlier
    (:meth:`Started.adopt_descendants`) are added. SIGTERM goes to the groups in the order
    given; each process gets ``grace_s`` seconds to exit (and is reaped). A SuperLink stopped
    while runs are pending may still be starting a ServerApp in its group: SIGKILL goes to the
    groups until nothing lives in them.
    """
    groups = with_descendant_groups([group for item in started for group in (item.process.pid, *item.adopted)])
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for item in started:
        try:
            item.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while group_processes(groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    deadline = time.monotonic() + kill_s
    while group_processes(groups) and time.monotonic() < deadline:
        _signal_groups(groups, signal.SIGKILL)
        time.sleep(0.2)
    for item in started:
        try:
            item.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
