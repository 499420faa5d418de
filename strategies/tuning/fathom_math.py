"""FATHOM's server-side hyperparameter state and its update (pure numpy, no Flower).

ALGORITHMS.md section 2 (seed eq. 5, 9, 12-15): from the aggregated model update
``Delta_t`` and the clients' local alignment ``phi_i``, normalised hypergradients

    H_t = N_t = -cos(Delta_t, Delta_sm)          (0 in the first round: Delta_sm = 0)
    G_t       = -sum_i (nu_i / nu) * phi_i       ("eq12": times eta_t, the literal eq. 12)

drive exponentiated-gradient updates of the client learning rate ``eta``, the
epochs ``E`` and the batch size ``B`` (all reals), each clipped to its bounds:

    eta <- eta * exp(-gamma_lr * H)
    E   <- E   * exp(-gamma_epochs * (N + G))
    B   <- B   * exp( gamma_batch * G)
    Delta_sm <- a * Delta_sm + (1 - a) * Delta_t

With ``fathom-decay-window = W`` > 0 (issue 26; off by default) a stationarity test makes
the decrease ``H`` cannot: once the last ``W * 2**k`` values of ``H`` (``k`` decays so far)
no longer show progress, that is their mean is not below 0 by ``DECAY_Z`` standard errors,
``eta <- eta / fathom-decay-factor`` and the window restarts. Near stationarity SGD's
consecutive updates are only weakly anti-correlated (for a quadratic ``E[cos] ~ -eta h / 2``),
so ``H`` calls for a smaller step weakly however long it calls; the test acts when
consecutive updates stop agreeing, as the stationarity tests of statistical adaptive
stochastic approximation do (SASA, Lang, Xiao and Zhang 2019), and the doubling window
bounds the decays to about ``log2`` of the horizon.

With ``fathom-decay-arm = f`` < 1 the test starts only once the global model's loss ``L_t``
(the replies' example-weighted mean ``start-loss``) has fallen to ``f * L_1``, ``L_1`` being the
first tuned round's. On an initial plateau (FEMNIST: 4.13 = ln 62 at the start, 3.35 = the
label prior's entropy on the plateau, 0.81 of it) consecutive updates disagree too, and
halving the step there keeps the model on the plateau (docs/benchmarks.md, B2); a loss below
what the label prior alone gives says the model has left it.

With ``fathom-decay-test = "overshoot"`` (issue 39) a window decays only when its ``H`` is
significantly *positive*, its mean 2 standard errors above 0: consecutive updates disagree, the
step crosses the valley. That turns ``H``'s weak but consistent "slower" into a halving
without taking a climb where updates merely stop agreeing (``H`` near 0) for stationarity.

With ``fathom-setback = f`` > 0 (issue 39) the step is divided by ``fathom-decay-factor`` once
the armed run's loss gives back a fraction ``f`` of its progress, ``L_t - L_min > f (L_1 - L_min)``
with ``L_min`` the lowest loss so far, and again only once the loss has reached a new lowest
value since: a large step's collapse shows in the loss at once, where ``H`` still reads
agreement (B2 from lr 0.3). Re-arming on a new minimum, not on the loss coming back under
the line, keeps a model that has fallen back onto a plateau, whose loss hovers about the
line, from halving its step at every noisy crossing (B2, seed 2: 19 halvings to the floor).

With ``fathom-safe-ascent = f`` > 0 (issue 55; on by default, f = 0.5) the values may only
rise where the loss shows progress and fall back where it jumps. A round raises a value in
its riskier direction (``eta`` or ``E`` up, ``B`` down) only when its loss ``L_t`` is a new
lowest; otherwise the update may lower it or hold it. When ``L_t - L_min > f max(L_1 - L_min,
L_min)`` (the loss gave back a fraction f of its progress and rose by f of its lowest value:
:func:`jumped`) or every fit reply of the round was non-finite (:func:`fell_back`), the
values go back to those in force at ``L_min``, the step divided by ``fathom-decay-factor``,
the smoothed update starts afresh, and the tuner puts back the global model of ``L_min``
(:class:`strategies.tuning.tuner.FathomTuner`). B5 from beta = 0.3 (Per-FedAvg, MNIST) showed why:
FATHOM's ``H`` read agreement while beta rose 24% above its start in 7 rounds, and round 8's
replies were non-finite; another seed's model broke at beta 0.4 and never recovered though
``H`` then lowered beta for 90 rounds. On a quadratic past its stability limit the same
happens in closed form: with an even number of local steps the iterates grow along one
direction, which ``H`` reads as agreement (tests/test_fathom_safe_ascent.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from strategies.contracts.fathom import FathomSettings
from strategies.tuning.stationarity import decay_window, overshooting, stationary


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of the angle between two vectors; 0 where either norm is 0."""
    norm = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    return float(np.dot(a.ravel(), b.ravel()) / norm) if norm > 0 else 0.0


