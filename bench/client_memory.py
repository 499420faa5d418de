"""Peak memory of a ClientApp process, per model and batch size: what an edge device must hold.

In a deployment every message runs in a fresh ``flwr-clientapp`` process, so a
SuperNode's peak memory is that process's. This script starts one fresh Python
process per (strategy, model, batch size) that does what ``flwr-clientapp`` does
for a training message: import Flower's ClientApp runtime and stamen's ClientApp,
run ``client_fn`` (load and split the data, build the model), then ``fit`` once
and ``evaluate`` once. The process reports its peak resident set size
(``getrusage(RUSAGE_SELF).ru_maxrss``) after each phase; torch runs on one thread
on the CPU, as the README advises for small devices.

    python -m bench.client_memory            # writes bench/results/client_memory.{json,md}
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import time

from bench.harness import REPO, RESULTS, arguments, machine, script_command, write_report

CASES = [  # (strategy, model, batch sizes)
    ("fedavg", "logreg", (10, 128)),
    ("fedavg", "mlp", (10, 128)),
    ("perfedavg", "mlp", (10, 128)),
    ("fedavg", "cnn-small", (10, 128)),
    ("fedavg", "cnn", (10, 128)),
    ("perfedavg", "cnn", (10, 128)),
]


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def child(strategy: str, model: str, batch: int) -> None:
    """One measurement, in this fresh process; prints one JSON line."""
    phases = {"python": peak_mib()}
    import flwr.supernode.runtime.run_clientapp  # noqa: F401  (what flwr-clientapp imports first)
    import tomllib
    from flwr.common import Context, RecordDict

    from app.client_app import client_fn

    phases["imports"] = peak_mib()
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    config.update({"strategy": strategy, "model": model, "batch-size": batch, "perfedavg-outer-batch-size": batch,
                   "perfedavg-hessian-batch-size": batch, "adapt-batch-size": batch, "images-per-class": 166,
                   "device": "cpu", "num-threads": 1})  # fmt: skip
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 2}, state=RecordDict(),
                      run_config=config)  # fmt: skip
    client = client_fn(context)
    phases["client_fn"] = peak_mib()
    numpy_client = client.numpy_client if hasattr(client, "numpy_client") else client
    parameters = numpy_client.get_parameters({})
    fit_config = {"lr": 0.05, "local-steps": 10, "local-epochs": 0.0, "batch-size": batch, "server-round": 1,
                  "perfedavg-alpha": 0.05, "perfedavg-beta": 0.05, "perfedavg-delta": 0.001, "perfedavg-variant": "hf",
                  "perfedavg-outer-batch-size": batch, "perfedavg-hessian-batch-size": batch}  # fmt: skip
    started = time.perf_counter()
    numpy_client.fit(parameters, fit_config)
    fit_seconds = time.perf_counter() - started
    phases["fit"] = peak_mib()
    numpy_client.evaluate(parameters, {"adapt-steps": 1, "adapt-lr": 0.05, "adapt-batch-size": batch,
                                       "server-round": 1})  # fmt: skip
    phases["evaluate"] = peak_mib()
    print(json.dumps({"strategy": strategy, "model": model, "batch-size": batch, "peak-mib": phases,
                      "fit-seconds": fit_seconds, "train-examples": len(numpy_client.train_y)}))  # fmt: skip


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--child", nargs=3, metavar=("STRATEGY", "MODEL", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    rows = []
    for strategy, model, batches in CASES:
        for batch in batches:
            out = subprocess.run([*script_command(__file__), "--child", strategy, model, str(batch)], cwd=REPO,
                                 capture_output=True, text=True, check=True)  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"{strategy:10s} {model:10s} batch {batch:4d}: peak {row['peak-mib']['evaluate']:.0f} MiB "
                f"(after imports {row['peak-mib']['imports']:.0f}, fit {row['fit-seconds']:.2f} s)",
                flush=True,
            )
    payload = {"benchmark": "client-memory", "machine": machine(), "data": "mnist-5k, partition 0 of 2 (830 images)",
               "method": "ru_maxrss of a fresh process: flwr ClientApp runtime + stamen client_fn + 1 fit + 1 evaluate",
               "rows": rows}  # fmt: skip
    lines = ["| strategy | model | batch | after imports (MiB) | after client_fn | peak (fit + evaluate) | fit s |",
             "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        p = r["peak-mib"]
        lines.append(f"| {r['strategy']} | {r['model']} | {r['batch-size']} | {p['imports']:.0f} | "
                     f"{p['client_fn']:.0f} | {p['evaluate']:.0f} | {r['fit-seconds']:.2f} |")  # fmt: skip
    write_report(RESULTS / "client_memory.json", payload, "\n".join(lines) + "\n", stamped=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
