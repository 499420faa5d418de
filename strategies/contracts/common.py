"""The run-config keys every method shares, in four typed groups, and their bounds.

The shared keys come in four groups (the run, the data, the model and local training,
the execution); each method adds its own group of ``<method>-...`` keys in its
contract. A run-config key belongs to exactly one group. What every client reports is
``client_reports.py``'s; a whole run's settings, these groups together, ``settings.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from datasets import (
    DATASETS,
    EMNIST_SPLITS,
    FEATURE_SHIFTS,
    GENERATED,
    NATURAL,
    NEEDS_DATA_DIR,
    PAPER_VARIANTS,
    PARTITIONERS,
    USER_DATASETS,
    parse_channel_values,
    parse_classes,
    parse_shape,
)
from strategies.contracts.keys import ConfigError, KeyedSettings, key

# the weighted means, then rules a few outsized replies cannot move far (strategies/aggregation/rules.py; Yin et al.,
# ICML 2018; Blanchard et al., NeurIPS 2017; Karimireddy et al., ICML 2021)
AVERAGES = ("examples", "uniform")
ROBUST = ("median", "trimmed-mean", "krum", "multi-krum", "centered-clip")
AGGREGATIONS = AVERAGES + ROBUST
REGRESSION_DATASETS = ("least-squares",)  # real targets: the models whose task is regression
DEVICES = ("auto", "cpu", "cuda")
TUNERS = ("none", "fathom")
# Upper bounds that only stop typos (10**30 rounds): far past any run these machines can make, and stated
# in the error. A million rounds at 0.2 s each is over two days; no dataset here has a million examples.
MAX_ROUNDS = 1_000_000
MAX_STEPS = 1_000_000
MAX_BATCH = 1_000_000
MAX_EPOCHS = 10_000.0
MAX_WAIT_S = 86_400.0  # a day: longer waits are typos


@dataclass(frozen=True, kw_only=True)
class RunSettings(KeyedSettings):
    """The run: which method, how many rounds, whom each round asks, how replies are averaged."""

    strategy: str = key("perfedavg", "the method (see the table of methods)")
    tune: str = key("none", "wrap the method in an online tuner of its step size, local work and batch size: none or "
                    "fathom (FATHOM's rule, its fathom-* keys; strategy fathom is FedAvg tuned so)",
                    choices=TUNERS)  # fmt: skip
    num_server_rounds: int = key(100, "federated rounds", at_least=1, at_most=MAX_ROUNDS)
    fraction_fit: float = key(0.2, "share of the clients sampled for training each round (the paper's r)",
                              above=0, at_most=1)  # fmt: skip
    fraction_evaluate: float = key(1.0, "share of the clients evaluated in an evaluation round (0 = none)",
                                   at_least=0, at_most=1)  # fmt: skip
    min_fit_clients: int = key(2, "never sample fewer clients than this for training or evaluation", at_least=1)
    min_available_clients: int = key(2, "wait until this many clients are connected before round 1", at_least=1)
    eval_every: int = key(10, "personalised evaluation every k rounds, and always in the last round", at_least=1)
    central_eval: bool = key(False, "also test the global model on the dataset's test set on the server, every round")
    preflight: bool = key(True, "before round 1, every node loads its data and checks the config (one message each)")
    preflight_sample: int = key(0, "ask only this many nodes in the preflight (0 = every node); with more nodes than "
                                "this, the server numbers the nodes and each loads the partition it is sent",
                                at_least=0, at_most=1_000_000)  # fmt: skip
    preflight_timeout: float = key(0.0, "seconds the preflight waits for the nodes' answers (0 = 300, plus 2 for "
                                   "every node asked beyond 100); a node silent by then cannot start",
                                   at_least=0, at_most=MAX_WAIT_S)  # fmt: skip
    stop_after_nonfinite: int = key(3, "stop the run after this many consecutive rounds in which every fit reply was "
                                    "non-finite or no evaluation loss was finite (0 = never)", at_least=0,
                                    at_most=MAX_ROUNDS)  # fmt: skip
    wreck_rounds: int = key(5, "end the run as wrecked after this many rounds in a row that accepted fewer than "
                            "half their sampled replies, or when it ends at the majority-class floor after as many "
                            "rounds (0 = never)", at_least=0, at_most=MAX_ROUNDS)  # fmt: skip
    max_update_ratio: float = key(20.0, "reject a fit reply whose update norm (or the norm of a returned array set) "
                                  "exceeds this multiple of the round's median (0 = never; needs 3 replies)",
                                  at_least=0)  # fmt: skip
    aggregation: str = key("uniform", "uniform (the Per-FedAvg paper) or examples (weigh models by example count); "
                           "robust: median, trimmed-mean, krum, multi-krum, centered-clip",
                           choices=AGGREGATIONS)  # fmt: skip
    bucket_size: int = key(1, "with a robust aggregation: combine the means of random buckets of this many replies "
                           "(1 = none; bucketing, Karimireddy et al. 2022)", at_least=1, at_most=1_000_000)  # fmt: skip
    clip_radius: float = key(0.0, "centered-clip: the radius each reply's step from the global model is clipped to "
                             "(0 = the round's median step)", at_least=0)  # fmt: skip
    trim_fraction: float = key(0.1, "trimmed-mean: the share of the largest and of the smallest values dropped at "
                               "every coordinate", at_least=0, below=0.5)  # fmt: skip
    krum_attackers: int = key(1, "krum, multi-krum: the attackers f assumed among a round's replies (needs 2f + 3 "
                              "replies; multi-krum averages the n - f best)",
                              at_least=0, at_most=1_000_000)  # fmt: skip
    seed: int = key(0, "seeds the split, the model, the clients sampled each round and every client's batches",
                    at_least=0, at_most=2**63 - 1)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class DataSettings(KeyedSettings):
    """Which data, from where, and how it is split over the clients."""

    dataset: str = key("mnist-5k", "mnist-5k (embedded), torchvision or LEAF files, generated data, or app (an own "
                       "app's data function: docs/own-app.md)",
                       choices=DATASETS)  # fmt: skip
    data_dir: str = key("", "folder with the dataset's files (torchvision layout; LEAF train/ and test/)")
    download: bool = key(False, "let torchvision download mnist/fashion-mnist/emnist/cifar10 into data-dir")
    emnist_split: str = key("balanced", "which EMNIST split", choices=EMNIST_SPLITS)
    partitioner: str = key("perfedavg-paper", "how the data is split over the clients", choices=PARTITIONERS)
    images_per_class: int = key(8, "perfedavg-paper: a (even)", at_least=2)
    paper_variant: str = key("standard", "perfedavg-paper: standard or diff-hetero (the second half drop a/2)",
                             choices=PAPER_VARIANTS)  # fmt: skip
    dirichlet_concentration: float = key(0.5, "dirichlet, pfllib-practical: smaller means more label skew", above=0)
    classes_per_client: int = key(2, "shards, pfllib-pathological: distinct classes per client", at_least=1)
    test_fraction: float = key(0.2, "per-client held-out share for data without a test set, and of each client's "
                               "pooled share under pfllib-* (PFLlib: 0.25)", above=0, below=1)  # fmt: skip
    validation_fraction: float = key(0.0, "hold out this share of each client's training data as its validation "
                                     "split and evaluate on it instead of the test split, which the run then never "
                                     "reads (for tuning; 0 = off)", at_least=0, below=1)  # fmt: skip
    feature_shift: str = key("none", "colour: each client's images under a colour transform of its own "
                             "(FedBN's feature-shift setting; RGB images)", choices=FEATURE_SHIFTS)  # fmt: skip
    input_mean: str = key("", "per-channel means subtracted from the inputs (images scaled to [0, 1]), e.g. "
                          "\"0.4914,0.4822,0.4465\" (CIFAR-10); empty: none")  # fmt: skip
    input_std: str = key("", "per-channel standard deviations the inputs are then divided by (with input-mean)")
    synthetic_alpha: float = key(1.0, "synthetic, least-squares: how much the local models differ", at_least=0)
    synthetic_beta: float = key(1.0, "synthetic, least-squares: how much the local inputs differ", at_least=0)
    classes: str = key("", "imagefolder, npz: the class names in label order (\"cat,dog,...\"), or a count (\"10\": "
                       "labels and folders 0-9); a folder's label is its name's place here")  # fmt: skip
    input_shape: str = key("", "imagefolder, npz: one example's shape, CxHxW (\"1x28x28\", \"3x32x32\") or a feature "
                           "count")  # fmt: skip

    def check(self) -> None:
        if self.dataset in USER_DATASETS:
            for name, text, parse in (("classes", self.classes, parse_classes),
                                      ("input-shape", self.input_shape, parse_shape)):  # fmt: skip
                if not text:
                    raise ConfigError(f"run config key {name!r} must be set for dataset {self.dataset!r} (see "
                                      "docs/configuration.md)")  # fmt: skip
                try:
                    parse(text)
                except ValueError as err:
                    raise ConfigError(f"run config key {name!r}: {err}") from err
        if self.data_dir and not Path(self.data_dir).expanduser().is_absolute():
            raise ConfigError(f"run config key 'data-dir': {self.data_dir!r} is relative; give an absolute path "
                              "(e.g. data-dir=\"'$PWD/...'\"): every node would resolve it in its own working "
                              "directory, which for `flwr run .` is wherever the local SuperLink was started")
        if self.dataset in NEEDS_DATA_DIR and not self.data_dir:
            raise ConfigError(f"run config key 'data-dir' must be set for dataset {self.dataset!r} "
                              "(a folder with its files)")  # fmt: skip
        if self.partitioner == "natural" and self.dataset not in NATURAL:
            raise ConfigError(f"run config key 'partitioner': 'natural' needs a dataset with users, one of "
                              f"{list(NATURAL)}; dataset is {self.dataset!r}")  # fmt: skip
        means, stds = self.normalisation()
        if len(means) != len(stds):
            raise ConfigError(f"run config keys 'input-mean' and 'input-std' must give as many values, one per "
                              f"channel; got {len(means)} and {len(stds)}")  # fmt: skip
        if any(value <= 0 for value in stds):
            raise ConfigError(f"run config key 'input-std': {self.input_std!r} must be positive numbers")
        if self.partitioner == "perfedavg-paper" and self.images_per_class % 2:
            raise ConfigError(f"run config key 'images-per-class': {self.images_per_class} must be even "
                              "(users take a/2)")  # fmt: skip


    def normalisation(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(means, stds)`` per channel from ``input-mean`` and ``input-std`` (``((), ())``: none).

        Raises
        ------
        ConfigError
            Naming the key whose value is not numbers.

        """
        values = []
        for name, text in (("input-mean", self.input_mean), ("input-std", self.input_std)):
            try:
                values.append(parse_channel_values(text))
            except ValueError as err:
                raise ConfigError(f"run config key {name!r}: {err}") from err
        return values[0], values[1]


