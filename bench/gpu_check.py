"""GPU check: Per-FedAvg's local meta-updates on the CPU and on CUDA, side by side in one process.

Two cases, each timed on ``cpu`` and on ``cuda`` with the real strategy and clients
driven in-process (``app/local/inprocess.py``: Flower's Strategy API without the
transport), after ``--warmup`` rounds:

- ``b1-hf``: benchmark B1's Per-FedAvg HF row (tau = 10, alpha = 0.01, batches of 40,
  50 users, 10 a round, the MLP) on ``--data-dir`` (MNIST 10k; the embedded sample with
  the default partition where it is absent);
- ``default-job``: the app's defaults (``flwr run .``'s job), 50 clients;
- ``cifar-fedavg-cnn`` and ``cifar-resnet18``: CIFAR-10 from ``--cifar-dir``
  (``../shared/data/cifar10-jpeg``, skipped where absent) with B8's pathological split of
  20 clients, 4 of them a round, normalised inputs: PFLlib's 4-layer CNN (batches of 10,
  10 local steps) and ResNet-18 (batches of 32, 2 local steps: a CPU round stays short).

Per round: wall seconds; per step: a round's seconds over the local steps its clients
took. Every registered method's example then runs two rounds and an evaluation
in-process on each device (its client's device handling: personal layers, control
variates, personal models). Then the default job runs once through ``flwr run`` with ``device = "cuda"`` and
``client-resources-num-gpus = 0.25`` (four clients share the GPU), to show the
deployment path end to end. Writes ``bench/results/gpu_check.json`` (medians, and
CPU / CUDA ratios).

    python -m bench.gpu_check               # on a machine with a CUDA device (a few minutes)
    python -m bench.gpu_check --cpu-only    # the CPU half only, to check the script anywhere
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from app.local.inprocess import InProcessRun
from app.registry import METHODS
from bench.harness import SHARED_DATA, arguments, local_simulation, stamp, write_report

USERS = 50
B1_HF = {
    "strategy": "perfedavg", "perfedavg-variant": "hf", "dataset": "mnist", "partitioner": "perfedavg-paper",
    "images-per-class": 34, "model": "mlp", "fraction-fit": 0.2, "aggregation": "uniform", "local-steps": 10,
    "lr": 0.1, "perfedavg-beta": 0.1, "perfedavg-alpha": 0.01, "perfedavg-delta": 1e-3, "batch-size": 40,
    "perfedavg-outer-batch-size": 40, "perfedavg-hessian-batch-size": 40, "adapt-steps": 1, "adapt-lr": 0.01,
    "adapt-batch-size": 40,
}  # fmt: skip


CIFAR_CLIENTS = 20
CIFAR = {
    "strategy": "fedavg", "dataset": "imagefolder", "classes": "airplane,automobile,bird,cat,deer,dog,frog,horse,ship,"
    "truck", "input-shape": "3x32x32", "partitioner": "pfllib-pathological", "test-fraction": 0.25,
    "input-mean": "0.4913,0.4821,0.4465", "input-std": "0.2452,0.2428,0.2606", "fraction-fit": 0.2, "lr": 0.05,
    "min-available-clients": CIFAR_CLIENTS,
}  # fmt: skip


def cases(data_dir: Path, cifar_dir: Path) -> dict[str, tuple[dict, int]]:
    """Each case's run config and its number of clients."""
    b1 = B1_HF | {"data-dir": str(data_dir)}
    if not any(data_dir.glob("**/train-images*")):
        b1 = {k: v for k, v in B1_HF.items() if k not in ("dataset", "images-per-class")}  # the embedded sample
    out = {"b1-hf": (b1, USERS), "default-job": ({}, USERS)}
    if (cifar_dir / "train").is_dir():
        cifar = CIFAR | {"data-dir": str(cifar_dir)}
        out["cifar-fedavg-cnn"] = (cifar | {"model": "fedavg-cnn", "batch-size": 10, "local-steps": 10}, CIFAR_CLIENTS)
        out["cifar-resnet18"] = (cifar | {"model": "resnet18", "batch-size": 32, "adapt-batch-size": 32,
                                          "local-steps": 2}, CIFAR_CLIENTS)  # fmt: skip
    else:
        print(f"gpu_check: no CIFAR-10 JPEG folder at {cifar_dir}; the CIFAR cases are left out", flush=True)
    return out


