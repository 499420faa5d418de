"""The Per-FedAvg strategy: broadcast the meta-learning hyperparameters, average, evaluate personalised."""

from __future__ import annotations

from strategies.fedavg import PersonalisedFedAvg

VARIANTS = ("fo", "hf", "so")


class PerFedAvg(PersonalisedFedAvg):
    """Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020), Algorithm 1, on Flower.

    Each round the server samples ``fraction_fit`` of the clients, sends them the
    model and, through the fit config dict, ``alpha``, ``beta``, ``delta``,
    ``variant``, ``local-steps`` (tau) and the batch sizes of ``D``, ``D'`` and
    ``D''``; each client runs tau meta-updates and the server averages the returned
    models (uniformly by default, as the paper does). Evaluation is personalised:
    every client takes ``adapt-steps`` steps of size ``alpha`` (unless the
    evaluate config says otherwise) on its own training data, then tests.

    Parameters
    ----------
    alpha, beta, delta
        Inner step (>= 0), outer step (> 0), and the central-difference step of the
        ``hf`` estimator (> 0).
    variant
        ``fo``, ``hf`` or ``so``.
    local_steps
        Meta-updates per round (tau, >= 1).
    batch_size, outer_batch_size, hessian_batch_size
        Sizes of ``D``, ``D'`` and ``D''`` (>= 1).
    **kwargs
        Passed to :class:`PersonalisedFedAvg` (rounds, fractions, recorder, ...);
        ``aggregation`` defaults to ``uniform``.

    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        delta: float = 1e-3,
        variant: str = "hf",
        local_steps: int = 10,
        batch_size: int = 40,
        outer_batch_size: int = 40,
        hessian_batch_size: int = 40,
        **kwargs,
    ) -> None:
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if not delta > 0:
            raise ValueError(f"delta must be > 0, got {delta}")
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r} is not one of {list(VARIANTS)}")
        sizes = {
            "batch-size": batch_size,
            "outer-batch-size": outer_batch_size,
            "hessian-batch-size": hessian_batch_size,
        }
        for key, size in {**sizes, "local-steps": local_steps}.items():
            if size < 1:
                raise ValueError(f"{key} must be >= 1, got {size}")
        kwargs.setdefault("aggregation", "uniform")
        kwargs.setdefault("name", "perfedavg")
        evaluate_config = {"adapt-steps": 1, "adapt-lr": alpha, **(kwargs.pop("evaluate_config", None) or {})}
        meta = {"alpha": alpha, "beta": beta, "delta": delta, "variant": variant, "local-steps": local_steps}
        super().__init__(fit_config={**meta, **sizes}, evaluate_config=evaluate_config, **kwargs)
