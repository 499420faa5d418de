"""What every benchmark script shares: the repository on ``sys.path``, a resumable run log, intervals, run records.

A script runs as ``python bench/<script>.py``: Python puts ``bench/`` on ``sys.path``, so the
script's first lines import this module as ``harness``, which puts the repository there
too (the one place that does); from then on the script imports ``bench.harness``, ``app``
and the rest as the tests import them.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's code, never an installed copy of stamen
    sys.path.insert(0, str(REPO))
SHARED_DATA = REPO.parent / "shared" / "data"
QUICK_RESULTS = REPO / "bench" / "results" / "quick"  # --quick runs write here: git-ignored, never committed
# Student t quantiles, df = seeds - 1
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t-interval (half-width 0 for one value)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, T_975[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))


def fmt(value: float | None, half: float | None = None, digits: int = 1) -> str:
    """A table's figure: ``value`` (and ``± half``, a 95% half-width) to ``digits`` places; "n/a" for ``None``."""
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" + ("" if half is None else f" ± {half:.{digits}f}")


def machine() -> str:
    """The machine and software a result was measured with."""
    import torch  # here, so a script measuring its own memory starts without it

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    # the CPU model and the kernels torch picked for it: the same seed can give other figures on another CPU
    cpu = f"{cpu_model()}, {torch.backends.cpu.get_cpu_capability()}"
    return f"{platform.machine()} ({cpu}), python {platform.python_version()}, torch {torch.__version__}, {device}"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` where there is one)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def read_records(run_dir: Path) -> tuple[list[dict], dict]:
    """A finished run's per-round records (``metrics.jsonl``) and its ``summary.json``."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((run_dir / "summary.json").read_text())


class RunLog:
    """Finished runs appended one JSON line each, so a long benchmark resumes where it stopped.

    Parameters
    ----------
    path
        The ``.jsonl`` file (created on the first append).
    key_fields
        The fields of a result that identify its run; a run whose key is already in the
        log is not run again.

    """

    def __init__(self, *, path: Path, key_fields: tuple[str, ...]) -> None:
        self.path = path
        self.key_fields = key_fields
        lines = path.read_text().splitlines() if path.exists() else []
        self.results = {self.key(r): r for r in map(json.loads, lines)}

    def key(self, fields: dict) -> str:
        # a field added to the key later is "" in the runs recorded before it
        return "|".join(str(fields.get(k, "")) for k in self.key_fields)

    def get(self, fields: dict) -> dict | None:
        """The recorded result of the run these fields identify, if any."""
        return self.results.get(self.key(fields))

    def append(self, result: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(result) + "\n")
        self.results[self.key(result)] = result
