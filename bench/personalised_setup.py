"""B7's and B9's setting, shared by the scripts that run it: datasets, shared keys, each method's keys, B9's search.

B7 (``bench/personalised_table.py``) runs every method on each :data:`DATASETS` entry
with :data:`SHARED` and :data:`METHOD_KEYS`; B9 (``bench/tuned_table.py``) searches each
method's :data:`SPACES` around them; ``bench/unseen_classes.py``,
``bench/scaffold_plateau.py`` and ``bench/honest_screen.py`` rerun their configurations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from app.config import parse_settings
from bench.harness import RESULTS, SHARED_DATA
from datasets import DataSpec, load_source
from datasets.tools.device_folders import CLASSES, INPUT_SHAPE, write_split

# PFLlib's benchmark, FMNIST with a pathological split, 20 clients (personalised accuracy, %)
PUBLISHED = {"fedavg": 80.4, "perfedavg": 99.2, "pfedme": 99.4, "ditto": 99.4, "fedrep": 99.6}
PUBLISHED_ORDER = sorted(PUBLISHED, key=PUBLISHED.get)


@dataclass(frozen=True)
class Dataset:
    """One of B7's datasets: its run-config keys, clients and rounds."""

    label: str
    config: dict
    clients: int
    rounds: int
    model: str = "mlp"
    needs: str = ""  # the folder under ../shared/data it reads, if any
    shared: dict = field(default_factory=dict)  # the shared keys it sets otherwise than SHARED
    per_round: int = 10  # clients sampled for training each round
    methods: tuple[str, ...] = ()  # the methods it runs; () for every registered one

    def lr(self) -> float:
        return float({**SHARED, **self.shared}["lr"])


DATASETS = {
    "mnist-paper": Dataset("embedded MNIST, Per-FedAvg paper split (50 users, a = 8)",
                           {"dataset": "mnist-5k", "partitioner": "perfedavg-paper"}, 50, 100),
    "femnist": Dataset("FEMNIST (LEAF sample), natural split (105 writers)",
                       {"dataset": "femnist", "partitioner": "natural"}, 105, 100, model="cnn-small",
                       needs="femnist-leaf", shared={"lr": 0.1, "batch-size": 16, "adapt-batch-size": 16}),
    "mnist-folder-dirichlet": Dataset("MNIST 10k as an image folder, Dirichlet(0.1) label skew (50 users)",
                                      {"dataset": "imagefolder", "classes": CLASSES, "input-shape": INPUT_SHAPE,
                                       "partitioner": "dirichlet", "dirichlet-concentration": 0.1},
                                      50, 100, needs="mnist-10k"),
    # PFLlib's setting as near as 2 cores allow: 20 clients of 2 classes each, all of them every round
    "mnist-pathological": Dataset("MNIST 10k, 2 classes per client (PFLlib's pathological split), 20 users, all "
                                  "every round", {"dataset": "mnist", "partitioner": "shards", "classes-per-client": 2},
                                  20, 100, needs="mnist-10k", per_round=20, methods=tuple(PUBLISHED_ORDER)),
}  # fmt: skip
# equal for every method: the main job's local work and step, about 10 clients a round, uniform averaging,
# and one adaptation step at test time for the methods that test the model they receive
SHARED = {"lr": 0.05, "local-steps": 10, "batch-size": 10, "aggregation": "uniform", "adapt-steps": 1,
          "adapt-batch-size": 10, "min-fit-clients": 2}  # fmt: skip
