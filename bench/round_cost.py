"""B8's round at the cost of its compute: stamen's FedAvg round beside a plain PyTorch loop of the same work.

The work is B8's FedAvg round on the pathological split (20 clients, each 10 SGD steps of
batch 10 at lr 0.05 on FedAvgCNN from the global model; the server averages by examples).
Three ways, in one invocation on the same clients' tensors:

- **plain**: a loop a person would write: per client ``load_state_dict`` of the global
  model, ``torch.optim.SGD`` over 10 batches drawn from a permutation, the state dict
  kept; the average of the 20 state dicts;
- **in-process**: stamen's round engine and clients through Flower's messages in this
  process (``InProcessRun.step``: the train messages, the clients' ``fit`` with the
  wire encoding of the arrays, screening, aggregation);
- **flwr run**: the same run config through Flower's simulation (20 SuperNodes, one
  CPU each: two workers, one thread each), its ``round-seconds`` from ``metrics.jsonl``
  (the last round, which also evaluates, and the first, which warms up, left out). With
  ``STAMEN_PROFILE`` set (``app/message_cost.py``) every fit message's seconds inside
  stamen's ClientApp are split into ``data`` (the client's data), ``build`` (settings,
  model, client) and ``work`` (training, with the arrays' decoding and encoding); a
  round's time inside the ClientApps is the busiest worker's sum, the rest is Flower's
  (its messages, Ray, the grid's polling) and the server's.

``plain`` and ``in-process`` alternate round by round (``--rounds`` each after one warm-up
round), so the machine's drift falls on both; the ratio is of their medians. ``flwr run``
goes after them. Every figure uses torch's default threads (2 here).

Usage::

    python -m bench.round_cost            # 12 rounds each, flwr run 8 rounds
    python -m bench.round_cost --quick    # 3 rounds each, no flwr run (scratch)
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.cifar_setup import CLIENTS, run_config
from bench.harness import arguments, local_simulation, read_records, write_report


def plain_round(model, global_state: dict, data: list[tuple], *, lr: float, steps: int, batch: int, rng) -> dict:
    """One FedAvg round in plain PyTorch: every client from ``global_state``, the example-weighted average."""
    import torch
    from torch.nn import functional as F

    states, weights = [], []
    for x, y in data:
        model.load_state_dict(global_state)
        optimiser = torch.optim.SGD(model.parameters(), lr=lr)
        order, cursor = rng.permutation(len(y)), 0
        for _ in range(steps):
            if cursor + batch > len(y):
                order, cursor = rng.permutation(len(y)), 0
            index = torch.as_tensor(order[cursor : cursor + batch])
            cursor += batch
            optimiser.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimiser.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        weights.append(len(y))
    total = sum(weights)
    return {k: sum(w / total * s[k] for w, s in zip(weights, states, strict=True)) for k in global_state}


def side_by_side(rounds: int) -> dict:
    """``rounds`` rounds each of the plain loop and stamen in this process, alternating, after one warm-up each."""
    import numpy as np

    from app.local.inprocess import InProcessRun
    from clients.models import build_model

    config = run_config("pathological", "fedavg", seed=0, rounds=10**6, threads=0)
    run = InProcessRun(run_config=config, num_clients=CLIENTS)
    data = [(c.train_x, c.train_y) for c in run.clients]  # the very tensors stamen's clients train on
    model = build_model("fedavg-cnn", input_shape=(3, 32, 32), num_classes=10, seed=0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    seconds: dict[str, list[float]] = {"plain": [], "in-process": []}
    for index in range(rounds + 1):
        tick = time.perf_counter()
        state = plain_round(model, state, data, lr=config["lr"], steps=config["local-steps"],
                            batch=config["batch-size"], rng=rng)  # fmt: skip
        plain = time.perf_counter() - tick
        tick = time.perf_counter()
        run.step()
        stamen = time.perf_counter() - tick
        if index > 0:
            seconds["plain"].append(plain)
            seconds["in-process"].append(stamen)
        print(f"round {index}: plain {plain:.3f} s, in-process {stamen:.3f} s", flush=True)
    return seconds


def through_flower(rounds: int) -> tuple[list[float], dict[str, list[float]]]:
    """``round-seconds`` of a ``flwr run`` of the same config (rounds 2 to ``rounds - 1``), and their parts."""
    with tempfile.TemporaryDirectory() as results:
        profile = Path(results) / "messages.jsonl"
        config = {**run_config("pathological", "fedavg", seed=0, rounds=rounds, threads=1), "eval-every": rounds,
                  "results-dir": results, "run-name": "round-cost"}  # fmt: skip
        with local_simulation(env={"STAMEN_PROFILE": str(profile)}) as sim:
            outcome = sim.run(run_config=config, num_supernodes=CLIENTS, timeout_s=1800,
                              extra_federation="client-resources-num-cpus=1")  # fmt: skip
        if not outcome.ok:
            raise SystemExit(f"round cost: flwr run ended {outcome.status}\n{outcome.log_tail}")
        records, _ = read_records(Path(results) / "round-cost")
        messages = [json.loads(line) for line in profile.read_text().splitlines()] if profile.exists() else []
    kept = [r["round"] for r in records[1:-1]]
    return [r["round-seconds"] for r in records[1:-1]], parts_of(messages, kept)


def parts_of(messages: list[dict], rounds: list[int]) -> dict[str, list[float]]:
    """Per kept round: the fit messages' summed wall seconds per phase, and the busiest worker's total."""
    parts: dict[str, list[float]] = {"data": [], "build": [], "work": [], "busiest-worker": []}
    for round_ in rounds:
        fits = [m for m in messages if m["kind"] == "train" and str(m["round"]) == str(round_)]
        for phase in ("data", "build", "work"):
            parts[phase].append(sum(m["phases"].get(phase, {"wall": 0.0})["wall"] for m in fits))
        workers: dict[int, float] = {}
        for m in fits:
            inside = sum(m["phases"][p]["wall"] for p in ("data", "build", "work") if p in m["phases"])
            workers[m["pid"]] = workers.get(m["pid"], 0.0) + inside
        parts["busiest-worker"].append(max(workers.values(), default=0.0))
    return parts


def main() -> None:
    parser = arguments(__doc__, out="round_cost.json", quick="3 rounds each, no flwr run")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--flower-rounds", type=int, default=8)
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    seconds = side_by_side(rounds)
    parts = {}
    if not args.quick:
        seconds["flwr-run"], parts = through_flower(args.flower_rounds)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    report = {"benchmark": "B8 round cost", "work": "20 clients x 10 SGD steps of batch 10, FedAvgCNN, CIFAR-10",
              "seconds": seconds, "median-seconds": medians,
              "ratio-to-plain": {name: medians[name] / medians["plain"] for name in medians},
              "flwr-run-parts": parts,
              "flwr-run-parts-median": {k: statistics.median(v) for k, v in parts.items() if v}}  # fmt: skip
    lines = ["| way | median s / round | x plain | rounds |", "|---|---|---|---|"]
    lines += [f"| {name} | {medians[name]:.3f} | {report['ratio-to-plain'][name]:.2f} | {len(seconds[name])} |"
              for name in medians]  # fmt: skip
    if report["flwr-run-parts-median"]:
        lines += ["", "flwr run, inside stamen's ClientApps (fit messages, seconds summed over a round's 20): " +
                  ", ".join(f"{k} {v:.3f}" for k, v in report["flwr-run-parts-median"].items())]  # fmt: skip
    write_report(args.out, report, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
