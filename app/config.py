"""Parse ``context.run_config`` once into a frozen, typed, validated ``Settings``.

Every key of ``[tool.flwr.app.config]`` maps to one field (kebab-case key ->
snake_case field). Validation happens here, before any data is loaded or any
model is built, and every error names the key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clients import MODELS, ClientSettings
from clients.meta import VARIANTS
from clients.models import IMAGE_MODELS
from datasets import DATASETS, EMNIST_SPLITS, NEEDS_DATA_DIR, PAPER_VARIANTS, PARTITIONERS, DataSpec, PartitionSpec
from datasets.registry import GENERATED
from strategies.fathom_math import LOCAL_TERMS, FathomSettings
from strategies.fedavg import AGGREGATIONS
from strategies.topology import COMBINATIONS, GRAPHS, MODES, NetworkSettings, parse_probabilities

DEVICES = ("auto", "cpu", "cuda")
NATURAL_DATASETS = ("femnist", "synthetic", "least-squares")
_CLIENT_DEFAULTS = ClientSettings()  # one source for the client-side defaults
_FATHOM_DEFAULTS = FathomSettings()
_NETWORK_DEFAULTS = NetworkSettings()


class ConfigError(ValueError):
    """A run-config value that cannot be used; the message names the key."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every run-config key, typed. Defaults mirror ``pyproject.toml``."""

    # the run
    strategy: str = "perfedavg"
    num_server_rounds: int = 100
    fraction_fit: float = 0.2
    fraction_evaluate: float = 1.0
    min_fit_clients: int = 2
    min_available_clients: int = 2
    eval_every: int = 10
    central_eval: bool = False
    preflight: bool = True
    aggregation: str = "uniform"
    seed: int = _CLIENT_DEFAULTS.seed
    # data
    dataset: str = "mnist-5k"
    data_dir: str = ""
    download: bool = False
    emnist_split: str = "balanced"
    partitioner: str = "perfedavg-paper"
    images_per_class: int = 8
    paper_variant: str = "standard"
    dirichlet_concentration: float = 0.5
    classes_per_client: int = 2
    test_fraction: float = 0.2
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    # model and local training
    model: str = "mlp"
    lr: float = _CLIENT_DEFAULTS.lr
    local_steps: int = _CLIENT_DEFAULTS.local_steps
    local_epochs: float = _CLIENT_DEFAULTS.local_epochs
    batch_size: int = _CLIENT_DEFAULTS.batch_size
    # personalised evaluation
    adapt_steps: int = _CLIENT_DEFAULTS.adapt_steps
    adapt_lr: float = _CLIENT_DEFAULTS.adapt_lr
    adapt_batch_size: int = _CLIENT_DEFAULTS.adapt_batch_size
    # Per-FedAvg
    alpha: float = _CLIENT_DEFAULTS.alpha
    beta: float = _CLIENT_DEFAULTS.beta
    delta: float = _CLIENT_DEFAULTS.delta
    variant: str = _CLIENT_DEFAULTS.variant
    outer_batch_size: int = _CLIENT_DEFAULTS.outer_batch_size
    hessian_batch_size: int = _CLIENT_DEFAULTS.hessian_batch_size
    # FATHOM (starts from lr, local-epochs and batch-size)
    gamma_lr: float = _FATHOM_DEFAULTS.gamma_lr
    gamma_epochs: float = _FATHOM_DEFAULTS.gamma_epochs
    gamma_batch: float = _FATHOM_DEFAULTS.gamma_batch
    smoothing: float = _FATHOM_DEFAULTS.smoothing
    lr_min: float = _FATHOM_DEFAULTS.lr_bounds[0]
    lr_max: float = _FATHOM_DEFAULTS.lr_bounds[1]
    epochs_min: float = _FATHOM_DEFAULTS.epochs_bounds[0]
    epochs_max: float = _FATHOM_DEFAULTS.epochs_bounds[1]
    batch_min: float = _FATHOM_DEFAULTS.batch_bounds[0]
    batch_max: float = _FATHOM_DEFAULTS.batch_bounds[1]
    local_term: str = _FATHOM_DEFAULTS.local_term
    # asynchronous diffusion
    mode: str = _NETWORK_DEFAULTS.mode
    mu: float = _CLIENT_DEFAULTS.mu
    graph: str = _NETWORK_DEFAULTS.graph
    edge_probability: float = _NETWORK_DEFAULTS.edge_probability
    graph_file: str = _NETWORK_DEFAULTS.graph_file
    combination: str = _NETWORK_DEFAULTS.combination
    combination_file: str = _NETWORK_DEFAULTS.combination_file
    participation: float = _NETWORK_DEFAULTS.participation
    participation_per_agent: str = _NETWORK_DEFAULTS.participation_per_agent
    neighbour_probability: float = _NETWORK_DEFAULTS.neighbour_probability
    snapshot_every: int = 0
    # execution and outputs
    device: str = _CLIENT_DEFAULTS.device
    num_threads: int = _CLIENT_DEFAULTS.num_threads
    server_threads: int = 64
    results_dir: str = "results"
    run_name: str = ""
    checkpoint_every: int = 0
    resume_from: str = ""

    # ------------------------------------------------------------ derived specs

    def data_spec(self, num_partitions: int = 0) -> DataSpec:
        """What the datasets package needs to load the source."""
        return DataSpec(
            name=self.dataset,
            data_dir=self.data_dir,
            download=self.download,
            emnist_split=self.emnist_split,
            synthetic_alpha=self.synthetic_alpha,
            synthetic_beta=self.synthetic_beta,
            num_users=num_partitions if self.dataset in GENERATED else 0,
            seed=self.seed,
        )

    def partition_spec(self, num_partitions: int) -> PartitionSpec:
        """How the source is split for ``num_partitions`` clients."""
        return PartitionSpec(
            name=self.partitioner,
            num_clients=num_partitions,
            seed=self.seed,
            images_per_class=self.images_per_class,
            paper_variant=self.paper_variant,
            concentration=self.dirichlet_concentration,
            classes_per_client=self.classes_per_client,
            test_fraction=self.test_fraction,
        )

    def fathom_settings(self) -> FathomSettings:
        """FATHOM's hyper-step sizes, smoothing, bounds and local-term reading."""
        return FathomSettings(
            gamma_lr=self.gamma_lr,
            gamma_epochs=self.gamma_epochs,
            gamma_batch=self.gamma_batch,
            smoothing=self.smoothing,
            lr_bounds=(self.lr_min, self.lr_max),
            epochs_bounds=(self.epochs_min, self.epochs_max),
            batch_bounds=(self.batch_min, self.batch_max),
            local_term=self.local_term,
        )

    def network_settings(self) -> NetworkSettings:
        """Diffusion's network: graph, combination rule, probabilities, mode (same-named fields)."""
        return NetworkSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(NetworkSettings)})

    def client_settings(self) -> ClientSettings:
        """The client-side hyperparameters."""
        names = {f.name for f in dataclasses.fields(ClientSettings)}
        return ClientSettings(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})

    def as_run_config(self) -> dict:
        """The settings as kebab-case keys (for summaries and records)."""
        return {key_of(k): v for k, v in dataclasses.asdict(self).items()}


