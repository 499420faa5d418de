"""Per-FedAvg off the paper's MLP: FO, HF and SO side by side on FEMNIST with a ReLU CNN, and why HF diverges.

Two parts, on ``../shared/data/femnist-leaf`` (105 LEAF writers, the natural split):

(a) **The Hessian-vector product HF estimates** (in this process): for ``cnn-small``
    (ReLU) and ``mlp`` (ELU, the paper's), at the seeded initial model and after 100
    SGD steps on one writer, on 20 batches D'' of 5 and of 40 examples drawn from 20
    writers: the outer gradient g at w - alpha grad(w, D), then the exact product H g
    (double backward, SO's) against HF's central difference with the paper's step
    (w +- delta g) and with ``perfedavg-delta-scale = relative`` (w +- delta g / ||g||),
    delta = 1e-3. Reported: ||HF - SO|| / ||SO|| and ||H g|| / ||g|| (medians, maxima).
(b) **Federated runs** through Flower's simulation engine: ``cnn-small``, 10 clients a
    round, batches of 5 (D, D', D''), alpha 0.01, beta = lr = 0.1, tau 10, ``--rounds``
    rounds, for FedAvg, Per-FedAvg FO, HF, HF with the relative step, SO, and HF with
    ``max-update-ratio = 10``, SO with ``perfedavg-curvature-bound = 0.3``, and FO, HF and SO on
    ``mlp`` (ELU); ``--seeds`` seeds. Each record counts the non-finite
    replies, the round's largest update against its median, and whether the run stopped
    (``stop-after-nonfinite``, 3 consecutive rounds).

Writes ``bench/results/perfedavg_divergence.json`` and ``.md``; finished runs are kept in
``bench/results/perfedavg_divergence_runs.jsonl`` and skipped when asked again.

    python -m bench.perfedavg_divergence            # 100 rounds, 3 seeds (~30 min on 2 cores)
    python -m bench.perfedavg_divergence --quick    # part (a) on 5 batches; 20 rounds of HF and SO, one seed
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from app.local.simulation import FINISHED_OK, LocalSimulation
from bench.harness import (
    SHARED_DATA,
    RunLog,
    arguments,
    interval,
    local_simulation,
    machine,
    read_records,
    results_folder,
    write_report,
)
from clients.batches import to_tensor
from clients.losses import axpy, gradient, model_loss
from clients.meta import finite_difference_hvp, hessian_vector_product, meta_gradient
from clients.models import build_model
from datasets.leaf import load_femnist

DATA = SHARED_DATA / "femnist-leaf"
ALPHA, BETA, DELTA, TAU, BATCH = 0.01, 0.1, 1e-3, 10, 5
# The paper's estimators, whatever perfedavg-curvature-bound's default: the runs before the key existed were these
PAPER = {"perfedavg-curvature-bound": 0.0}
SO_BOUND_FROM_ABOVE = {"strategy": "perfedavg", "perfedavg-variant": "so", "perfedavg-curvature-bound": 0.3,
                       "perfedavg-beta": 0.3, "lr": 0.3}  # fmt: skip
BETA_TUNER = {"tune": "fathom", "fathom-gamma-lr": 0.1, "fathom-gamma-epochs": 0.0, "fathom-gamma-batch": 0.0}
CASES = {
    "fedavg": {"strategy": "fedavg"},
    "fo": {"strategy": "perfedavg", "perfedavg-variant": "fo", **PAPER},
    "hf": {"strategy": "perfedavg", "perfedavg-variant": "hf", **PAPER},
    "hf-relative": {"strategy": "perfedavg", "perfedavg-variant": "hf", **PAPER, "perfedavg-delta-scale": "relative"},
    "so": {"strategy": "perfedavg", "perfedavg-variant": "so", **PAPER},
    # SO with its curvature correction bounded by 0.3 ||g|| (what the default, -1, gives SO on cnn-small): on a
    # centralised proxy (30 writers pooled) unbounded SO stalled in 2 of 2 seeds, its conv layers walking on the
    # batch-5 HVP's noise (part (c); docs/methods/perfedavg.md)
    "so-bound": {"strategy": "perfedavg", "perfedavg-variant": "so", "perfedavg-curvature-bound": 0.3},
    "hf-ratio-10": {"strategy": "perfedavg", "perfedavg-variant": "hf", **PAPER, "max-update-ratio": 10.0},
    # the paper's smooth model (ELU MLP) on the same data: where HF's central difference is an estimate
    "hf-mlp": {"strategy": "perfedavg", "perfedavg-variant": "hf", **PAPER, "model": "mlp"},
    "so-mlp": {"strategy": "perfedavg", "perfedavg-variant": "so", **PAPER, "model": "mlp"},
    "fo-mlp": {"strategy": "perfedavg", "perfedavg-variant": "fo", **PAPER, "model": "mlp"},
    # (issue 26) bounded SO from beta 3x too large, fixed and tuned: FATHOM's rule with B5's hyper-step moving beta
    # only, with the stationarity test (fathom-decay-window 5) and without it (on FEMNIST the test reads the
    # initial plateau as stationarity, B2)
    "so-bound-beta-0.3": SO_BOUND_FROM_ABOVE,
    "so-bound-tuned-from-0.3": SO_BOUND_FROM_ABOVE | BETA_TUNER | {"fathom-decay-window": 5},
    "so-bound-tuned-from-0.3-no-test": SO_BOUND_FROM_ABOVE | BETA_TUNER,
}


# ------------------------------------------------------------------ (a) the estimate


def hvp_errors(model_name: str, batch: int, batches: int, trained: bool, seed: int = 0) -> dict:
    """HF's central differences against the exact product, on ``batches`` FEMNIST batches of size ``batch``."""
    source = load_femnist(DATA)
    x, y = to_tensor(source.train_x, torch.device("cpu")), torch.as_tensor(source.train_y)
    model = build_model(model_name, input_shape=(1, 28, 28), num_classes=62, seed=seed).double()
    loss_fn = model_loss(model)
    params = tuple(p.detach().double() for p in model.parameters())
    rng = np.random.default_rng(seed)
    writers = [g for g in source.train_groups if len(g) >= 3 * batch]
    if trained:  # 100 SGD steps on one writer: away from the initial point, where ReLUs are not yet sorted
        group = writers[0]
        for _ in range(100):
            idx = torch.as_tensor(rng.choice(group, BATCH, replace=False))
            grads, _ = gradient(loss_fn, params, (x[idx].double(), y[idx]))
            params = axpy(params, grads, -0.1)
    out = {"gradient": [], "relative": [], "curvature": []}
    for k in range(batches):
        group = writers[(k + 1) % len(writers)]
        d, d1, d2 = (torch.as_tensor(rng.choice(group, batch, replace=False)) for _ in range(3))
        inner, _ = gradient(loss_fn, params, (x[d].double(), y[d]))
        g, _ = gradient(loss_fn, axpy(params, inner, -ALPHA), (x[d1].double(), y[d1]))
        hessian_batch = (x[d2].double(), y[d2])
        exact = flat(hessian_vector_product(loss_fn, params, g, hessian_batch))
        for scale in ("gradient", "relative"):
            estimate = flat(finite_difference_hvp(loss_fn, params, g, hessian_batch, DELTA,
                                                  relative=scale == "relative"))  # fmt: skip
            out[scale].append(float(torch.linalg.norm(estimate - exact) / torch.linalg.norm(exact)))
        out["curvature"].append(float(torch.linalg.norm(exact) / torch.linalg.norm(flat(g))))
    spread = {name: {"median": statistics.median(values), "max": max(values)} for name, values in out.items()}
    return {"model": model_name, "batch": batch, "trained": trained, "batches": batches,
            "error-gradient": spread["gradient"], "error-relative": spread["relative"],
            "hg-over-g": spread["curvature"]}  # fmt: skip


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