def time_case(config: dict, device: str, *, warmup: int, rounds: int, clients: int = USERS) -> dict:
    """Median seconds per round and per local step of ``rounds`` rounds after ``warmup``."""
    run = InProcessRun(run_config=config | {"device": device, "eval-every": 10**6, "num-server-rounds": 10**6},
                       num_clients=clients)  # fmt: skip
    round_s, step_s = [], []
    for i in range(warmup + rounds):
        started = time.perf_counter()
        metrics = run.step()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        if i >= warmup:
            round_s.append(seconds)
            step_s.append(seconds / max(1.0, float(metrics.get("client-steps", 1))))
    return {"round-seconds": statistics.median(round_s), "step-seconds": statistics.median(step_s),
            "rounds": rounds, "train-loss": metrics.get("train-loss")}  # fmt: skip


def every_method(device: str, rounds: int = 2) -> dict[str, str]:
    """Each registered method's example: ``rounds`` fit rounds and an evaluation in-process on ``device``; ok or why.

    A method's client code meets CUDA only here (personal layers merged on the device,
    control variates, personal models), so a device mistake shows as that method's error.
    """
    outcomes = {}
    for name, method in METHODS.items():
        config = {**method.contract.example, "device": device, "min-available-clients": 4,
                  "num-server-rounds": rounds, "eval-every": rounds}  # fmt: skip
        try:
            run = InProcessRun(run_config=config, num_clients=4)
            for _ in range(rounds):
                metrics = run.step()
            evaluated = run.evaluate()
            failed = run.strategy.record.get("clients-failed", 0) + evaluated.get("eval-clients-failed", 0)
            outcomes[name] = "ok" if not failed and "train-loss" in metrics else f"{failed} failed replies"
        except Exception as err:  # the report names every method's outcome, failed ones too
            outcomes[name] = f"{type(err).__name__}: {err}"
    return outcomes


def through_flower(rounds: int) -> dict:
    """The default job on the GPU through ``flwr run``: status and wall seconds."""
    with tempfile.TemporaryDirectory() as results, local_simulation() as sim:
        config = {"device": "cuda", "num-server-rounds": rounds, "results-dir": results, "run-name": "gpu"}
        outcome = sim.run(run_config=config, num_supernodes=USERS, timeout_s=900,
                          extra_federation="client-resources-num-cpus=1 client-resources-num-gpus=0.25")  # fmt: skip
        summary = json.loads((Path(results) / "gpu" / "summary.json").read_text()) if outcome.ok else {}
    return {"status": outcome.status, "wall-seconds": outcome.wall_seconds, "rounds": rounds,
            "final-personalised-accuracy": summary.get("final", {}).get("accuracy"),
            "log-tail": "" if outcome.ok else outcome.log_tail}  # fmt: skip


def main() -> None:
    # --cpu-only checks the script, not the GPU: its report is scratch, as --quick's elsewhere
    parser = arguments(__doc__, out="gpu_check.json", quick_flag="cpu_only")
    parser.add_argument("--cpu-only", action="store_true", help="time the CPU half only (no GPU needed)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--flower-rounds", type=int, default=10)
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA / "mnist-10k")
    parser.add_argument("--cifar-dir", type=Path, default=SHARED_DATA / "cifar10-jpeg")
    args = parser.parse_args()
    if not args.cpu_only and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device here (torch.cuda.is_available() is False); run it "
                         "on a GPU machine, or with --cpu-only to check the script")  # fmt: skip
    devices = ("cpu",) if args.cpu_only else ("cpu", "cuda")
    report: dict = {"benchmark": "gpu-check", **stamp(),
                    "users": USERS, "warmup": args.warmup, "cases": {}}  # fmt: skip
    for name, (config, clients) in cases(args.data_dir, args.cifar_dir).items():
        report["cases"][name] = {"config": config, "clients": clients}
        for device in devices:
            timed = time_case(config, device, warmup=args.warmup, rounds=args.rounds, clients=clients)
            report["cases"][name][device] = timed
            print(f"{name} on {device}: {timed['round-seconds']:.3f} s/round, {timed['step-seconds'] * 1e3:.2f} "
                  f"ms/step", flush=True)  # fmt: skip
        if "cuda" in devices:
            cpu, cuda = report["cases"][name]["cpu"], report["cases"][name]["cuda"]
            report["cases"][name]["cpu/cuda"] = {k: cpu[k] / cuda[k] for k in ("round-seconds", "step-seconds")}
    for device in devices:
        report[f"every-method-{device}"] = every_method(device)
        print(f"every method on {device}: {report[f'every-method-{device}']}", flush=True)
    if "cuda" in devices:
        report["flwr-run"] = through_flower(args.flower_rounds)
        print(f"default job through flwr run on the GPU: {report['flwr-run']['status']}, "
              f"{report['flwr-run']['wall-seconds']:.0f} s", flush=True)  # fmt: skip
    write_report(args.out, report, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
