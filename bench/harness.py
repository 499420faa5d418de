"""What every benchmark script shares: the flags, the run log, the report, the command that runs a script.

A script runs as ``python -m bench.<script>`` from the repository's root, which Python puts
on ``sys.path``: a script imports ``bench.harness``, ``app`` and the rest as the tests
import them. A script that starts copies of itself (workers) runs them the same way
(:func:`script_command`).

What a script keeps is its grid, its run and its table; this module owns the rest: the
``--quick``/``--out``/``--report-only`` flags and where ``--quick`` writes (:func:`arguments`),
the Flower simulation of this checkout (:func:`local_simulation`), the run log
(:class:`RunLog`), and the report's machine, date and files (:func:`write_report`).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
if TYPE_CHECKING:
    from app.local.simulation import LocalSimulation
SHARED_DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "bench" / "results"  # the committed reports and run logs
QUICK_RESULTS = RESULTS / "quick"  # --quick runs write here: git-ignored, never committed
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


def results_folder(quick: bool) -> Path:
    """Where a run writes: the committed results, or for ``--quick`` the git-ignored scratch folder."""
    return QUICK_RESULTS if quick else RESULTS


class Arguments(argparse.ArgumentParser):
    """A benchmark's command line; parsing sends ``--quick``'s files to :data:`QUICK_RESULTS`.

    Parameters
    ----------
    redirect
        The path arguments that ``--quick`` moves to :data:`QUICK_RESULTS`, each keeping its
        file name (``out``, and a script's own such as ``log``).
    quick_flag
        The flag whose runs are scratch: ``quick``, or a script's own (``gpu_check.py``'s ``cpu_only``).
    **kwargs
        Passed to :class:`argparse.ArgumentParser`.

    """

    def __init__(self, *, redirect: tuple[str, ...] = ("out",), quick_flag: str = "quick", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.redirect = redirect
        self.quick_flag = quick_flag

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        if getattr(parsed, self.quick_flag, False):  # a quick run never overwrites a committed result
            for name in self.redirect:
                if getattr(parsed, name, None) is not None:
                    setattr(parsed, name, results_folder(True) / getattr(parsed, name).name)
        return parsed


def arguments(
    description: str,
    *,
    out: str | None = None,
    quick: str | bool = False,
    report_only: str | bool = False,
    redirect: tuple[str, ...] = ("out",),
    quick_flag: str = "quick",
) -> Arguments:
    """A script's command line with the shared flags; the script adds its own.

    Parameters
    ----------
    description
        The script's docstring (its first line is shown).
    out
        The report's file name under :data:`RESULTS`, the default of ``--out``; ``None``: no ``--out``.
    quick, report_only
        Whether the script takes ``--quick`` / ``--report-only``: a help text, ``True``
        (no help text) or ``False`` (not taken).
    redirect
        The path arguments that ``--quick`` moves to :data:`QUICK_RESULTS` (see :class:`Arguments`).
    quick_flag
        The flag whose runs are scratch, if not ``--quick`` (the script adds it; see :class:`Arguments`).

    """
    made = Arguments(description=description.splitlines()[0], redirect=redirect, quick_flag=quick_flag)
    if quick:
        made.add_argument("--quick", action="store_true", help=quick if isinstance(quick, str) else None)
    if report_only:
        made.add_argument("--report-only", action="store_true",
                          help=report_only if isinstance(report_only, str) else None)  # fmt: skip
    if out is not None:
        made.add_argument("--out", type=Path, default=RESULTS / out)
    return made


def local_simulation(**kwargs: Any) -> LocalSimulation:
    """A Flower simulation of this checkout's app (``app_dir`` given in ``kwargs`` measures another)."""
    from app.local.simulation import LocalSimulation  # here, so a script that needs no Flower starts without it

    return LocalSimulation(**{"app_dir": REPO, **kwargs})


def today() -> str:
    """The date a result is stamped with."""
    return time.strftime("%Y-%m-%d")


def stamp(previous: dict | None = None) -> dict:
    """A report's ``machine`` and ``date``: ``previous``'s where it has them, else this machine's and today's.

    A report rebuilt from a run log (``--report-only``) passes the report it replaces, so it
    keeps the machine and the day its runs were measured on.
    """
    previous = previous or {}
    return {"machine": previous["machine"] if "machine" in previous else machine(),
            "date": previous["date"] if "date" in previous else today()}  # fmt: skip


def write_report(
    out: Path,
    report: dict,
    markdown: str | None = None,
    *,
    previous: dict | None = None,
    stamped: bool = True,
    indent: int = 2,
) -> None:
    """Write ``report`` as JSON to ``out`` and ``markdown`` (if any) beside it as ``.md``.

    Parameters
    ----------
    out
        The ``.json`` file; its folder is made.
    report
        The report; unless ``stamped`` is false, its ``machine`` and ``date`` are set where
        it has none (a report that lists them keeps their place: see :func:`stamp`).
    markdown
        The report's table(s), written to ``out`` with the suffix ``.md``.
    previous
        The report this one replaces, whose machine and date a rebuilt report keeps.
    stamped
        False: write the report as it is (the reports that have never carried a date, some
        of them with their own ``"machine": machine()``).
    indent
        The JSON's indent (each committed report keeps the one it was written with).

    """
    if stamped and not {"machine", "date"} <= report.keys():
        report |= {k: v for k, v in stamp(previous).items() if k not in report}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=indent) + "\n")
    if markdown is not None:
        out.with_suffix(".md").write_text(markdown)


def script_command(file: str) -> list[str]:
    """The command that runs the bench script ``file`` again (as ``python -m bench.<name>``, from ``REPO``)."""
    return [sys.executable, "-m", f"bench.{Path(file).stem}"]