# ------------------------------------------------------------------ (c) why SO stalls
PROXY_WRITERS, PROXY_STEPS, PROXY_EVERY = 30, 1500, 300
PROXY_CASES = {"fo": ("fo", 0.0), "so": ("so", 0.0), "so-bound-0.3": ("so", 0.3)}


def so_stall(seed: int, steps: int = PROXY_STEPS) -> dict:
    """Per-FedAvg's local steps on a centralised proxy: the first writers' images pooled, one model, B6's settings.

    For FO, SO and SO with ``curvature-bound 0.3``, on the same batches: test accuracy every
    ``PROXY_EVERY`` steps and, for each layer, ``alpha ||(Hg)_layer|| / ||g_layer||`` (the curvature
    correction against the gradient it corrects, median over 8 fresh batch triples) at steps 0, 50 and 300.
    """
    source = load_femnist(DATA)
    train = np.concatenate(source.train_groups[:PROXY_WRITERS])
    test = np.concatenate(source.test_groups[:PROXY_WRITERS])
    x, y = to_tensor(source.train_x[train], torch.device("cpu")), torch.as_tensor(source.train_y[train])
    x_test, y_test = to_tensor(source.test_x[test], torch.device("cpu")), torch.as_tensor(source.test_y[test])
    model = build_model("cnn-small", input_shape=(1, 28, 28), num_classes=62, seed=seed)
    loss_fn = model_loss(model)
    names = [name for name, _ in model.named_parameters()]

    def draw(generator: torch.Generator) -> tuple:
        idx = torch.randint(len(y), (BATCH,), generator=generator)
        return x[idx], y[idx]

    def layer_ratios(params: tuple) -> dict[str, float]:
        generator, ratios = torch.Generator().manual_seed(7), []
        for _ in range(8):
            inner, _ = gradient(loss_fn, params, draw(generator))
            outer, _ = gradient(loss_fn, axpy(params, inner, -ALPHA), draw(generator))
            product = hessian_vector_product(loss_fn, params, outer, draw(generator))
            ratios.append([float(ALPHA * h.norm() / (g.norm() + 1e-30)) for h, g in zip(product, outer, strict=True)])
        return dict(zip(names, np.median(np.array(ratios), axis=0).round(3).tolist(), strict=True))

    def accuracy(params: tuple) -> float:
        with torch.no_grad():
            logits = torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x_test,))
            return float((logits.argmax(1) == y_test).float().mean())

    out = {"seed": seed, "train-images": len(y), "test-images": len(y_test), "cases": {}}
    for case, (variant, bound) in PROXY_CASES.items():
        params = tuple(p.detach().clone() for p in model.parameters())
        generator, curve, ratios = torch.Generator().manual_seed(seed), [], {}
        for step in range(steps + 1):
            if step in (0, 50, 300):
                ratios[step] = layer_ratios(params)
            if step and step % PROXY_EVERY == 0:
                curve.append(round(accuracy(params), 4))
            if step < steps:
                meta = meta_gradient(loss_fn, params, (draw(generator), draw(generator), draw(generator)), alpha=ALPHA,
                                     variant=variant, curvature_bound=bound)  # fmt: skip
                params = axpy(params, meta.direction, -BETA)
        out["cases"][case] = {"accuracy-every-300": curve, "layer-ratios": ratios}
        print(f"proxy seed {seed} {case}: accuracy {curve}", flush=True)
    return out


