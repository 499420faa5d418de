"""What one ClientApp message costs, phase by phase, when ``STAMEN_PROFILE`` names a file.

A deployed SuperNode starts a fresh ``flwr-clientapp`` process for every message, so
a message pays for the process, Flower's imports and stamen's (torch) before any
work; a simulation worker pays them once. :func:`cost_mod`, a Flower client mod,
appends one JSON line per message to ``$STAMEN_PROFILE`` with wall and CPU seconds of:

- ``flower``: process start to the moment stamen's package began loading (interpreter,
  Flower's imports and its connection; the first message of a process only); in a task
  child of the warm executor (``app/device/warm_exec.py``), which starts with stamen imported,
  the fork to the moment the message reaches stamen (Flower's task code: connection,
  message, FAB);
- ``imports``: loading ``app.client_app`` (torch and stamen; first message only);
- ``data``: loading this node's data (when this message built the client);
- ``build``: settings, model and client besides the data;
- ``work``: the rest of the message (training, evaluation or the preflight's check).

``bench/deploy_cost.py`` sets the variable; without it the mod is not installed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from flwr.common import Context, Message

from app import FORKED_AT_ENV, IMPORT_STARTED

PROFILE_ENV = "STAMEN_PROFILE"
_marks: dict[str, tuple[float, float]] = {}
_state = {"first": True}


def now() -> tuple[float, float]:
    """Wall and process CPU seconds."""
    return time.time(), time.process_time()


def mark(name: str) -> None:
    """Note that phase ``name`` ended now (``imported``, ``settings``, ``data``, ``built``)."""
    _marks[name] = now()


def process_started() -> float | None:
    """When this process started (seconds since the epoch), from ``/proc``; ``None`` where there is none."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))  # fmt: skip
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _span(start: tuple[float, float], end: tuple[float, float]) -> dict[str, float]:
    return {"wall": end[0] - start[0], "cpu": end[1] - start[1]}


def cost_mod(message: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Handle ``message`` and append what it cost to ``$STAMEN_PROFILE``."""
    for phase in ("settings", "data", "built"):
        _marks.pop(phase, None)
    begin = now()
    reply = call_next(message, context)
    end = now()
    record: dict[str, object] = {"pid": os.getpid(), "kind": message.metadata.message_type,
                                 "round": message.metadata.group_id, "node": context.node_id,
                                 "first-in-process": _state["first"]}  # fmt: skip
    phases = {}
    if _state["first"]:
        forked_at = os.environ.get(FORKED_AT_ENV)
        started = float(forked_at) if forked_at else process_started()
        if forked_at and IMPORT_STARTED[0] < started:  # a warm fork: stamen was imported before this process began
            phases["flower"] = {"wall": begin[0] - started, "cpu": begin[1]}
            phases["imports"] = {"wall": 0.0, "cpu": 0.0}
        else:
            phases["flower"] = {"wall": IMPORT_STARTED[0] - started if started else float("nan"),
                                "cpu": IMPORT_STARTED[1]}  # fmt: skip
            phases["imports"] = _span(IMPORT_STARTED, _marks.get("imported", IMPORT_STARTED))
    rest = begin
    if "built" in _marks:
        phases["build"] = _span(begin, _marks["settings"])
        phases["data"] = _span(_marks["settings"], _marks["data"])
        phases["build"] = {k: v + _span(_marks["data"], _marks["built"])[k] for k, v in phases["build"].items()}
        rest = _marks["built"]
    phases["work"] = _span(rest, end)
    record["phases"] = phases
    _state["first"] = False
    with open(os.environ[PROFILE_ENV], "a") as handle:  # one short line per write: appends do not interleave
        handle.write(json.dumps(record) + "\n")
    return reply


def mods() -> list:
    """``[cost_mod]`` when ``$STAMEN_PROFILE`` is set, else none."""
    return [cost_mod] if os.environ.get(PROFILE_ENV) else []