# each method's own keys, and where their values come from; the variant of Per-FedAvg depends on the model
METHOD_KEYS: dict[str, tuple[dict, str]] = {
    "fedavg": ({}, "no keys of its own"),
    "perfedavg": ({}, "beta = the shared lr; on the MLP the main job's alpha 0.05 (a row of the paper's Table 1) "
                  "and variant hf (the paper's best), on cnn-small B6's alpha 0.01 and variant so (B6: hf never "
                  "trains on a ReLU network)"),
    "fathom": ({"local-epochs": 1.0}, "its Algorithm 1 defaults; it must start from local-epochs > 0 (1 here), the "
               "one shared key it moves"),
    "diffusion": ({}, "ring graph, Metropolis weights, mu = the shared lr, T = local-steps; each agent takes part "
                  "with the probability that gives about 10 agents a round"),
    "fedprox": ({"fedprox-mu": 0.01}, "mu 0.01, the middle of the paper's grid {0.001, 0.01, 0.1, 1}"),
    "ditto": ({"ditto-lambda": 0.1, "ditto-personal-steps": 10},
              "lambda 0.1 (in the paper's range for FEMNIST), personal steps = local-steps, personal lr = the shared "
              "lr"),
    "scaffold": ({"scaffold-server-lr": 1.0}, "eta_g = 1 (the paper's experiments)"),
    "fedrep": ({"fedrep-personal-layers": 1, "fedrep-head-steps": 10},
               "the last layer as head; 10 head steps before the 10 body steps (the paper runs 10 head epochs "
               "per body epoch: 10x the head work)"),
    "fedper": ({"fedper-personal-layers": 1}, "the last layer as head"),
    "pfedme": ({"pfedme-lambda": 15.0, "pfedme-personal-lr": 0.1, "pfedme-inner-steps": 5, "pfedme-beta": 1.0},
               "the paper's MNIST setting (lambda 15, personal step 0.1, K 5, beta 1), R = local-steps; where the "
               "shared lr times 15 reaches 1 (FEMNIST's 0.1), lambda = 0.5 / lr, since w_k moves lr * lambda of the "
               "way to theta each local round and overshoots past 1"),
    "apfl": ({"apfl-alpha": 0.25}, "alpha from 0.25 (one of the paper's fixed values), adapted with the shared lr "
             "as its step"),
}  # fmt: skip


# the step sizes B7 ties to the shared lr (B9 ties them to each configuration's lr the same way)
TIED_STEPS = {"perfedavg": "perfedavg-beta", "diffusion": "diffusion-mu", "ditto": "ditto-personal-lr",
              "apfl": "apfl-alpha-lr"}  # fmt: skip


def tied_steps(method: str, lr: float, dataset: Dataset) -> dict:
    """The keys B7 sets from the step size: the tied step size, and diffusion's participation (B7's clients a round)."""
    keys = {TIED_STEPS[method]: lr} if method in TIED_STEPS else {}
    if method == "diffusion":
        keys["diffusion-participation"] = dataset.per_round / dataset.clients
    return keys


def own_keys(method: str, dataset: Dataset) -> dict:
    """``METHOD_KEYS``' values, with the step sizes they name tied to the dataset's shared lr."""
    keys, lr, cnn = dict(METHOD_KEYS.get(method, ({}, ""))[0]), dataset.lr(), dataset.model.startswith("cnn")
    if method == "perfedavg":
        keys.update({"perfedavg-alpha": 0.01 if cnn else 0.05, "perfedavg-variant": "so" if cnn else "hf",
                     "perfedavg-curvature-bound": 0.0})  # fmt: skip  # the paper's estimator, as B7 was run
    elif method == "pfedme" and lr * keys["pfedme-lambda"] >= 1:
        keys["pfedme-lambda"] = 0.5 / lr
    return keys | tied_steps(method, lr, dataset)


def data_dir_of(dataset: Dataset, folder: Path | None) -> dict:
    """The ``data-dir`` key a dataset needs: the image folder written for it, or its folder under ../shared/data."""
    if dataset.config["dataset"] == "imagefolder" and folder is not None:
        return {"data-dir": str(folder)}
    return {"data-dir": str(SHARED_DATA / dataset.needs)} if dataset.needs else {}


def base_config(method: str, dataset: Dataset, *, seed: int, rounds: int, folder: Path | None) -> dict:
    """What every B7 and B9 run of ``method`` on ``dataset`` shares: the data, the model, B7's clients a round."""
    return {**SHARED, **dataset.shared, **dataset.config, **data_dir_of(dataset, folder), "model": dataset.model,
            "strategy": method, "seed": seed, "num-server-rounds": rounds,
            "fraction-fit": min(1.0, (dataset.per_round + 0.5) / dataset.clients),
            "min-available-clients": dataset.clients}  # fmt: skip


def image_folder(cache: Path) -> Path:
    """``../shared/data/mnist-10k`` as ``train/<digit>/`` and ``test/<digit>/`` PNGs in ``cache`` (written once)."""
    done = cache / "complete"
    if not done.exists():
        source = load_source(DataSpec(name="mnist", data_dir=str(SHARED_DATA / "mnist-10k")))
        write_split(cache / "train", source.train_x, source.train_y)
        write_split(cache / "test", source.test_x, source.test_y)
        done.write_text("10000 train and 10000 test images of ../shared/data/mnist-10k\n")
    return cache


