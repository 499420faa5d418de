"""FATHOM's stationarity test (``fathom-decay-window``): the test by hand and the decays it makes."""

import math

import numpy as np
import pytest

from strategies.contracts.fathom import FathomSettings
from strategies.screening.replies import Reply
from strategies.tuning.fathom_math import FathomState, RoundAggregate, fathom_update, gate_open
from strategies.tuning.stationarity import stationary
from strategies.tuning.tuner import FathomTuner, mean_start_loss


@pytest.mark.parametrize(
    ("recent_h", "expected"),
    [
        ([-0.5, -0.4, -0.6], False),  # mean -0.5, sd 0.1: t = -0.5 / (0.1 / sqrt 3) = -8.66, clear progress
        ([0.1, -0.1, 0.05], True),  # mean 0.0167: no progress
        ([-0.3, 0.1, -0.1], True),  # mean -0.1, sd 0.2: t = -0.1 / (0.2 / sqrt 3) = -0.87 > -2
        ([-0.3, -0.1, -0.2, -0.2], False),  # mean -0.2, sd 0.0816: t = -4.9
        ([0.0, 0.0], True),  # identical: no progress
        ([-0.2, -0.2], False),  # identical and agreeing
        ([0.9], False),  # one value is no test
    ],
)
def test_stationary_matches_the_t_statistic_by_hand(recent_h, expected):
    assert stationary(np.array(recent_h)) is expected


def test_stationary_threshold_is_z_standard_errors():
    # mean -0.1, sd sqrt(0.04 / 3) = 0.1155, n 4: t = -0.1 / 0.0577 = -sqrt(3)
    values = np.array([-0.2, 0.0, -0.2, 0.0])
    assert stationary(values) is True  # -1.73 > -2
    assert stationary(values - 0.1) is False  # mean -0.2: t = -3.46
    assert stationary(values + 1e-9, z=math.sqrt(3)) is True  # a hair either side of t = -z flips the verdict
    assert stationary(values - 1e-9, z=math.sqrt(3)) is False


def run_updates(settings: FathomSettings, directions: list[tuple[float, float]], lr: float = 0.1,
                losses: list[float] | None = None) -> list[FathomState]:  # fmt: skip
    state, states = FathomState(lr=lr, epochs=1.0, batch_size=16.0), []
    for direction, loss in zip(directions, losses or [math.nan] * len(directions), strict=True):
        aggregate = RoundAggregate(update=np.array(direction), phis=np.zeros(1), examples=np.ones(1), start_loss=loss)
        state, _ = fathom_update(state, aggregate, settings)
        states.append(state)
    return states


def test_oscillating_updates_divide_the_lr_after_a_window_then_after_a_doubled_one():
    # gamma_lr 0: only the test moves lr. Updates alternate (1, 0), (-1, 0): after round 1,
    # Delta_sm points against the next update, so H = +1 every round from round 2 on.
    settings = FathomSettings(gamma_lr=0.0, gamma_epochs=0.0, gamma_batch=0.0, decay_window=2, decay_factor=2.0)
    states = run_updates(settings, [(1.0, 0.0), (-1.0, 0.0)] * 4)
    lrs = [s.lr for s in states]
    # round 1 has no H; rounds 2-3 fill the first window (2) -> /2; rounds 4-7 the second (4) -> /2 again
    assert lrs == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025])
    assert [s.decays for s in states] == [0, 0, 1, 1, 1, 1, 2, 2]
    assert states[2].recent_h == () and states[5].recent_h == (1.0, 1.0, 1.0)


def test_agreeing_updates_never_decay_and_the_test_leaves_fathoms_own_move():
    settings = FathomSettings(gamma_lr=0.1, gamma_epochs=0.0, gamma_batch=0.0, decay_window=2, safe_ascent=0.0)
    states = run_updates(settings, [(1.0, 0.0)] * 6)
    # H = -1 from round 2: lr * exp(0.1) a round, never divided
    assert [s.lr for s in states] == pytest.approx([0.1 * math.exp(0.1 * k) for k in range(6)])
    assert all(s.decays == 0 for s in states)


def test_decay_respects_the_lower_bound_and_off_is_fathom_as_published():
    bounded = FathomSettings(gamma_lr=0.0, gamma_epochs=0.0, gamma_batch=0.0, decay_window=2, lr_min=0.08)
    assert run_updates(bounded, [(1.0, 0.0), (-1.0, 0.0)] * 2)[-1].lr == pytest.approx(0.08)
    off = FathomSettings(gamma_lr=0.0, gamma_epochs=0.0, gamma_batch=0.0)
    states = run_updates(off, [(1.0, 0.0), (-1.0, 0.0)] * 4)
    assert all(s.lr == 0.1 and s.recent_h == () and s.decays == 0 for s in states)