# Data keys that matter only for some values of another key: key -> (that key, the values it applies to).
DATA_KEY_SCOPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "emnist-split": ("dataset", ("emnist",)),
    "download": ("dataset", ("mnist", "fashion-mnist", "emnist", "cifar10")),
    "synthetic-alpha": ("dataset", GENERATED),
    "synthetic-beta": ("dataset", GENERATED),
    "images-per-class": ("partitioner", ("perfedavg-paper",)),
    "paper-variant": ("partitioner", ("perfedavg-paper",)),
    "dirichlet-concentration": ("partitioner", ("dirichlet", "pfllib-practical")),
    "classes-per-client": ("partitioner", ("shards", "pfllib-pathological")),
    "classes": ("dataset", USER_DATASETS),
    "input-shape": ("dataset", USER_DATASETS),
}
# The local-training keys a method may or may not read; its contract's ``uses`` says which it does.
LOCAL_TRAINING_KEYS = ("lr", "local-steps", "local-epochs", "batch-size")


@dataclass(frozen=True, kw_only=True)
class TrainingSettings(KeyedSettings):
    """The model, local training and the personalised evaluation every client runs."""

    # its choices are the registered models (clients/models/registry.py), checked by app.config.parse_settings
    model: str = key("mlp", "the network, one of the registered models (docs/models.md)")
    lr: float = key(0.05, "local SGD step size", above=0)
    local_steps: int = key(10, "local steps per round (the paper's tau)", at_least=1, at_most=MAX_STEPS)
    local_epochs: float = key(0.0, "if > 0: passes over the local data per round instead of local-steps", at_least=0,
                              at_most=MAX_EPOCHS)  # fmt: skip
    batch_size: int = key(10, "local mini-batch size (Per-FedAvg's D)", at_least=1, at_most=MAX_BATCH)
    adapt_steps: int = key(1, "personalised evaluation: SGD steps on the client's own training data", at_least=0,
                           at_most=MAX_STEPS)  # fmt: skip
    adapt_lr: float = key(0.0, "their step size (0: the method's test-time step, Per-FedAvg's alpha or lr)",
                          at_least=0)  # fmt: skip
    adapt_batch_size: int = key(10, "their batch size (0: the client's whole training set)", at_least=0,
                                at_most=MAX_BATCH)  # fmt: skip
    strict_batches: bool = key(False, "refuse (in the preflight) a client whose training set is smaller than a batch "
                               "size; by default such a client trains on min(b, n) examples per batch")  # fmt: skip


