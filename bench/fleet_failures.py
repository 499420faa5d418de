"""What a person sees when every node of a 100-node simulation fails the same way (issue: fleets a person can run).

Two cases through Flower's simulation engine on the embedded data, 100 SuperNodes:

- ``cuda``: ``device='cuda'`` on a machine without CUDA, so every node's client refuses;
- ``no-reply``: ``preflight-timeout=1`` (one second), so most nodes cannot answer in time.

For each: the run's status, how many lines its streamed log has and how many of them are
about the failure, those lines, and ``summary.json``'s ``failure-groups``. Writes
``bench/results/fleet_failures.json``.

    python -m bench.fleet_failures
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.harness import arguments, local_simulation, write_report

NODES = 100
# iid: 100 clients of the embedded data each get a share (the default split needs more images than it has)
CASES = {"cuda": {"device": "cuda", "partitioner": "iid"}, "no-reply": {"preflight-timeout": 1.0, "partitioner": "iid"}}


def main() -> None:
    parser = arguments(__doc__, out="fleet_failures.json")
    parser.add_argument("--nodes", type=int, default=NODES)
    args = parser.parse_args()
    out: dict[str, object] = {"nodes": args.nodes, "cases": {}}
    with tempfile.TemporaryDirectory() as results, local_simulation() as sim:
        for name, config in CASES.items():
            outcome = sim.run(run_config={**config, "results-dir": results, "run-name": name, "num-server-rounds": 2},
                              num_supernodes=args.nodes, timeout_s=900)  # fmt: skip
            lines = outcome.log.splitlines()
            failure_lines = [line for line in lines if "preflight:" in line or "refused" in line or "failed" in line]
            summary = json.loads((Path(results) / name / "summary.json").read_text())
            out["cases"][name] = {"config": config, "status": outcome.status, "log-lines": len(lines),
                                  "failure-lines": failure_lines, "reason": summary.get("reason"),
                                  "failure-groups": summary.get("failure-groups"),
                                  "wall-seconds": outcome.wall_seconds}  # fmt: skip
            print(f"{name}: {outcome.status}, {len(lines)} log lines, {len(failure_lines)} about the failure:")
            print("\n".join(f"    {line}" for line in failure_lines))
    write_report(args.out, out, stamped=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