# ------------------------------------------------------------------ (b) the runs


def run_config(case: str, seed: int, rounds: int, results: str) -> dict:
    return {"dataset": "femnist", "data-dir": str(DATA), "partitioner": "natural", "model": "cnn-small",
            "batch-size": BATCH, "perfedavg-outer-batch-size": BATCH,
            "perfedavg-hessian-batch-size": BATCH, "adapt-batch-size": BATCH, "perfedavg-alpha": ALPHA,
            "perfedavg-beta": BETA, "lr": BETA, "local-steps": TAU, "fraction-fit": 0.1, "num-server-rounds": rounds,
            "eval-every": 10, "seed": seed, "results-dir": results, "run-name": f"{case}-{seed}",
            "min-available-clients": 105} | CASES[case]  # fmt: skip


def run_case(sim: LocalSimulation, case: str, seed: int, rounds: int, results: str) -> dict:
    started = time.perf_counter()
    outcome = sim.run(run_config=run_config(case, seed, rounds, results), num_supernodes=105, timeout_s=3600,
                      extra_federation="client-resources-num-cpus=1")  # fmt: skip
    if outcome.status != FINISHED_OK:
        raise RuntimeError(f"{case} seed {seed} ended {outcome.status}:\n{outcome.log_tail}")
    records, summary = read_records(Path(results) / f"{case}-{seed}")
    ratios = [r["update-norm-max"] / r["update-norm-median"] for r in records if r.get("update-norm-median")]
    evaluated = [r for r in records if "accuracy-client-mean" in r]
    return {"case": case, "seed": seed, "rounds-asked": rounds, "status": summary["status"],
            "reason": summary.get("reason", ""), "rounds": len(records),
            "nonfinite-replies": sum(r.get("clients-nonfinite", 0) for r in records),
            "rounds-with-nonfinite": [r["round"] for r in records if r.get("clients-nonfinite", 0)],
            "outsized-replies": sum(r.get("clients-outsized", 0) for r in records),
            "update-ratio-max": max(ratios, default=float("nan")),
            "update-ratio-median": statistics.median(ratios) if ratios else float("nan"),
            "final-accuracy": evaluated[-1]["accuracy-client-mean"] if evaluated else None,
            "train-loss": [r.get("train-loss") for r in records],
            "final-beta": records[-1].get("hp-perfedavg-beta") if records else None,
            "seconds": time.perf_counter() - started}  # fmt: skip