def personalised_run_config(
    method: str, dataset: Dataset, *, seed: int, rounds: int, results: str, name: str, folder: Path
) -> dict:
    """One B7 run's run config: :func:`base_config`, evaluated twice, with the method's own keys."""
    config = {**base_config(method, dataset, seed=seed, rounds=rounds, folder=folder),
              "eval-every": max(1, rounds // 2), "results-dir": results, "run-name": name,
              **own_keys(method, dataset)}  # fmt: skip
    parse_settings(config)  # a bad key fails here, before any run starts
    return config


CONFIGS = 8  # per method and dataset, B7's shared setting included
VALIDATION = 0.2  # the share of each client's training data the search scores on
SEARCH_SEED = 0
TEST_SEEDS = (0, 1, 2)
LR_RANGE = (0.01, 0.3)  # the step size's range, log-uniform, for every method
DIVERGED_ROUNDS = 3  # a run stops once its train loss has been non-finite this many rounds in a row
SOBOL_SEED = 39


@dataclass(frozen=True)
class Dim:
    """One searched key: log-uniform or uniform over ``[low, high]``, an integer range, or a choice."""

    key: str
    kind: str  # "log", "linear", "int" or "choice"
    low: float = 0.0
    high: float = 0.0
    choices: tuple = ()

    def value(self, u: float):
        """The key's value at ``u`` in [0, 1)."""
        if self.kind == "log":
            return float(math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low))))
        if self.kind == "linear":
            return float(self.low + u * (self.high - self.low))
        if self.kind == "int":
            return int(self.low + math.floor(u * (self.high - self.low + 1)))
        return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]


# each method's own searched keys, beside the step size, and why these ranges
SPACES: dict[str, tuple[tuple[Dim, ...], str]] = {
    "fedavg": ((), "the step size only"),
    "fedprox": ((Dim("fedprox-mu", "log", 1e-3, 1.0),), "mu over the paper's grid {0.001, 0.01, 0.1, 1}"),
    "ditto": ((Dim("ditto-lambda", "log", 0.01, 2.0), Dim("ditto-personal-steps", "int", 5, 40)),
              "lambda over the paper's grid {0.01, 0.1, 1, 2}; personal steps from half to 4x local-steps "
              "(the personal model trains only when its client is sampled); personal lr = lr"),
    "scaffold": ((Dim("scaffold-server-lr", "linear", 0.5, 1.0),), "eta_g from 0.5 to the paper's 1"),
    "fedrep": ((Dim("fedrep-head-steps", "int", 1, 40), Dim("fedrep-personal-layers", "choice", choices=(1, 2))),
               "head steps from 1 to 4x local-steps (the paper: 10 head epochs per body epoch); the last one or "
               "two layers as head"),
    "fedper": ((Dim("fedper-personal-layers", "choice", choices=(1, 2)),), "the last one or two layers as head"),
    "pfedme": ((Dim("pfedme-lambda", "log", 1.0, 30.0), Dim("pfedme-personal-lr", "log", 0.01, 0.1)),
               "lambda over the paper's {15, 20, 30} and below, capped at 0.5 / lr (past lr * lambda = 1 the "
               "local model overshoots theta); personal step over the paper's {0.01, ..., 0.1}; K 5, beta 1"),
    "apfl": ((Dim("apfl-alpha", "linear", 0.1, 0.75),), "alpha's start over the paper's fixed values 0.25-0.75 "
             "and below; alpha's own step = lr"),
    "perfedavg": ((Dim("perfedavg-alpha", "log", 1e-3, 0.1), Dim("perfedavg-variant", "choice", choices=("fo", "x"))),
                  "alpha over 0.001-0.1 (the paper's Table 1: 0.001-0.05); variant fo or B7's (hf on the MLP, so "
                  "on cnn-small, the curvature bound at its default); beta = lr"),
    "fathom": ((Dim("fathom-gamma-lr", "log", 1e-3, 0.1), Dim("fathom-gamma-epochs", "log", 1e-3, 0.1)),
               "its hyper-steps of lr and epochs over 0.1x-10x the paper's 0.01; start lr from the search, "
               "local-epochs 1"),
    "diffusion": ((Dim("diffusion-graph", "choice", choices=("ring", "erdos-renyi", "full")),
                   Dim("diffusion-combination", "choice", choices=("metropolis", "uniform"))),
                  "the graph (ring, Erdos-Renyi p = 0.3, complete) and the combination rule; mu = lr, "
                  "participation B7's"),
    "fedproto": ((Dim("fedproto-lambda", "log", 0.1, 10.0),), "lambda over 0.1-10 (the paper's default 1)"),
    "fedamp": ((Dim("fedamp-lambda", "log", 0.1, 10.0), Dim("fedamp-alpha-k", "linear", 0.1, 0.9)),
               "lambda over 0.1-10, alpha_k over 0.1-0.9 (the released code's 0.5 in the middle)"),
    "moon": ((Dim("moon-mu", "log", 0.1, 10.0),), "mu over the paper's grid {0.1, 1, 5, 10}"),
}  # fmt: skip
B7_METHODS = ("fedavg", "perfedavg", "fathom", "diffusion", "fedprox", "ditto", "scaffold", "fedrep", "fedper",
              "pfedme", "apfl")  # fmt: skip