PULL_INTERVAL = 0.1  # seconds: bench/edge_rounds.py (docs/deployment.md#what-a-round-costs)


@dataclass(frozen=True, kw_only=True)
class ExecutionSettings(KeyedSettings):
    """Where clients compute, and where and how often the run writes."""

    device: str = key("auto", "auto (CUDA when available), cpu or cuda", choices=DEVICES)
    num_threads: int = key(1, "torch threads per client process (0: torch's default)", at_least=0)
    pull_interval: float = key(PULL_INTERVAL, "seconds between the server's pulls of its replies on a deployment, one "
                               "pull loop for every waiting message (Flower's deployed grid waits 3 s); each pull is "
                               "one request to the SuperLink; a simulation pulls every 0.02 s at most "
                               "(docs/deployment.md#what-a-round-costs)", at_least=0.01, at_most=10.0)
    overlap_rounds: bool = key(True, "on a deployment: send each round's evaluation and the next "
                               "round's fit together, so a SuperNode finds the fit waiting instead of sleeping 3 s; "
                               "the same records and model (docs/deployment.md#what-a-round-costs)")  # fmt: skip
    results_dir: str = key("results", "results go to <results-dir>/<run-name>/ (a relative path: under ~/stamen/)")
    run_name: str = key("", "empty: <strategy>-<dataset>-<timestamp>; else one folder name under results-dir (no '/', "
                        "'\\', '.', '..'); a folder holding an earlier run is refused (continue it with resume-from)")
    checkpoint_every: int = key(0, "write <run folder>/checkpoint.npz every k rounds and after the last (0 = never)",
                                at_least=0)  # fmt: skip
    resume_from: str = key("", "a checkpoint.npz (or its run folder; relative: under ~/stamen/): continue that run, "
                           "in that folder")


