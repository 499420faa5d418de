"""FATHOM's contract: hyper-step sizes, smoothing and bounds (server side), and the clients' ``phi``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Metric, Tunable
from strategies.contracts.keys import ConfigError, key, key_name

if TYPE_CHECKING:
    from strategies.contracts.settings import Settings

LOCAL_TERMS = ("cosine", "eq12")
DECAY_TESTS = ("stationary", "overshoot")
PHI, USED_BATCH = "phi", "used-batch-size"


@dataclass(frozen=True, kw_only=True)
class FathomSettings(MethodSettings):
    """FATHOM (Kan, 2023): FedAvg that tunes ``lr``, ``local-epochs`` and ``batch-size`` online.

    It starts from the shared ``lr``, ``local-epochs`` (> 0) and ``batch-size``; its own keys
    are read by the server only. Defaults are the seed's Algorithm 1 and the reference
    code's upper bounds.
    """

    prefix: ClassVar[str] = "fathom"

    gamma_lr: float = key(0.01, "hyper-step of the learning rate", at_least=0, server_only=True)
    gamma_epochs: float = key(0.01, "hyper-step of the epochs (of local-steps, for a method whose work is steps)",
                              at_least=0, server_only=True)  # fmt: skip
    gamma_batch: float = key(0.1, "hyper-step of the batch size", at_least=0, server_only=True)
    smoothing: float = key(0.5, "weight of the previous smoothed update (a_sm)", at_least=0, below=1,
                           server_only=True)  # fmt: skip
    lr_min: float = key(0.0001, "lower bound of the learning rate", above=0, server_only=True)
    lr_max: float = key(1.0, "upper bound of the learning rate", above=0, server_only=True)
    epochs_min: float = key(0.01, "lower bound of the epochs", above=0, server_only=True)
    epochs_max: float = key(10.0, "upper bound of the epochs", above=0, server_only=True)
    steps_min: float = key(1.0, "tune = fathom on a method whose work is local-steps: their lower bound", at_least=1,
                           server_only=True)  # fmt: skip
    steps_max: float = key(100.0, "... and their upper bound", at_least=1, server_only=True)
    batch_min: float = key(1.0, "lower bound of the batch size", at_least=1, server_only=True)
    batch_max: float = key(5096.0, "upper bound of the batch size", at_least=1, server_only=True)
    step: str = key("", "tune = fathom: the step-size key it moves ('' = the method's own: lr, perfedavg-beta; "
                    "Per-FedAvg also allows perfedavg-alpha)", server_only=True)  # fmt: skip
    probe_rounds: int = key(0, "start probe: in the first rounds the sampled clients try the step size times "
                            "probe-factor**k, k = -(points // 2) .. points // 2, and the tuner starts from the one "
                            "whose clients' training loss fell most (0 = off: FATHOM as published)", at_least=0,
                            server_only=True)  # fmt: skip
    probe_factor: float = key(3.0, "start probe: the ratio between neighbouring step sizes it tries", above=1,
                              server_only=True)  # fmt: skip
    probe_points: int = key(5, "start probe: how many step sizes it tries (odd: the start is the middle one)",
                            at_least=3, at_most=15, server_only=True)  # fmt: skip
    decay_window: int = key(0, "stationarity test: once the last window * 2**k values of H (k = decays so far) "
                            "show no progress (their mean is not 2 standard errors below 0), the step size is "
                            "divided by decay-factor (0 = off: FATHOM as published)", at_least=0,
                            server_only=True)  # fmt: skip
    decay_factor: float = key(2.0, "stationarity test: what a decay divides the step size by", above=1,
                              server_only=True)  # fmt: skip
    decay_arm: float = key(1.0, "stationarity test: start it only once the global model's loss (the replies' mean "
                           "start-loss) has fallen to this fraction of its first tuned round's (1 = from the "
                           "start); below 1 an initial plateau is not taken for stationarity", above=0, at_most=1,
                           server_only=True)  # fmt: skip
    decay_test: str = key("stationary", "what a decay window tests: stationary (its H shows no progress, mean not "
                          "2 standard errors below 0) or overshoot (its H says the step is too large, mean 2 "
                          "standard errors above 0)", choices=DECAY_TESTS, server_only=True)  # fmt: skip
    setback: float = key(0.0, "setback test: divide the step size by decay-factor once the global loss gives back "
                         "this fraction of the progress it has made since the first tuned round (again only after "
                         "a new lowest loss; needs decay-arm below 1; 0 = off)", at_least=0, at_most=1,
                         server_only=True)  # fmt: skip
    safe_ascent: float = key(0.5, "safe ascent: a round raises a tuned value (the step, the local work; lowers the "
                             "batch) only when its global loss is a new lowest; when the loss gives back this "
                             "fraction of the progress made since the first tuned round (and rises by this fraction "
                             "of its lowest value), or every fit reply is "
                             "non-finite, the global model goes back to the lowest loss's and the values to those "
                             "then in force, the step divided by decay-factor (0 = off: FATHOM's update alone)",
                             at_least=0, at_most=1, server_only=True)  # fmt: skip
    local_term: str = key("cosine", "cosine (the author's code) or eq12 (the paper's eq. 12, scaled by lr)",
                          choices=LOCAL_TERMS, server_only=True)  # fmt: skip

    @property
    def lr_bounds(self) -> tuple[float, float]:
        return self.lr_min, self.lr_max

    @property
    def epochs_bounds(self) -> tuple[float, float]:
        return self.epochs_min, self.epochs_max

    @property
    def batch_bounds(self) -> tuple[float, float]:
        return self.batch_min, self.batch_max

    @property
    def step_key(self) -> str:
        """The run-config key naming the step size it moves (``fathom-step``)."""
        return key_name(self.prefix, "step")

    def bounds_of(self, dimension: str, work_key: str) -> tuple[tuple[str, str], tuple[float, float]]:
        """The bound keys and values of a tuned dimension (``step``, ``work`` or ``batch``)."""
        if dimension == "step":
            return ("fathom-lr-min", "fathom-lr-max"), self.lr_bounds
        if dimension == "batch":
            return ("fathom-batch-min", "fathom-batch-max"), self.batch_bounds
        if work_key == "local-steps":
            return ("fathom-steps-min", "fathom-steps-max"), (self.steps_min, self.steps_max)
        return ("fathom-epochs-min", "fathom-epochs-max"), self.epochs_bounds

    def gamma_of(self, dimension: str) -> tuple[str, float]:
        """The hyper-step key and value of a dimension; 0 holds the dimension at the method's own value."""
        name = {"step": "lr", "work": "epochs", "batch": "batch"}[dimension]
        return f"fathom-gamma-{name}", getattr(self, f"gamma_{name}")

    def check(self) -> None:
        if self.probe_points % 2 == 0:
            raise ConfigError(f"run config key 'fathom-probe-points': {self.probe_points} is even; the start value is "
                              "the middle one, so it must be odd (3, 5, 7, ...)")  # fmt: skip
        for low, high in (("lr_min", "lr_max"), ("epochs_min", "epochs_max"), ("steps_min", "steps_max"),
                          ("batch_min", "batch_max")):  # fmt: skip
            if getattr(self, low) > getattr(self, high):
                raise ConfigError(f"run config key 'fathom-{low.replace('_', '-')}': {getattr(self, low)} is above "
                                  f"'fathom-{high.replace('_', '-')}' = {getattr(self, high)}")  # fmt: skip

        if self.setback > 0 and self.decay_arm >= 1:
            raise ConfigError(f"run config key 'fathom-setback': {self.setback} needs 'fathom-decay-arm' below 1: it "
                              "acts only once the loss has fallen that far, so that a noisy second round is not "
                              "taken for a setback")  # fmt: skip

    def check_in(self, settings: Settings) -> None:
        if self.step not in ("", "lr"):  # as a strategy, FATHOM is FedAvg: its step size is lr
            raise ConfigError(f"run config key 'fathom-step': strategy 'fathom' tunes lr; got {self.step!r}")
        training = settings.training
        starts = (("lr", training.lr, self.lr_bounds), ("local-epochs", training.local_epochs, self.epochs_bounds),
                  ("batch-size", training.batch_size, self.batch_bounds))  # fmt: skip
        for name, value, (low, high) in starts:
            if not low <= value <= high:
                raise ConfigError(f"run config key {name!r}: fathom starts at {value}, outside its bounds "
                                  f"[{low}, {high}]")  # fmt: skip


CONTRACT = Contract(
    robust_aggregation=False,  # FATHOM's update rule assumes the example-weighted mean
    name="fathom",
    summary="FATHOM: FedAvg that tunes its client learning rate, epochs and batch size online",
    settings=FathomSettings,
    uses=("lr", "local-epochs", "batch-size"),
    metrics=(
        Metric(PHI, "smallest cosine between a local step's gradient and the displacement so far", -1.0, 1.0,
               required=True, summary=("min", "max")),
        Metric(USED_BATCH, "the batch size the client used", 1.0, summary=("min", "max")),
        # what the clients say they received: the record shows the broadcast arriving
        Metric("lr", "the learning rate the client used", 0.0, summary=("min", "max"), record_as="client-lr"),
        Metric("local-epochs", "the epochs the client was sent", 0.0, summary=("min", "max"),
               record_as="client-local-epochs"),
    ),
    example={"strategy": "fathom", "local-epochs": 1.0, "batch-size": 8},
    tunable=Tunable(step="lr", work=("local-epochs",)),
)
