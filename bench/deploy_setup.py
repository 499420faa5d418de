"""What the deployment benchmarks share: environment variables for the processes they start, each device's CPU.

``bench/deploy_cost.py`` (what a message costs a device) and ``bench/edge_rounds.py`` (what
a round costs) start loopback deployments (``app.local.deployment.LocalDeployment``) and
read the devices' process trees from ``/proc``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.samplers import process_stat, process_trees


class Env:
    """Set environment variables for the processes started inside the block (they copy ``os.environ``)."""

    def __init__(self, **values: str) -> None:
        self.values, self.saved = values, {}

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read_profile(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def settled(roots: list[int], *, idle_cpu_s: float = 0.05, timeout_s: float = 120) -> list[dict[str, float]]:
    """Each device's CPU once all of them are idle (under ``idle_cpu_s`` CPU-s per second each, over 2 s)."""
    last = node_cpus(roots)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(2)
        now = node_cpus(roots)
        busiest = max(sum(n.values()) - sum(b.values()) for n, b in zip(now, last, strict=True)) / 2
        last = now
        if busiest < idle_cpu_s:
            break
    return last


def node_cpus(roots: list[int]) -> list[dict[str, float]]:
    """CPU seconds of each SuperNode's process tree: itself, and its descendants with the processes they reaped.

    The SuperNode starts a SuperExec, which starts one ClientApp process per message and
    reaps it: a finished ClientApp's CPU is in the SuperExec's children's time (a warm
    device: ``app.device.console`` starts both, and the fork server reaps the ClientApps).
    """
    tick = os.sysconf("SC_CLK_TCK")
    found = []
    for root, tree in process_trees(roots).items():
        totals = {"supernode": 0.0, "descendants": 0.0}
        for member in tree:
            try:
                fields = process_stat(member)
            except OSError:
                continue
            totals["supernode" if member == root else "descendants"] += sum(int(fields[i]) for i in (11, 12, 13, 14))
        found.append({name: ticks / tick for name, ticks in totals.items()})
    return found