TUNED_KEY_FIELDS = ("dataset", "method", "phase", "config", "seed", "rounds")
B7_RESULTS = RESULTS / "personalised_table.json"


def step_key(method: str) -> str:
    return {"perfedavg": "perfedavg-beta", "diffusion": "diffusion-mu"}.get(method, "lr")


def search_space(method: str, dataset: str, count: int = CONFIGS) -> list[dict]:
    """The ``count`` configurations searched: B7's own keys at the shared lr, then Sobol points.

    Each is the method's keys and ``lr`` (with the step sizes B7 ties to it); the same
    method on the same dataset always gets the same list.
    """
    import torch

    data = DATASETS[dataset]
    shared = {"lr": data.lr(), **own_keys(method, data)}
    dims, _ = SPACES[method]
    cnn = data.model.startswith("cnn")
    configs = [shared]
    if count < 2:
        return configs
    points = torch.quasirandom.SobolEngine(1 + len(dims), scramble=True, seed=SOBOL_SEED).draw(count - 1).tolist()
    for u in points:
        lr = Dim("lr", "log", *LR_RANGE).value(u[0])
        config = {**own_keys(method, data), "lr": lr}  # B7's fixed keys, then the searched ones over them
        config.pop("perfedavg-curvature-bound", None)  # the searched variants take the contract's default
        for dim, coordinate in zip(dims, u[1:], strict=True):
            value = dim.value(coordinate)
            if dim.key == "perfedavg-variant" and value == "x":
                value = "so" if cnn else "hf"
            config[dim.key] = value
        configs.append(tie_steps(method, config, data))
    return configs


def tie_steps(method: str, config: dict, data: Dataset) -> dict:
    """The step sizes B7 ties to ``lr``, set from this configuration's ``lr``.

    pFedMe's lambda is capped at 0.5 / lr in every configuration (B7 caps it only once
    lr x lambda reaches 1): its personal problem needs lr x lambda < 1 to contract.
    """
    config = {**config, **tied_steps(method, config["lr"], data)}
    if method == "pfedme":
        config["pfedme-lambda"] = min(config["pfedme-lambda"], 0.5 / config["lr"])
    return config


def tuned_run_config(dataset: str, method: str, keys: dict, *, seed: int, rounds: int, validation: float,
               folder: Path | None) -> dict:  # fmt: skip
    config = {**base_config(method, DATASETS[dataset], seed=seed, rounds=rounds, folder=folder),
              "eval-every": rounds, "num-threads": 1, "validation-fraction": validation, **keys}  # fmt: skip
    parse_settings(config)  # a bad key fails here, before any run starts
    return config


def selftuned_keys(method: str, dataset: str) -> dict | None:
    """B7's shared setting with ``tune = "fathom"``, for a method whose contract is tunable (else None)."""
    from app.registry import METHODS

    if method == "fathom" or METHODS[method].contract.tunable is None:
        return None
    return {**search_space(method, dataset, 1)[0], "tune": "fathom"}


def keys_of(job: dict) -> dict:
    if job["phase"] == "self-tuned":
        return selftuned_keys(job["method"], job["dataset"])
    keys = search_space(job["method"], job["dataset"])[job["config"]]
    if job["phase"] == "all-clients":  # the cause measured: visits; every client (agent) trains every round
        keys = {**keys, "fraction-fit": 1.0, **({"diffusion-participation": 1.0} if job["method"] == "diffusion"
                                                else {})}  # fmt: skip
    return keys
