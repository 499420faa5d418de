"""FATHOM's safe ascent (issue 55): values rise only on progress, and fall back to the lowest loss's on a jump.

By hand on FATHOM's pure update, then on a quadratic whose step size has a closed-form
stability limit: gradient descent on ``f(x) = h x^2 / 2`` multiplies ``x`` by ``1 - eta h``
a step, so it diverges once ``eta > 2 / h``. A tuner with a large hyper-step raises
``eta`` past the limit; with safe ascent the run falls back and converges.
"""

import math

import numpy as np
import pytest

from strategies.contracts.fathom import FathomSettings
from strategies.screening.replies import Reply
from strategies.tuning.fathom_math import (
    FathomState,
    RoundAggregate,
    fathom_update,
    fell_back,
    held,
    jumped,
    new_lowest,
)
from strategies.tuning.tuner import FathomTuner

AGREE = [(1.0, 0.0)] * 6  # every update along the last: H = -1 from round 2, so lr rises by exp(gamma) a round


def run(settings: FathomSettings, losses: list[float], directions=AGREE, lr: float = 0.1) -> list[FathomState]:
    state, states = FathomState(lr=lr, epochs=1.0, batch_size=16.0), []
    for direction, loss in zip(directions, losses, strict=False):
        aggregate = RoundAggregate(update=np.array(direction), phis=np.full(1, 0.5), examples=np.ones(1),
                                   start_loss=loss)  # fmt: skip
        state, _ = fathom_update(state, aggregate, settings)
        states.append(state)
    return states


def test_new_lowest_needs_a_finite_loss_below_every_earlier_one():
    assert new_lowest(1.0, math.nan) and new_lowest(0.9, 1.0)
    assert not new_lowest(1.0, 1.0) and not new_lowest(1.1, 1.0) and not new_lowest(math.nan, 1.0)


@pytest.mark.parametrize(
    ("loss", "first", "lowest", "expected"),
    [
        (2.26, 2.3, 2.2, False),  # gave back 0.6 of a small early progress, but rose 3% of the lowest: noise
        (2.0, 2.3, 1.0, True),  # gave back 0.77 of the progress and rose 100%
        (1.6, 2.3, 1.0, False),  # 0.46 of the progress
        (0.45, 2.3, 0.2, False),  # rose 125%, but gave back 0.12 of the progress
        (math.nan, 2.3, 1.0, False),
    ],
)
def test_a_jump_is_large_against_the_progress_and_against_the_loss(loss, first, lowest, expected):
    assert jumped(loss, first, lowest, 0.5) is expected


def test_held_keeps_only_the_safer_moves():
    state = FathomState(lr=0.1, epochs=2.0, batch_size=16.0)
    assert held(state, 0.2, 3.0, 8.0) == (0.1, 2.0, 16.0)  # up, up, down: all riskier, all held
    assert held(state, 0.05, 1.0, 32.0) == (0.05, 1.0, 32.0)  # the safer moves pass as they are


def test_while_the_loss_falls_every_round_the_update_is_fathoms_own():
    moving = {"gamma_lr": 0.1, "gamma_epochs": 0.1, "gamma_batch": 0.1}
    losses = [2.3, 2.0, 1.7, 1.5, 1.2, 1.0]
    safe, plain = run(FathomSettings(**moving), losses), run(FathomSettings(**moving, safe_ascent=0.0), losses)
    for one, other in zip(safe, plain, strict=True):
        assert (one.lr, one.epochs, one.batch_size) == (other.lr, other.epochs, other.batch_size)
    assert safe[-1].lr == pytest.approx(0.1 * math.exp(0.1 * 5))  # round 1's H is 0, then five rises
    assert safe[-1].fallbacks == 0


def test_a_round_without_progress_may_lower_a_value_but_not_raise_it():
    settings = FathomSettings(gamma_lr=0.1, gamma_epochs=0.0, gamma_batch=0.0)
    states = run(settings, [2.3, 2.0, 2.1, 2.05, 1.9])  # rounds 3 and 4 are no new lowest
    assert [s.lr for s in states] == pytest.approx([0.1, 0.1 * math.exp(0.1), 0.1 * math.exp(0.1),
                                                    0.1 * math.exp(0.1), 0.1 * math.exp(0.2)])  # fmt: skip
    # opposite updates (H = +1) lower lr whatever the loss did
    lowered = run(settings, [2.3, 2.4, 2.5], directions=[(1.0, 0.0), (-1.0, 0.0), (1.0, 0.0)])
    assert [s.lr for s in lowered] == pytest.approx([0.1, 0.1 * math.exp(-0.1), 0.1 * math.exp(-0.2)])
    # a run whose clients report no loss shows no progress: FATHOM's update may only lower its values
    unknown = run(settings, [math.nan] * 4)
    assert [s.lr for s in unknown] == pytest.approx([0.1] * 4)