def key_of(field_name: str) -> str:
    """The run-config key of a settings field (``local_steps`` -> ``local-steps``)."""
    return field_name.replace("_", "-")


FIELDS = {key_of(f.name): f for f in dataclasses.fields(Settings)}
_TYPES = {"int": int, "float": float, "bool": bool, "str": str}  # field.type is a string here

# key -> allowed values; the strategy list is filled in by app.registry (the
# registry imports this module, not the other way round).
CHOICES: dict[str, tuple[str, ...]] = {
    "dataset": DATASETS,
    "emnist-split": EMNIST_SPLITS,
    "partitioner": PARTITIONERS,
    "paper-variant": PAPER_VARIANTS,
    "model": MODELS,
    "device": DEVICES,
    "variant": VARIANTS,
    "aggregation": AGGREGATIONS,
    "local-term": LOCAL_TERMS,
    "mode": MODES,
    "graph": GRAPHS,
    "combination": COMBINATIONS,
}

# key -> (lowest, highest, lowest allowed?, highest allowed?)
INF = float("inf")
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "num-server-rounds": (1, INF, True, False),
    "fraction-fit": (0, 1, False, True),
    "fraction-evaluate": (0, 1, True, True),
    "min-fit-clients": (1, INF, True, False),
    "min-available-clients": (1, INF, True, False),
    "eval-every": (1, INF, True, False),
    "seed": (0, 2**63 - 1, True, True),
    "images-per-class": (2, INF, True, False),
    "dirichlet-concentration": (0, INF, False, False),
    "classes-per-client": (1, INF, True, False),
    "test-fraction": (0, 1, False, False),
    "synthetic-alpha": (0, INF, True, False),
    "synthetic-beta": (0, INF, True, False),
    "lr": (0, INF, False, False),
    "local-steps": (1, INF, True, False),
    "local-epochs": (0, INF, True, False),
    "batch-size": (1, INF, True, False),
    "adapt-steps": (0, INF, True, False),
    "adapt-lr": (0, INF, True, False),
    "adapt-batch-size": (0, INF, True, False),
    "num-threads": (0, INF, True, False),
    "server-threads": (1, INF, True, False),
    "alpha": (0, INF, True, False),
    "beta": (0, INF, False, False),
    "delta": (0, INF, False, False),
    "outer-batch-size": (1, INF, True, False),
    "hessian-batch-size": (1, INF, True, False),
    "gamma-lr": (0, INF, True, False),
    "gamma-epochs": (0, INF, True, False),
    "gamma-batch": (0, INF, True, False),
    "smoothing": (0, 1, True, False),
    "lr-min": (0, INF, False, False),
    "lr-max": (0, INF, False, False),
    "epochs-min": (0, INF, False, False),
    "epochs-max": (0, INF, False, False),
    "batch-min": (1, INF, True, False),
    "batch-max": (1, INF, True, False),
    "mu": (0, INF, False, False),
    "edge-probability": (0, 1, False, True),
    "participation": (0, 1, False, True),
    "neighbour-probability": (0, 1, True, True),
    "snapshot-every": (0, INF, True, False),
    "checkpoint-every": (0, INF, True, False),
}