PACES = ("lockstep", "deadline", "buffered")  # strategies/rounds/pacing/schedule.py
CLOCKS = ("auto", "virtual", "wall")
STALENESS_RULES = ("sqrt", "none")  # strategies/rounds/pacing/staleness.py
CORRECTIONS = ("none", "inverse-participation")  # strategies/rounds/pacing/participation.py
FLEETS = ("lognormal", "trace")
SPEED_TIES = ("independent", "data")


@dataclass(frozen=True, kw_only=True)
class FleetSettings(KeyedSettings):
    """How rounds are paced over an unequal fleet, and the simulated fleet's devices (docs/fleets.md)."""

    pace: str = key("lockstep", "lockstep (every round waits for its sampled devices), deadline (over-select, close at "
                    "the target count or the deadline) or buffered (concurrency devices train at once; every "
                    "buffer-size replies make one server update: FedBuff)", choices=PACES)  # fmt: skip
    deadline: float = key(0.0, "seconds a round (deadline, lockstep) or a job (buffered) may take before its late "
                          "replies are discarded and counted (0 = 3600 s, as before)", at_least=0,
                          at_most=MAX_WAIT_S)  # fmt: skip
    over_selection: float = key(1.3, "deadline: sample this many times the round's target (Bonawitz et al.: 1.3)",
                                at_least=1, at_most=10)  # fmt: skip
    concurrency: int = key(0, "buffered: devices training at once (0 = the fit sample's size)", at_least=0,
                           at_most=1_000_000)  # fmt: skip
    buffer_size: int = key(0, "buffered: replies per server update (1 = FedAsync; 0 = half the concurrency)",
                           at_least=0, at_most=1_000_000)  # fmt: skip
    staleness: str = key("sqrt", "buffered: a reply tau updates stale is weighted 1/sqrt(1+tau) (sqrt) or 1 (none)",
                         choices=STALENESS_RULES)  # fmt: skip
    server_lr: float = key(1.0, "buffered: the server's step on the buffered updates (FedBuff's eta_g)", above=0,
                           at_most=100)  # fmt: skip
    bias_correction: str = key("none", "buffered: weight each device's update by 1/(its share of the applied "
                               "updates) (inverse-participation), or not (none)", choices=CORRECTIONS)  # fmt: skip
    clock: str = key("auto", "auto (virtual in a simulation, the wall clock on a deployment), virtual or wall",
                     choices=CLOCKS)  # fmt: skip
    fleet: str = key("lognormal", "the virtual clock's fleet: lognormal (drawn from the seed) or trace (fleet-trace)",
                     choices=FLEETS)  # fmt: skip
    fleet_trace: str = key("", "a CSV: partition,step-seconds,bandwidth,windows (docs/fleets.md); an absolute path")
    fleet_step_seconds: float = key(0.1, "the median simulated device's seconds per local step", above=0,
                                    at_most=MAX_WAIT_S)  # fmt: skip
    fleet_spread: float = key(10.0, "the ratio of the 90th to the 10th percentile of the devices' step times",
                              at_least=1, at_most=1e6)  # fmt: skip
    fleet_bandwidth: float = key(1e6, "bytes per second each simulated device moves, each way", above=0)
    fleet_on_seconds: float = key(1800.0, "mean on period of a simulated device, in seconds", above=0)
    fleet_off_seconds: float = key(0.0, "mean off period (0 = always on)", at_least=0)
    fleet_speed_tie: str = key("independent", "independent, or data: the slowest devices are those whose data hold "
                               "the highest class labels (the slowest quarter holds classes the others lack under "
                               "label skew)", choices=SPEED_TIES)  # fmt: skip

    def check(self) -> None:
        if self.fleet == "trace" and not self.fleet_trace:
            raise ConfigError("run config key 'fleet-trace' must name a CSV when fleet = \"trace\"")
        if self.fleet_trace and not Path(self.fleet_trace).expanduser().is_absolute():
            raise ConfigError(f"run config key 'fleet-trace': {self.fleet_trace!r} is relative; give an absolute path")


SHARED_GROUPS: tuple[type[KeyedSettings], ...] = (RunSettings, DataSettings, TrainingSettings, ExecutionSettings,
                                                  FleetSettings)