def report(results: dict) -> str:
    lines = ["(a) ||HF - SO|| / ||SO|| (median / max) and ||Hg|| / ||g||, delta = 1e-3", "",
             "| model | batch | point | fixed step (paper) | relative step | Hg/g |",
             "|---|---:|---|---|---|---|"]  # fmt: skip
    for row in results["hvp"]:
        point = "after 100 steps" if row["trained"] else "initial"
        cells = [f"{row[k]['median']:.3g} / {row[k]['max']:.3g}" for k in ("error-gradient", "error-relative")]
        lines.append(f"| {row['model']} | {row['batch']} | {point} | {cells[0]} | {cells[1]} | "
                     f"{row['hg-over-g']['median']:.3g} / {row['hg-over-g']['max']:.3g} |")  # fmt: skip
    lines += ["", "(b) federated runs: non-finite replies, stopped runs, largest update / median, final accuracy", "",
              "| case | seeds | non-finite replies (per seed) | stopped | max update ratio | final accuracy | "
              "final beta |", "|---|---:|---|---:|---:|---|---|"]  # fmt: skip
    for case, runs in results["runs"].items():
        accuracies = [r["final-accuracy"] for r in runs if r["final-accuracy"] is not None]
        mean, half = interval(accuracies) if accuracies else (float("nan"), 0.0)
        stopped = sum(r["status"] == "stopped" for r in runs)
        lines.append(f"| {case} | {len(runs)} | {[r['nonfinite-replies'] for r in runs]} | {stopped} | "
                     f"{max(r['update-ratio-max'] for r in runs):.3g} | {mean:.4f} +- {half:.4f} | "
                     f"{', '.join(f'{b:.3g}' for r in runs if (b := r.get('final-beta')) is not None) or '-'} |")
    lines += ["", f"(c) SO's stall on a centralised proxy ({PROXY_WRITERS} writers pooled, {PROXY_STEPS} local steps): "
              f"test accuracy every {PROXY_EVERY} steps; alpha ||(Hg)_layer|| / ||g_layer|| at steps 0 / 50 / 300 for "
              "conv1's weight and the largest over the layers", "",
              "| seed | case | accuracy | conv1 weight ratio | largest layer ratio |",
              "|---:|---|---|---|---|"]  # fmt: skip
    for proxy in results.get("so-stall", []):
        for case, row in proxy["cases"].items():
            steps = sorted(row["layer-ratios"], key=int)
            first = [row["layer-ratios"][t][next(iter(row["layer-ratios"][t]))] for t in steps]
            largest = [max(row["layer-ratios"][t].values()) for t in steps]
            lines.append(f"| {proxy['seed']} | {case} | {row['accuracy-every-300']} | "
                         f"{' / '.join(f'{v:.3g}' for v in first)} | {' / '.join(f'{v:.3g}' for v in largest)} |")
    return "\n".join(lines)


def main() -> None:
    parser = arguments(__doc__, quick=True, report_only=True)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"needs {DATA} (LEAF FEMNIST)")
    out = results_folder(args.quick)
    rounds, seeds, cases = (20, 1, ("hf", "so")) if args.quick else (args.rounds, args.seeds, tuple(CASES))
    batches = 5 if args.quick else 20
    hvp = [hvp_errors(model, batch, batches, trained)
           for model in ("cnn-small", "mlp") for batch in (5, 40) for trained in (False, True)]  # fmt: skip
    print(json.dumps(hvp, indent=1), flush=True)
    stall = [so_stall(seed, 300 if args.quick else PROXY_STEPS) for seed in range(1 if args.quick else 2)]
    log = RunLog(path=out / "perfedavg_divergence_runs.jsonl", key_fields=("case", "seed", "rounds-asked"))
    if not args.report_only:
        with tempfile.TemporaryDirectory() as results, local_simulation() as sim:
            for seed in range(seeds):
                for case in cases:
                    if log.get({"case": case, "seed": seed, "rounds-asked": rounds}) is None:
                        result = run_case(sim, case, seed, rounds, results)
                        log.append(result)
                        print(f"{case} seed {seed}: {result['status']}, {result['nonfinite-replies']} non-finite, "
                              f"ratio max {result['update-ratio-max']:.3g}, acc {result['final-accuracy']}, "
                              f"{result['seconds']:.0f} s", flush=True)  # fmt: skip
    runs = {c: [log.get({"case": c, "seed": s, "rounds-asked": rounds}) for s in range(seeds)] for c in cases}
    results = {"benchmark": "perfedavg_divergence", "machine": machine(), "rounds": rounds, "seeds": seeds,
               "hvp": hvp, "so-stall": stall, "runs": {c: [r for r in rs if r] for c, rs in runs.items()}}  # fmt: skip
    write_report(out / "perfedavg_divergence.json", results, report(results) + "\n", stamped=False, indent=1)
    print(report(results))


if __name__ == "__main__":
    main()
