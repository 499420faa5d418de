"""The tuner's two backoffs of issue 39: the overshoot test and the setback test, by hand."""

import math

import numpy as np
import pytest

from strategies.contracts.fathom import FathomSettings
from strategies.contracts.keys import ConfigError
from strategies.screening.replies import Reply
from strategies.tuning.fathom_math import FathomState, RoundAggregate, fathom_update, setback
from strategies.tuning.stationarity import overshooting
from strategies.tuning.tuner import FathomTuner

STILL = {"gamma_lr": 0.0, "gamma_epochs": 0.0, "gamma_batch": 0.0}  # only the tests move lr


@pytest.mark.parametrize(
    ("recent_h", "expected"),
    [
        ([0.5, 0.4, 0.6], True),  # mean 0.5, sd 0.1: t = 8.66
        ([0.3, -0.1, 0.1], False),  # mean 0.1, sd 0.2: t = 0.87 < 2
        ([-0.5, -0.4, -0.6], False),  # agreement is no overshoot
        ([0.0, 0.0], False),  # identical zeros: no evidence either way
        ([0.2, 0.2], True),  # identical and disagreeing
        ([0.9], False),  # one value is no test
    ],
)
def test_overshooting_matches_the_t_statistic_by_hand(recent_h, expected):
    assert overshooting(np.array(recent_h)) is expected


def test_overshooting_threshold_is_z_standard_errors():
    # mean 0.1, sd 0.1155, n 4: t = sqrt(3); the mirror image of the stationarity test's case
    values = np.array([0.2, 0.0, 0.2, 0.0])
    assert overshooting(values) is False  # 1.73 < 2
    assert overshooting(values + 0.1) is True  # t = 3.46
    assert overshooting(values + 1e-9, z=math.sqrt(3)) is True
    assert overshooting(values - 1e-9, z=math.sqrt(3)) is False


@pytest.mark.parametrize(
    ("loss", "first", "lowest", "fraction", "expected"),
    [
        (2.6, 4.0, 2.0, 0.5, False),  # gave back 0.6 of 2.0 progress: not over half
        (3.1, 4.0, 2.0, 0.5, True),  # 1.1 > 1.0
        (2.9, 4.0, 2.0, 0.5, False),  # 0.9 < 1.0
        (3.0, 4.0, 2.0, 0.5, False),  # exactly half: not more than
        (5.0, 4.0, 4.0, 0.5, False),  # no progress made: nothing to give back
        (math.nan, 4.0, 2.0, 0.5, False),
        (3.5, 4.0, math.nan, 0.5, False),
    ],
)
def test_setback_is_a_fraction_of_the_progress(loss, first, lowest, fraction, expected):
    assert setback(loss, first, lowest, fraction) is expected


def run_updates(settings: FathomSettings, directions: list[tuple[float, float]], losses: list[float],
                lr: float = 0.1) -> list[FathomState]:  # fmt: skip
    state, states = FathomState(lr=lr, epochs=1.0, batch_size=16.0), []
    for direction, loss in zip(directions, losses, strict=True):
        aggregate = RoundAggregate(update=np.array(direction), phis=np.zeros(1), examples=np.ones(1), start_loss=loss)
        state, _ = fathom_update(state, aggregate, settings)
        states.append(state)
    return states


def test_overshoot_decays_oscillating_updates_and_leaves_a_noisy_climb_alone():
    # oscillating updates: H = +1 from round 2 on, a window of 2 decays after round 3, then 4 more rounds
    settings = FathomSettings(**STILL, decay_window=2, decay_test="overshoot")
    states = run_updates(settings, [(1.0, 0.0), (-1.0, 0.0)] * 4, [math.nan] * 8)
    assert [s.lr for s in states] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025])
    # each update orthogonal to every earlier one (H = 0 exactly): the stationarity test decays, overshoot not
    turning = [tuple(row) for row in np.eye(8)]
    overshoot = run_updates(settings, turning, [math.nan] * 8)
    stationary = run_updates(FathomSettings(**STILL, decay_window=2), turning, [math.nan] * 8)
    assert [s.lr for s in overshoot] == pytest.approx([0.1] * 8)
    assert stationary[-1].lr < 0.1


def test_setback_halves_once_then_again_only_after_a_new_lowest_loss():
    settings = FathomSettings(**STILL, setback=0.5, decay_arm=0.7)
    # first 4.0; armed at 2.8 (0.7 * 4.0); lowest 2.0 -> the line is 2.0 + 0.5 * 2.0 = 3.0. 3.2 fires; the loss
    # then crosses the line twice (2.5, 3.1) without a new lowest: no more; 1.0 is one, and 3.0 > 1.0 + 1.5 fires
    losses = [4.0, 3.5, 2.8, 2.0, 3.2, 2.5, 3.1, 3.6, 1.0, 2.4, 2.6]
    states = run_updates(settings, [(1.0, 0.0)] * len(losses), losses)
    assert [s.setbacks for s in states] == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2]
    assert [s.lr for s in states] == pytest.approx([0.1] * 4 + [0.05] * 6 + [0.025])
    assert states[-1].lowest_loss == 1.0 and states[-1].setback_floor == 1.0


def test_a_round_without_a_loss_is_no_setback():
    settings = FathomSettings(**STILL, setback=0.5, decay_arm=0.7)
    states = run_updates(settings, [(1.0, 0.0)] * 4, [4.0, 2.0, math.nan, 3.5])
    assert [s.setbacks for s in states] == [0, 0, 0, 1]
    assert states[2].lowest_loss == 2.0  # a missing loss leaves the lowest as it was


def test_setback_waits_for_the_gate():
    # 4.0 -> 3.0 is progress, but the gate (0.5 * 4.0 = 2.0) is shut, so the rise to 3.9 is no setback
    states = run_updates(FathomSettings(**STILL, setback=0.5, decay_arm=0.5), [(1.0, 0.0)] * 3, [4.0, 3.0, 3.9])
    assert [s.lr for s in states] == pytest.approx([0.1] * 3)


def test_setback_without_a_gate_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="fathom-setback.*fathom-decay-arm"):
        FathomSettings(setback=0.5).check()


def test_a_checkpoint_keeps_the_setback_state():
    settings = FathomSettings(**STILL, setback=0.5, decay_arm=0.7)
    keys, start = {"step": "lr", "work": "local-epochs", "batch": "batch-size"}, {"lr": 0.1, "local-epochs": 1.0,
                                                                                  "batch-size": 16}  # fmt: skip
    tuner, model = FathomTuner(settings=settings, keys=keys, start=start), np.zeros(2)
    for loss in (4.0, 2.0, 3.5):
        reply = Reply(node="n0", partition=0, arrays=[], num_examples=10, metrics={"phi": 0.0, "start-loss": loss})
        signals = tuner.update([model], [model + 1.0], [reply])
        model = model + 1.0
    assert signals["lr-setbacks"] == 1.0 and tuner.state.lr == pytest.approx(0.05)
    resumed = FathomTuner(settings=settings, keys=keys, start=start)
    resumed.restore(*tuner.checkpoint_state())
    assert (resumed.state.lowest_loss, resumed.state.setback_floor, resumed.state.setbacks) == (2.0, 2.0, 1)