def test_a_jump_puts_back_the_values_of_the_lowest_loss_with_the_step_halved():
    settings = FathomSettings(gamma_lr=0.1, gamma_epochs=0.0, gamma_batch=0.0)
    # lowest 1.0 at round 3 (lr then in force: 0.1 e^0.1); round 4 gives back 0.6 of the 1.3 progress (no more
    # than half), round 5 0.95
    states = run(settings, [2.3, 1.5, 1.0, 1.6, 1.95])
    assert states[3].fallbacks == 0 and states[3].lr == pytest.approx(0.1 * math.exp(0.2))  # 0.6 < 0.65: held
    assert states[4].fallbacks == 1
    assert states[4].lr == pytest.approx(0.1 * math.exp(0.1) / 2)
    assert states[4].smoothed_update is None and states[4].recent_h == ()


def test_the_jump_fraction_is_the_key():
    losses = [2.3, 1.5, 1.0, 1.6]  # round 4 gives back 0.46 of the progress
    assert run(FathomSettings(gamma_lr=0.1, safe_ascent=0.4), losses)[-1].fallbacks == 1
    assert run(FathomSettings(gamma_lr=0.1, safe_ascent=0.5), losses)[-1].fallbacks == 0
    assert run(FathomSettings(gamma_lr=0.1, safe_ascent=0.0), [2.3, 1.0, 9.0])[-1].fallbacks == 0


def test_fell_back_before_any_loss_halves_the_step_in_force():
    state = FathomState(lr=0.4, epochs=2.0, batch_size=8.0)
    back = fell_back(state, FathomSettings(decay_factor=4.0))
    assert (back.lr, back.epochs, back.batch_size, back.fallbacks) == (0.1, 2.0, 8.0, 1)


# ---------------------------------------------------------------- the tuner on a quadratic, closed form

H = 4.0  # curvature: gradient descent diverges for eta > 2 / H = 0.5
STEPS = 4  # an even number of steps: past the limit x grows along one direction, so H reads agreement
START = 0.6  # q = 1 - eta H = -1.4 a step: the model grows by q^4 = 3.84 a round


def local_run(x: float, lr: float) -> tuple[float, float, float]:
    """``STEPS`` GD steps on h x^2 / 2 from ``x``: the end point, the start loss and phi (successive steps' cosine)."""
    start_loss, points = H * x * x / 2, [x]
    for _ in range(STEPS):
        points.append(points[-1] * (1 - lr * H))
    steps = np.diff(points)
    phi = float(np.mean(np.sign(steps[1:] * steps[:-1]))) if np.all(np.isfinite(steps)) else 0.0
    return points[-1], start_loss, phi


def tuned_run(safe_ascent: float, rounds: int = 12) -> tuple[list[float], list[float], FathomTuner]:
    """A one-client federation tuned from eta = 0.6; the start losses and the lr in force, round by round."""
    settings = FathomSettings(gamma_lr=0.3, gamma_epochs=0.0, gamma_batch=0.0, safe_ascent=safe_ascent)
    tuner = FathomTuner(settings=settings, keys={"step": "lr", "work": "local-steps", "batch": "batch-size"},
                        start={"lr": START, "local-steps": STEPS, "batch-size": 1})  # fmt: skip
    model, losses, lrs = [np.array([1.0])], [], []
    for _ in range(rounds):
        lrs.append(tuner.state.lr)
        end, start_loss, phi = local_run(float(model[0][0]), tuner.state.lr)
        losses.append(start_loss)
        combined = [np.array([end])]
        reply = Reply("0", 0, combined, 10, {"phi": phi, "start-loss": start_loss, "train-loss": 0.0})
        tuner.update(model, combined, [reply])
        restored = tuner.restored_model()
        model = restored if restored is not None else combined
    return losses, lrs, tuner


def test_on_a_quadratic_fathom_alone_raises_an_unstable_step_and_the_loss_blows_up():
    losses, lrs, _ = tuned_run(safe_ascent=0.0)
    assert losses[1] == pytest.approx(2.0 * 1.4**8)  # round 1 at eta 0.6: x = 1 -> (-1.4)^4
    assert lrs[2] > lrs[1] == START  # H = -1: the model grows along one direction, which reads as agreement
    assert losses[-1] > 1e20


def test_on_a_quadratic_safe_ascent_falls_back_once_and_converges_at_the_closed_form_rate():
    losses, lrs, tuner = tuned_run(safe_ascent=0.5)
    # round 2 sees the jump (29.5 against the first 2.0): back to round 1's model and eta, halved
    assert tuner.state.fallbacks == 1
    assert lrs[:4] == pytest.approx([0.6, 0.6, 0.3, 0.3])
    assert losses[2] == pytest.approx(2.0)  # the model of the lowest loss, x = 1, put back
    assert losses[3] == pytest.approx(2.0 * (1 - 0.3 * H) ** 8)  # then GD at eta 0.3: x -> (-0.2)^4 x
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < 1e-10