def test_the_tuner_reports_decays_and_resumes_its_window_from_a_checkpoint():
    settings = FathomSettings(gamma_lr=0.0, gamma_epochs=0.0, gamma_batch=0.0, decay_window=3)
    keys, start = {"step": "lr", "work": "local-epochs", "batch": "batch-size"}, {"lr": 0.1, "local-epochs": 1.0,
                                                                                  "batch-size": 16}  # fmt: skip
    replies = [Reply(node="n0", partition=0, arrays=[np.zeros(2)], num_examples=10, metrics={"phi": 0.0})]
    tuner, model = FathomTuner(settings=settings, keys=keys, start=start), np.zeros(2)
    steps = [np.array([1.0, 0.0]), np.array([-1.0, 0.0])] * 3
    for step in steps[:3]:  # round 1 (no H) and two values of H: the window of 3 is not full yet
        signals = tuner.update([model], [model + step], replies)
        model = model + step
    assert signals["lr-decays"] == 0.0 and len(tuner.state.recent_h) == 2
    resumed = FathomTuner(settings=settings, keys=keys, start=start)
    resumed.restore(*tuner.checkpoint_state())
    for each in (tuner, resumed):
        signals = each.update([model], [model + steps[3]], replies)
        assert signals["lr-decays"] == 1.0 and each.values()["lr"] == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("loss", "first", "fraction", "expected"),
    [
        (3.0, 4.0, 0.75, True),  # 3.0 = 0.75 * 4.0: at the fraction opens
        (3.01, 4.0, 0.75, False),
        (math.nan, 4.0, 0.75, False),  # no loss reported: a gate below 1 stays shut
        (math.nan, math.nan, 1.0, True),  # 1: open from the start, with or without losses
        (9.0, 4.0, 1.0, True),
    ],
)
def test_gate_opens_at_the_fraction_of_the_first_loss(loss, first, fraction, expected):
    assert gate_open(loss, first, fraction) is expected


def test_a_gated_test_ignores_a_plateau_and_windows_h_from_the_round_the_gate_opens():
    # oscillating updates throughout (H = +1 from round 2); the loss sits at 4.0 for 4 rounds, then falls
    settings = FathomSettings(gamma_lr=0.0, gamma_epochs=0.0, gamma_batch=0.0, decay_window=2, decay_arm=0.7)
    losses = [4.0, 4.1, 3.9, 4.0, 2.8, 2.9, 2.5, 2.0]
    states = run_updates(settings, [(1.0, 0.0), (-1.0, 0.0)] * 4, losses=losses)
    assert [s.armed for s in states] == [False] * 4 + [True] * 4  # 2.8 <= 0.7 * 4.0 = 2.8 in round 5
    assert all(s.first_loss == 4.0 for s in states)  # round 1's loss, kept
    # rounds 5-6 fill the first window (2) -> /2; unarmed, the same updates decayed after round 3 (above)
    assert [s.lr for s in states] == pytest.approx([0.1] * 5 + [0.05] * 3)
    ungated = run_updates(FathomSettings(gamma_lr=0.0, gamma_epochs=0.0, gamma_batch=0.0, decay_window=2),
                          [(1.0, 0.0), (-1.0, 0.0)] * 4, losses=losses)  # fmt: skip
    assert [s.lr for s in ungated] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025])


def test_mean_start_loss_weights_by_examples_and_skips_replies_without_one():
    replies = [Reply(node="a", partition=0, arrays=[], num_examples=10, metrics={"start-loss": 2.0}),
               Reply(node="b", partition=1, arrays=[], num_examples=30, metrics={"start-loss": 4.0}),
               Reply(node="c", partition=2, arrays=[], num_examples=50, metrics={"start-loss": float("nan")}),
               Reply(node="d", partition=3, arrays=[], num_examples=50, metrics={})]  # fmt: skip
    assert mean_start_loss(replies) == pytest.approx((10 * 2.0 + 30 * 4.0) / 40)
    assert math.isnan(mean_start_loss(replies[2:]))


def test_the_tuner_arms_once_and_a_checkpoint_keeps_the_gate():
    settings = FathomSettings(gamma_lr=0.0, gamma_epochs=0.0, gamma_batch=0.0, decay_window=2, decay_arm=0.5)
    keys, start = {"step": "lr", "work": "local-epochs", "batch": "batch-size"}, {"lr": 0.1, "local-epochs": 1.0,
                                                                                  "batch-size": 16}  # fmt: skip

    def replies(loss: float) -> list[Reply]:
        return [Reply(node="n0", partition=0, arrays=[], num_examples=10, metrics={"phi": 0.0, "start-loss": loss})]

    tuner, model = FathomTuner(settings=settings, keys=keys, start=start), np.zeros(2)
    armed = []
    for step, loss in zip([np.array([1.0, 0.0]), np.array([-1.0, 0.0])] * 2, [2.0, 1.9, 0.9, 1.5], strict=True):
        armed.append(tuner.update([model], [model + step], replies(loss))["decay-armed"])
        model = model + step
    assert armed == [0.0, 0.0, 1.0, 1.0]  # once open, a loss back above the line does not shut it
    assert tuner.state.decays == 1  # H of rounds 3 and 4: the first window
    resumed = FathomTuner(settings=settings, keys=keys, start=start)
    resumed.restore(*tuner.checkpoint_state())
    assert resumed.state.armed and resumed.state.first_loss == 2.0
