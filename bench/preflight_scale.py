"""How the preflight's wall time grows with the nodes asked, and what one node's first message costs.

FEMNIST's natural split (one writer per node, ``../shared/data/femnist-leaf``), 10, 50 and
105 simulated nodes with one CPU each (two run at a time on 2 cores), one round: the
preflight asks every node once. ``STAMEN_PROFILE`` makes every ClientApp message write
its cost by phase (``app/message_cost.py``): ``imports`` (torch and stamen, a worker's
first message only), ``data`` (loading the node's writer: the LEAF JSON is parsed once per
worker process and cached), ``build`` (settings and model) and ``work`` (the answer).
Writes ``bench/results/preflight_scale.{json,md}``.

    python -m bench.preflight_scale
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

from bench.harness import SHARED_DATA, arguments, local_simulation, write_report

SIZES = (10, 50, 105)
FEMNIST = Path(os.environ.get("STAMEN_SHARED_DATA", SHARED_DATA)) / "femnist-leaf"


def phases_of(messages: list[dict], first: bool) -> dict[str, float]:
    """Median CPU seconds per phase of the preflight's messages (a worker's first ones, or the others)."""
    chosen = [m for m in messages if m["kind"] == "get_properties" and m["first-in-process"] == first]
    names = sorted({name for m in chosen for name in m["phases"]})
    return {name: statistics.median(m["phases"][name]["cpu"] for m in chosen if name in m["phases"])
            for name in names} | {"messages": len(chosen)}  # fmt: skip


def main() -> None:
    parser = arguments(__doc__, out="preflight_scale.json")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args()
    if not FEMNIST.is_dir():
        raise SystemExit(f"{FEMNIST} is absent (set STAMEN_SHARED_DATA)")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for nodes in args.sizes:
            profile = Path(work) / f"profile-{nodes}.jsonl"
            os.environ["STAMEN_PROFILE"] = str(profile)
            config = {"dataset": "femnist", "data-dir": str(FEMNIST), "partitioner": "natural", "model": "cnn-small",
                      "strategy": "fedavg", "num-server-rounds": 1, "fraction-fit": 0.1, "fraction-evaluate": 0.0,
                      "results-dir": str(Path(work) / "results"), "run-name": f"n{nodes}"}  # fmt: skip
            with local_simulation() as sim:
                outcome = sim.run(run_config=config, num_supernodes=nodes, timeout_s=1800,
                                  extra_federation="client-resources-num-cpus=1")  # fmt: skip
            os.environ.pop("STAMEN_PROFILE")
            if not outcome.ok:
                raise SystemExit(f"{nodes} nodes: {outcome.status}\n{outcome.log_tail}")
            summary = json.loads((Path(work) / "results" / f"n{nodes}" / "summary.json").read_text())
            messages = [json.loads(line) for line in profile.read_text().splitlines()]
            rows.append({"nodes": nodes, "preflight-seconds": summary["timing"]["preflight-seconds"],
                         "nodes-connected-seconds": summary["timing"]["nodes-connected-seconds"],
                         "run-wall-seconds": outcome.wall_seconds, "first-message": phases_of(messages, True),
                         "later-messages": phases_of(messages, False)})  # fmt: skip
            print(json.dumps(rows[-1]))
    lines = ["| nodes | preflight s | per node s | a worker's first message: imports / data / build / work CPU-s | "
             "any other: data / build / work CPU-s |", "|---:|---:|---:|---|---|"]  # fmt: skip
    for row in rows:
        first, later = row["first-message"], row["later-messages"]
        per_node = row["preflight-seconds"] / row["nodes"]
        lines.append(f"| {row['nodes']} | {row['preflight-seconds']:.1f} | {per_node:.2f} | "
                     f"{first.get('imports', 0):.2f} / {first.get('data', 0):.2f} / {first.get('build', 0):.2f} / "
                     f"{first.get('work', 0):.2f} ({first['messages']} messages) | {later.get('data', 0):.3f} / "
                     f"{later.get('build', 0):.3f} / {later.get('work', 0):.3f} ({later['messages']}) |")  # fmt: skip
    write_report(args.out, {"rows": rows}, "\n".join(lines) + "\n", stamped=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
