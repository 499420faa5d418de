"""Per-FedAvg's contract: the meta-learning step sizes, the estimator and the three batches (ALGORITHMS.md 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.common import MAX_BATCH
from strategies.contracts.contract import Contract, MethodSettings, Tunable
from strategies.contracts.keys import ConfigError, key

VARIANTS = ("fo", "hf", "so")
DELTA_SCALES = ("gradient", "relative")
RELU_SO_BOUND = 0.3  # perfedavg-curvature-bound = -1: the bound of so on a ReLU model


@dataclass(frozen=True, kw_only=True)
class PerFedAvgSettings(MethodSettings):
    """Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020): ``local-steps`` (tau) meta-updates on batches D, D', D''.

    With ``local-epochs`` > 0 a round runs that many passes instead: a pass is as many
    meta-updates as it takes the batches one update reads (D and D'; D'' too, unless
    ``fo``) to cover the client's data once (:meth:`examples_per_step`).

    ``batch-size`` is the size of D; every client also adapts with step ``alpha`` before
    it is tested (unless ``adapt-lr`` says otherwise).
    """

    prefix: ClassVar[str] = "perfedavg"

    alpha: float = key(0.05, "inner (adaptation) step size; also the test-time step", at_least=0)
    beta: float = key(0.05, "outer (meta) step size", above=0)
    delta: float = key(0.001, "hf: central-difference step of the Hessian-vector product", above=0)
    delta_scale: str = key("gradient", "hf: perturb w by delta times the outer gradient (the paper) or by delta in "
                           "length (relative: delta / ||g||)", choices=DELTA_SCALES)  # fmt: skip
    variant: str = key("hf", "fo (first order), hf (Hessian-free) or so (exact second order)", choices=VARIANTS)
    curvature_bound: float = key(-1.0, "hf and so: scale the curvature correction alpha * H g down to at most this "
                                 "times ||g|| (0 = unbounded, the paper's; -1 = by model: 0.3 for so on a ReLU model, "
                                 "else 0)", at_least=-1)  # fmt: skip
    outer_batch_size: int = key(10, "size of D' (the outer gradient)", at_least=1, at_most=MAX_BATCH)
    hessian_batch_size: int = key(10, "size of D'' (the Hessian term; unused by fo)", at_least=1,
                                     at_most=MAX_BATCH)  # fmt: skip

    def check(self) -> None:
        if -1 < self.curvature_bound < 0:
            raise ConfigError(f"run config key 'perfedavg-curvature-bound': {self.curvature_bound} is neither -1 "
                              "(by model) nor a bound >= 0")  # fmt: skip

    def curvature_bound_on(self, smooth: bool) -> float:
        """The bound in force on a ``smooth`` model or not (its card): the key's value, or this variant's default.

        On a ReLU model SO's correction can dwarf the gradient of the conv layers and stall
        training (B6: 3 of 3 seeds train with 0.3; the proxy in its part (c) stalls without);
        on the smooth models it is the paper's estimator, exact where it is safe.
        """
        if self.curvature_bound >= 0:
            return self.curvature_bound
        return RELU_SO_BOUND if self.variant == "so" and not smooth else 0.0

    def examples_per_step(self, batch_size: int, num_examples: int) -> int:
        """The examples one meta-update reads of ``num_examples``: D and D', and D'' unless ``fo`` (drawn, unused)."""
        used = [batch_size, self.outer_batch_size] + ([] if self.variant == "fo" else [self.hessian_batch_size])
        return sum(min(size, num_examples) for size in used)

    def batch_sizes(self, batch_size: int) -> dict[str, int]:
        """The sizes of D, D' and D'' by key."""
        return {"batch-size": batch_size, "perfedavg-outer-batch-size": self.outer_batch_size,
                "perfedavg-hessian-batch-size": self.hessian_batch_size}  # fmt: skip


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="perfedavg",
    summary="Per-FedAvg: personalised FL as MAML, with first-order, Hessian-free and exact second-order meta-steps",
    settings=PerFedAvgSettings,
    uses=("local-steps", "local-epochs", "batch-size"),
    example={"strategy": "perfedavg"},
    # alpha is tuned only if asked (fathom-step): it is also the test-time step, so moving it changes what is
    # evaluated; B5 measures whether it pays
    tunable=Tunable(step="perfedavg-beta", work=("local-epochs", "local-steps"), other_steps=("perfedavg-alpha",)),
)