@dataclass(frozen=True, kw_only=True, eq=False)
class FathomState:
    """The hyperparameters in force and what their update needs from earlier rounds."""

    lr: float
    epochs: float
    batch_size: float
    smoothed_update: np.ndarray | None = None  # flattened; None until the first update
    round: int = 0
    recent_h: tuple[float, ...] = ()  # H since the last decay (fathom-decay-window > 0 only)
    decays: int = 0
    first_loss: float = math.nan  # L_1: the first tuned round's global loss (the test's gate)
    armed: bool = False  # whether the test has started (the gate opened)
    lowest_loss: float = math.nan  # L_min: the lowest global loss so far (the setback test)
    setback_floor: float = math.nan  # L_min when the last setback fired: the next needs a lower one (nan: none yet)
    setbacks: int = 0
    best: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # (lr, epochs, batch) in force at L_min
    fallbacks: int = 0  # safe ascent's fall-backs so far


@dataclass(frozen=True, kw_only=True, eq=False)
class RoundAggregate:
    """What one round gives the hyperparameter update.

    ``update`` is the flattened aggregated model update ``x_{t+1} - x_t``;
    ``phis`` and ``examples`` are the accepted clients' alignments and example counts.
    """

    update: np.ndarray
    phis: np.ndarray
    examples: np.ndarray = field(default_factory=lambda: np.zeros(0))
    start_loss: float = math.nan  # the global model's loss on the replies' first batches (nan: none reported)


@dataclass(frozen=True)
class Hypergradients:
    """The normalised hypergradients of one round."""

    global_term: float  # H_t = N_t
    local_term: float  # G_t


def hypergradients(state: FathomState, aggregate: RoundAggregate, settings: FathomSettings) -> Hypergradients:
    """``H_t`` from consecutive global updates, ``G_t`` from the clients' ``phi``."""
    previous = state.smoothed_update if state.smoothed_update is not None else np.zeros_like(aggregate.update)
    h = 0.0 - cosine(aggregate.update, previous)  # 0.0 - x, so an empty history gives +0.0, not -0.0
    weights = np.asarray(aggregate.examples, dtype=np.float64)
    g = -float(np.dot(weights, aggregate.phis) / weights.sum()) if weights.sum() > 0 else 0.0
    if settings.local_term == "eq12":
        g *= state.lr
    return Hypergradients(h, g)


def clipped(value: float, bounds: tuple[float, float]) -> float:
    """``value`` within ``bounds`` (low, high)."""
    return float(min(max(value, bounds[0]), bounds[1]))


def setback(loss: float, first_loss: float, lowest_loss: float, fraction: float) -> bool:
    """Whether ``loss`` has given back more than ``fraction`` of the progress ``first_loss - lowest_loss``.

    Non-finite inputs are no setback; neither is a run that has made no progress.
    """
    if not all(math.isfinite(v) for v in (loss, first_loss, lowest_loss)) or lowest_loss >= first_loss:
        return False
    return loss - lowest_loss > fraction * (first_loss - lowest_loss)


def gate_open(loss: float, first_loss: float, fraction: float) -> bool:
    """Whether the loss has fallen to ``fraction`` of the first round's; always with ``fraction`` 1.

    Without a finite loss and first loss (no client reported ``start-loss``) a gate below 1 stays shut.
    """
    if fraction >= 1:
        return True
    return math.isfinite(loss) and math.isfinite(first_loss) and loss <= fraction * first_loss


def jumped(loss: float, first_loss: float, lowest_loss: float, fraction: float) -> bool:
    """Whether ``loss`` jumped: it rose above ``lowest_loss`` by over ``fraction`` of the progress and of the lowest.

    ``L_t - L_min > f max(L_1 - L_min, L_min)``. Against the progress alone, noise about a
    small early progress (2.30 -> 2.20 -> 2.26) would count; against the lowest loss alone,
    a late, small loss doubling would. Before any progress (``L_min = L_1``) a loss over
    ``(1 + f)`` times the first is a jump: a step unstable from the start. Non-finite: no jump.
    """
    if not all(math.isfinite(v) for v in (loss, first_loss, lowest_loss)):
        return False
    return loss - lowest_loss > fraction * max(first_loss - lowest_loss, lowest_loss)


def new_lowest(loss: float, lowest: float) -> bool:
    """Whether ``loss`` shows progress: finite and below every loss so far (``lowest``; nan: none yet)."""
    return math.isfinite(loss) and (not math.isfinite(lowest) or loss < lowest)