def _typed(key: str, value: object, kind: type) -> object:
    """Coerce TOML values to the field's type, refusing lossy or odd conversions."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return value
    raise ConfigError(f"run config key {key!r}: {value!r} is not a {kind.__name__}")


def _range_text(lo: float, hi: float, lo_in: bool, hi_in: bool) -> str:
    return f"{'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def _check_value(key: str, value: object) -> None:
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(f"run config key {key!r}: {value!r} is not allowed; choose one of {list(CHOICES[key])}")
    if key in RANGES:
        lo, hi, lo_in, hi_in = RANGES[key]
        ok = (value > lo or (lo_in and value == lo)) and (value < hi or (hi_in and value == hi))
        if not ok:
            raise ConfigError(f"run config key {key!r}: {value!r} is outside {_range_text(lo, hi, lo_in, hi_in)}")


def _check_combination(s: Settings) -> None:
    if s.dataset in NEEDS_DATA_DIR and not s.data_dir:
        raise ConfigError(f"run config key 'data-dir' must be set for dataset {s.dataset!r} (a folder with its files)")
    if s.partitioner == "natural" and s.dataset not in NATURAL_DATASETS:
        raise ConfigError(
            f"run config key 'partitioner': 'natural' needs a dataset with users, one of {list(NATURAL_DATASETS)}; "
            f"dataset is {s.dataset!r}"
        )
    if s.partitioner == "perfedavg-paper" and s.images_per_class % 2:
        raise ConfigError(f"run config key 'images-per-class': {s.images_per_class} must be even (users take a/2)")
    for low, high in (("lr-min", "lr-max"), ("epochs-min", "epochs-max"), ("batch-min", "batch-max")):
        low_value, high_value = getattr(s, low.replace("-", "_")), getattr(s, high.replace("-", "_"))
        if low_value > high_value:
            raise ConfigError(f"run config key {low!r}: {low_value} is above {high!r} = {high_value}")
    if s.strategy == "fathom":
        starts = (("lr", s.lr, s.lr_min, s.lr_max), ("local-epochs", s.local_epochs, s.epochs_min, s.epochs_max),
                  ("batch-size", s.batch_size, s.batch_min, s.batch_max))  # fmt: skip
        for key, value, low, high in starts:
            if not low <= value <= high:
                raise ConfigError(
                    f"run config key {key!r}: fathom starts at {value}, outside its bounds [{low}, {high}]"
                )
    if s.model in IMAGE_MODELS and s.dataset in GENERATED:
        raise ConfigError(
            f"run config key 'model': {s.model!r} needs images; dataset {s.dataset!r} has feature vectors"
        )
    _check_diffusion(s)
    if s.strategy == "diffusion" and not s.preflight:
        raise ConfigError("run config key 'preflight': diffusion needs it (it maps every node to its agent)")
    if s.central_eval and s.dataset in GENERATED:
        raise ConfigError(
            f"run config key 'central-eval': needs a dataset with its own test set; {s.dataset!r} has none"
        )
    if (s.model == "linear") != (s.dataset == "least-squares"):
        raise ConfigError(
            "run config key 'model': dataset 'least-squares' (real targets) and model 'linear' go together; "
            f"got model {s.model!r} with dataset {s.dataset!r}"
        )


def _check_diffusion(s: Settings) -> None:
    for key, value in (("graph-file", s.graph_file), ("combination-file", s.combination_file)):
        owner = key.removesuffix("-file")
        if (getattr(s, owner) == "file") != bool(value):
            raise ConfigError(f"run config key {key!r} is set exactly when {owner!r} is 'file'; got {owner} = "
                              f"{getattr(s, owner)!r}, {key} = {value!r}")  # fmt: skip
    if s.strategy == "diffusion" and s.mode == "fedsgd":
        if s.participation != 1 or s.participation_per_agent or s.neighbour_probability != 1:
            raise ConfigError(
                "run config key 'mode': 'fedsgd' has every agent take part every round; it needs participation = 1, "
                "neighbour-probability = 1 and no participation-per-agent"
            )


def check_server_files(s: Settings) -> None:
    """Check what only the server reads: diffusion's graph, matrix and participation files, and ``resume-from``.

    ``parse_settings`` runs on every SuperNode too, where these files need not exist,
    so the ServerApp calls this once, before any work starts.
    """
    for key, value in (("graph-file", s.graph_file), ("combination-file", s.combination_file)):
        if value and not Path(value).expanduser().is_file():
            raise ConfigError(f"run config key {key!r}: {value!r} is not a file")
    if s.participation_per_agent:
        try:
            parse_probabilities(s.participation_per_agent)
        except ValueError as err:
            raise ConfigError(f"run config key 'participation-per-agent': {err}") from err
    if s.resume_from and not Path(s.resume_from).expanduser().exists():
        raise ConfigError(f"run config key 'resume-from': {s.resume_from!r} does not exist")


def parse_settings(run_config: Mapping[str, object], strategies: tuple[str, ...] = ("fedavg",)) -> Settings:
    """Validate ``run_config`` and return the typed settings.

    Parameters
    ----------
    run_config
        ``context.run_config`` (kebab-case keys); missing keys take their defaults.
    strategies
        The strategy names the registry knows.

    Raises
    ------
    ConfigError
        For an unknown key, a value of the wrong type, a value out of range or not
        among the allowed choices, or an inconsistent combination.

    """
    unknown = sorted(set(run_config) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown run config key(s) {unknown}; known keys: {sorted(FIELDS)}")
    values = {}
    for key, field in FIELDS.items():
        if key not in run_config:
            continue
        value = _typed(key, run_config[key], _TYPES[field.type])
        _check_value(key, value)
        values[field.name] = value
    settings = Settings(**values)
    if settings.strategy not in strategies:
        raise ConfigError(
            f"run config key 'strategy': {settings.strategy!r} is not allowed; choose one of {list(strategies)}"
        )
    _check_combination(settings)
    return settings
