"""Memory of process trees, sampled in a thread while a benchmark runs (``/proc``; Linux).

:class:`PeakSampler` follows the processes a run started (marked by an environment value),
:class:`MemorySampler` each of given root processes and its descendants.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

SAMPLE_EVERY_S = 0.2


TICKS = os.sysconf("SC_CLK_TCK")


def _tree_memory(marker: str, cpu: dict[int, float] | None = None) -> tuple[float, float]:
    """Sum of PSS and of RSS (MiB) over processes whose environment holds ``marker``; each one's CPU-s into ``cpu``."""
    pss = rss = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            if cpu is not None:  # utime + stime, the 14th and 15th fields after the command's parenthesis
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) / 1024
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1]) / 1024
        except OSError:  # gone, or not ours
            continue
    return pss, rss


class PeakSampler(threading.Thread):
    """Samples the memory of a process tree (marked by an environment value) until stopped."""

    def __init__(self, marker: str) -> None:
        super().__init__(daemon=True)
        self.marker, self.peak_pss, self.peak_rss = marker, 0.0, 0.0
        self.cpu: dict[int, float] = {}  # each process's CPU seconds when last sampled
        self.done = threading.Event()

    @property
    def cpu_seconds(self) -> float:
        """The CPU seconds the marked processes used, as last sampled (a process shorter than a sample is missed)."""
        return sum(self.cpu.values())

    def run(self) -> None:
        while not self.done.wait(0.2):
            pss, rss = _tree_memory(self.marker, self.cpu)
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)


class MemorySampler:
    """Sample the memory of each device's process tree in a thread; :meth:`peaks` gives the largest sums, in MiB."""

    def __init__(self, roots: list[int]) -> None:
        self.roots, self.stop = roots, threading.Event()
        self.peak = {root: {"pss": 0.0, "rss": 0.0} for root in roots}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            for root, tree in process_trees(self.roots).items():
                total = {"pss": 0.0, "rss": 0.0}
                for pid in tree:
                    for measure, value in process_memory(pid).items():
                        total[measure] += value
                for measure, value in total.items():
                    self.peak[root][measure] = max(self.peak[root][measure], value)

    def peaks(self) -> list[dict[str, float]]:
        return [self.peak[root] for root in self.roots]


def process_memory(pid: int) -> dict[str, float]:
    """PSS and RSS of a process in MiB (``/proc/<pid>/smaps_rollup``); zeros once it has ended."""
    found = {"pss": 0.0, "rss": 0.0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("Pss", "Rss"):
                found[name.lower()] = int(value.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


def process_stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_trees(roots: list[int]) -> dict[int, set[int]]:
    """Each root and its living descendants, from one reading of ``/proc`` (the sampler runs 5 times a second)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(process_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    trees = {}
    for root in roots:
        tree, frontier = {root}, [root]
        while frontier:
            frontier = [child for pid in frontier for child in children.get(pid, ()) if child not in tree]
            tree.update(frontier)
        trees[root] = tree
    return trees