def held(state: FathomState, lr: float, epochs: float, batch_size: float) -> tuple[float, float, float]:
    """The proposed values without a move in the riskier direction: lr and epochs not above, batch not below."""
    return min(lr, state.lr), min(epochs, state.epochs), max(batch_size, state.batch_size)


def fell_back(state: FathomState, settings: FathomSettings) -> FathomState:
    """``state`` after a safe-ascent fall-back: the values of the lowest loss, the step divided by the decay factor.

    Before any finite loss the values in force stand in for them. The smoothed update and
    the stationarity window start afresh: the model goes back to where they do not apply.
    """
    lr, epochs, batch_size = (best if math.isfinite(best) else now
                              for best, now in zip(state.best, (state.lr, state.epochs, state.batch_size),
                                                   strict=True))  # fmt: skip
    return replace(state, lr=clipped(lr / settings.decay_factor, settings.lr_bounds), epochs=epochs,
                   batch_size=batch_size, smoothed_update=None, recent_h=(), fallbacks=state.fallbacks + 1)  # fmt: skip


def _moved(value: float, gamma: float, signal: float, bounds: tuple[float, float]) -> float:
    """``clip(value * exp(-gamma * signal))``; a hyper-step of 0 holds the value as it is, unclipped."""
    if gamma == 0:
        return value
    return clipped(value * math.exp(-gamma * signal), bounds)


def fathom_update(
    state: FathomState,
    aggregate: RoundAggregate,
    settings: FathomSettings,
    *,
    work_bounds: tuple[float, float] | None = None,
) -> tuple[FathomState, Hypergradients]:
    """The next round's state and this round's hypergradients (seed eq. 13-15).

    ``epochs`` is the amount of local work: epochs for FATHOM itself, local steps when
    the tuner wraps a method whose work is steps (``work_bounds`` then replaces the
    epoch bounds).
    """
    hg = hypergradients(state, aggregate, settings)
    previous = state.smoothed_update if state.smoothed_update is not None else np.zeros_like(aggregate.update)
    smoothed = settings.smoothing * previous + (1.0 - settings.smoothing) * aggregate.update
    lr, recent_h, decays = _moved(state.lr, settings.gamma_lr, hg.global_term, settings.lr_bounds), (), state.decays
    first_loss = state.first_loss if math.isfinite(state.first_loss) else aggregate.start_loss
    armed = state.armed or gate_open(aggregate.start_loss, first_loss, settings.decay_arm)
    # round 1's H is 0 by definition; the window holds H from the round the gate opened on
    if settings.decay_window > 0 and state.smoothed_update is not None and armed:
        needed = decay_window(settings.decay_window, state.decays)
        recent_h = (*state.recent_h, hg.global_term)[-needed:]
        test = overshooting if settings.decay_test == "overshoot" else stationary
        if len(recent_h) == needed and test(np.array(recent_h)):
            lr, recent_h, decays = clipped(lr / settings.decay_factor, settings.lr_bounds), (), decays + 1
    lowest, floor, setbacks = state.lowest_loss, state.setback_floor, state.setbacks
    fresh = not math.isfinite(floor) or lowest < floor  # progress since the last setback (or none yet)
    if settings.setback > 0 and armed and fresh and setback(aggregate.start_loss, first_loss, lowest, settings.setback):
        lr, recent_h, setbacks = clipped(lr / settings.decay_factor, settings.lr_bounds), (), setbacks + 1
        floor = lowest
    epochs = _moved(state.epochs, settings.gamma_epochs, hg.global_term + hg.local_term,
                    work_bounds or settings.epochs_bounds)  # fmt: skip
    batch_size = _moved(state.batch_size, settings.gamma_batch, -hg.local_term, settings.batch_bounds)
    progress, best = new_lowest(aggregate.start_loss, state.lowest_loss), state.best
    if settings.safe_ascent > 0:
        if progress:
            best = (state.lr, state.epochs, state.batch_size)
        else:
            lr, epochs, batch_size = held(state, lr, epochs, batch_size)
    if math.isfinite(aggregate.start_loss):
        lowest = aggregate.start_loss if not math.isfinite(lowest) else min(lowest, aggregate.start_loss)
    new_state = replace(
        state,
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        smoothed_update=smoothed,
        round=state.round + 1,
        recent_h=recent_h,
        decays=decays,
        first_loss=first_loss,
        armed=armed,
        lowest_loss=lowest,
        setback_floor=floor,
        setbacks=setbacks,
        best=best,
    )
    if settings.safe_ascent > 0 and jumped(aggregate.start_loss, first_loss, state.lowest_loss, settings.safe_ascent):
        new_state = fell_back(new_state, settings)
    return new_state, hg
