"""Benchmark B11's scale check: 1,000 simulated devices, 100 at once, 200 buffered updates on the virtual clock.

FedAvg on generated data (``synthetic``: one user per device), one local step of
a batch of 5, in this process (``app/local/inprocess.py``); an update every 10 replies, the
server testing nothing (the figure is the engine's own cost). Reported: the wall time of the
run (start-up and preflight apart), the process's peak memory, the virtual time reached
and the replies applied.

    python -m bench.fleet_scale --quick     # 100 devices, 10 at once, 20 updates: bench/results/quick
    python -m bench.fleet_scale             # 1,000 devices, 100 at once, 200 updates
"""

from __future__ import annotations

import json
import resource
import tempfile
import time

from bench.harness import arguments, stamp


def main() -> None:
    parser = arguments(__doc__, out="fleet_scale.json", quick="100 devices, 10 at once, 20 updates")
    args = parser.parse_args()
    devices, concurrency, updates = (100, 10, 20) if args.quick else (1000, 100, 200)
    from app.local.inprocess import served_run

    with tempfile.TemporaryDirectory() as folder:
        config = {"strategy": "fedavg", "dataset": "synthetic", "pace": "buffered", "concurrency": concurrency,
                  "buffer-size": 10, "num-server-rounds": updates, "local-steps": 1, "batch-size": 5,
                  "fraction-evaluate": 0.0, "min-available-clients": devices, "min-fit-clients": 2,
                  "fleet-off-seconds": 300.0, "fleet-on-seconds": 1800.0, "results-dir": folder,
                  "run-name": "scale"}  # fmt: skip
        started = time.perf_counter()
        strategy, grid = served_run(config, num_clients=devices)
        built = time.perf_counter()
        strategy.start(grid=grid)
        ended = time.perf_counter()
        history = strategy.method.history
        timing = strategy.method.watch.timing
    report = {"benchmark": "B11 scale", **stamp(), "devices": devices,
              "concurrency": concurrency, "updates": len(history), "build-seconds": built - started,
              "run-seconds": ended - built, "preflight-seconds": timing.get("preflight-seconds"),
              "updates-seconds": (ended - built) - timing.get("preflight-seconds", 0.0),
              "peak-rss-mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "virtual-seconds": history[-1]["virtual-seconds"],
              "replies-applied": sum(r["clients-succeeded"] for r in history),
              "left": sum(r.get("clients-left", 0) for r in history)}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
