"""Measure the README's main job: `flwr run .` with the default config on 50 supernodes (1 CPU each).

Runs the job through Flower's simulation engine (a private local SuperLink, the
app's defaults untouched) ``--repeats`` times and records, for each repeat, the
wall time from submission to the finished status and the final personalised
accuracy from the run's ``summary.json``. Writes ``bench/results/main_job.json``
with the medians. Client sampling is not seeded by Flower, so repeats differ a little.

    python -m bench.main_job --repeats 3
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from bench.harness import arguments, local_simulation, stamp, write_report

NUM_SUPERNODES = 50
FEDERATION = "client-resources-num-cpus=1"  # as in the README's quick start: two clients at a time on 2 cores


def main() -> None:
    parser = arguments(__doc__, out="main_job.json")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as results:
        for repeat in range(args.repeats):
            with local_simulation() as sim:
                name = f"main-{repeat}"
                outcome = sim.run(
                    run_config={"results-dir": results, "run-name": name},
                    num_supernodes=NUM_SUPERNODES,
                    extra_federation=FEDERATION,
                )
            if not outcome.ok:
                raise SystemExit(f"run {repeat} ended {outcome.status}:\n{outcome.log_tail}")
            summary = json.loads((Path(results) / name / "summary.json").read_text())
            assert summary["settings"]["strategy"] == summary["strategy"]
            final = summary["final"]
            runs.append(
                {
                    "wall-seconds": outcome.wall_seconds,
                    "server-seconds": summary["total-seconds"],
                    "accuracy": final["accuracy"],
                    "accuracy-client-mean": final["accuracy-client-mean"],
                    "global-accuracy": final["global-accuracy"],
                    "accuracy-min": final["accuracy-min"],
                }
            )
            print(f"repeat {repeat}: {runs[-1]}", flush=True)
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    report = {
        "what": f"flwr run . (default config) with num-supernodes={NUM_SUPERNODES} {FEDERATION}, submit to finish",
        "strategy": summary["strategy"],
        **stamp(),
        "repeats": runs,
        "median": medians,
    }
    write_report(args.out, report)
    print(json.dumps(report["median"], indent=2))


if __name__ == "__main__":
    main()
