"""Every method's round records and final model, written once and compared after a change to the round engine.

A refactor of the server's round (issue 69: one engine on the Message API) must change no
figure. This script runs each registered method's contract example, shortened to 3 rounds
on 4 nodes, and keeps what the run wrote: every ``metrics.jsonl`` record less what the
clock decides (keys holding ``seconds``, Unix times) and, per array of the final global
model (``checkpoint.npz``, where the server holds one), its shape, dtype, sum and sum of squares (float64). Two ways:

- **in-process**: the ServerApp's Message API strategy on a grid whose nodes answer in this
  process through Flower's wire encoding (``app.local.message_grid.InProcessGrid``);
- **flwr run**: the same run configs through Flower's simulation engine (a private local
  SuperLink, 4 SuperNodes).

``--write`` keeps them in ``bench/results/method_records.json`` (committed: the records of
the commit it was run at); ``--check`` runs again and compares, float by float within
``REL`` (another CPU changes the last digits). ``tests/test_method_records.py`` runs the
in-process check for every method in the unit tier.

Usage::

    python -m bench.method_records --write            # both ways, at the commit before a change
    python -m bench.method_records --check            # both ways, after it
    python -m bench.method_records --check --inprocess-only
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from bench.harness import REPO, RESULTS, local_simulation

RECORDS = RESULTS / "method_records.json"
CLIENTS, ROUNDS = 4, 3
# the run each method plays: its contract's example, a few quick rounds on 4 nodes (the shape of tests/helpers.QUICK)
QUICK = {"num-server-rounds": ROUNDS, "fraction-fit": 0.5, "min-available-clients": CLIENTS, "local-steps": 2,
         "batch-size": 4, "adapt-batch-size": 4, "perfedavg-outer-batch-size": 4, "perfedavg-hessian-batch-size": 4,
         "eval-every": 2, "central-eval": False}  # fmt: skip
OWN = {"fathom": {"local-epochs": 0.1, "fathom-batch-min": 2.0, "batch-size": 4}}
REL, ABS = 1e-6, 1e-9  # a float's tolerance: the same machine gives equal figures, another CPU the last digits


def run_config(name: str, results: Path, run_name: str) -> dict[str, object]:
    """``name``'s contract example, shortened to ``ROUNDS`` rounds on ``CLIENTS`` nodes, writing to ``results``."""
    from app.registry import METHODS
    from strategies.contracts.personal import WholeModel

    contract = METHODS[name].contract  # a model that never travels has no checkpoint: the server holds none
    saved = {} if isinstance(contract.personal, WholeModel) else {"checkpoint-every": ROUNDS}
    return {**contract.example, **QUICK, **saved, **OWN.get(name, {}), "results-dir": str(results),
            "run-name": run_name}  # fmt: skip


def kept(run_dir: Path) -> dict[str, object]:
    """A finished run's records without what the clock decides, and its final model's per-array figures."""
    import numpy as np

    from strategies.rounds.checkpoint import arrays_of_model, load_checkpoint

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [{k: v for k, v in row.items() if "seconds" not in k and not k.endswith("-unix")} for row in rows]
    saved = run_dir / "checkpoint.npz"
    model = arrays_of_model(load_checkpoint(saved)) if saved.exists() else []
    figures = [{"shape": list(a.shape), "dtype": str(a.dtype), "sum": float(np.sum(a, dtype=np.float64)),
                "squares": float(np.sum(np.square(a, dtype=np.float64)))} for a in model]  # fmt: skip
    return {"records": records, "model": figures}


def in_process(name: str, results: Path) -> dict[str, object]:
    """``name``'s run through the ServerApp's Message API strategy, its nodes answering in this process."""
    from app.local.message_grid import InProcessGrid
    from app.message_methods import message_strategy

    config = run_config(name, results, name)
    message_strategy(name)(run_config=config).start(grid=InProcessGrid(run_config=config, num_clients=CLIENTS))
    return kept(results / name)


def through_flwr_run(names: Iterable[str], results: Path) -> dict[str, dict[str, object]]:
    """Each method's run through Flower's simulation engine (a private local SuperLink, ``CLIENTS`` SuperNodes)."""
    from app.local.simulation import FINISHED_OK

    configs = {name: run_config(name, results, name) for name in names}
    with local_simulation(workdir=REPO) as sim:
        outcomes = sim.run_many(configs, num_supernodes=CLIENTS, ahead=3, timeout_s=600)
    failed = {name: outcome.status for name, outcome in outcomes.items() if outcome.status != FINISHED_OK}
    if failed:
        raise RuntimeError(f"runs that did not finish: {failed}")
    return {name: kept(results / name) for name in configs}


def differences(expected: object, actual: object, where: str = "") -> list[str]:
    """Where ``actual`` differs from ``expected``: floats beyond ``REL``/``ABS``, anything else at all."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        if expected.keys() != actual.keys():
            return [f"{where}: keys {sorted(set(expected) ^ set(actual))} differ"]
        return [d for k in expected for d in differences(expected[k], actual[k], f"{where}.{k}")]
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items there, {len(actual)} here"]
        return [d for i, (e, a) in enumerate(zip(expected, actual, strict=True))
                for d in differences(e, a, f"{where}[{i}]")]  # fmt: skip
    if isinstance(expected, float) or isinstance(actual, float):
        numbers = isinstance(expected, int | float) and isinstance(actual, int | float)
        both_nan = numbers and math.isnan(expected) and math.isnan(actual)
        if numbers and (both_nan or math.isclose(expected, actual, rel_tol=REL, abs_tol=ABS)):
            return []
        return [f"{where}: {expected!r} there, {actual!r} here"]
    return [] if expected == actual else [f"{where}: {expected!r} there, {actual!r} here"]


def commit() -> str:
    """The checkout's commit (with ``+`` when its tracked files differ from it)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "app", "strategies", "clients", "datasets"],
                           cwd=REPO).returncode  # fmt: skip
    return head.strip() + ("+" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    from app.registry import METHODS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help=f"run and keep the records in {RECORDS.name}")
    action.add_argument("--check", action="store_true", help="run and compare with the kept records")
    parser.add_argument("--inprocess-only", action="store_true", help="skip the flwr run half")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), help="default: every registered method")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stamen-records-") as folder:
        found = {"in-process": {name: in_process(name, Path(folder) / "in-process") for name in args.methods}}
        if not args.inprocess_only:
            found["flwr-run"] = through_flwr_run(args.methods, Path(folder) / "flwr-run")
    if args.write:
        RECORDS.write_text(json.dumps({"commit": commit(), "clients": CLIENTS, "rounds": ROUNDS, **found},
                                      indent=1, sort_keys=True) + "\n")  # fmt: skip
        print(f"wrote {RECORDS.relative_to(REPO)} ({len(args.methods)} methods, {', '.join(found)})")
        return 0
    kept_records = json.loads(RECORDS.read_text())
    failed = 0
    for way, runs in found.items():
        for name, run in runs.items():
            problems = differences(kept_records[way][name], run, name)
            failed += bool(problems)
            print(f"{way:10} {name:10} " + ("same" if not problems else f"DIFFERS: {'; '.join(problems[:4])}"))
    print(f"checked against the records of {kept_records['commit']}: {failed} run(s) differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
