"""The tuner's start probe: its grid, slots, tally and choice by hand, and the tuner's probe rounds."""

import math

import numpy as np
import pytest
from conftest import settings

from strategies.contracts.fathom import FathomSettings
from strategies.screening.replies import Reply
from strategies.tuning.start_probe import ProbeTally, local_progress, probe_choice, probe_factors, probe_slots, tallied
from strategies.tuning.tuner import FathomTuner


def test_the_grid_is_factor_powers_around_the_start():
    np.testing.assert_allclose(probe_factors(3.0, 5), [1 / 9, 1 / 3, 1.0, 3.0, 9.0])
    np.testing.assert_allclose(probe_factors(10.0, 3), [0.1, 1.0, 10.0])


def test_slots_deal_the_sampled_clients_in_turn_rotated_by_the_round():
    assert probe_slots([7, 2, 9, 4], server_round=1, points=3) == {7: 1, 2: 2, 9: 0, 4: 1}
    assert probe_slots([7, 2, 9, 4], server_round=2, points=3) == {7: 2, 2: 0, 9: 1, 4: 2}


def test_local_progress_is_the_loss_ratio_and_nan_without_one():
    assert local_progress(3.0, 4.0) == 0.75
    assert math.isnan(local_progress(3.0, math.nan)) and math.isnan(local_progress(3.0, 0.0))
    assert math.isnan(local_progress(math.inf, 4.0))


def test_the_tally_and_the_choice_by_hand():
    tally = ProbeTally.empty(3)
    # round 1: slot 0 gets 0.9 and 0.8, slot 1 0.95, slot 2 0.7
    tally = tallied(tally, {1: 0, 2: 0, 3: 1, 4: 2}, {1: 0.9, 2: 0.8, 3: 0.95, 4: 0.7})
    np.testing.assert_allclose(tally.means(), [0.85, 0.95, 0.7])
    assert probe_choice(tally) == 2 and tally.rounds == 1
    # round 2: slot 2's second client has no accepted reply (it diverged): slot 2 is out, slot 0 wins
    tally = tallied(tally, {5: 2, 6: 2, 7: 1}, {5: 0.6, 7: 0.9})
    np.testing.assert_allclose(tally.means(), [0.85, 0.925, 0.65])
    assert tally.failed.tolist() == [False, False, True] and probe_choice(tally) == 0
    # a tie goes to the slot nearer the middle; nothing usable keeps the middle
    tie = tallied(ProbeTally.empty(3), {1: 0, 2: 1}, {1: 0.5, 2: 0.5})
    assert probe_choice(tie) == 1
    assert probe_choice(tallied(ProbeTally.empty(5), {1: 0, 2: 4}, {})) == 2


def reply(partition, train_loss, start_loss, examples=10):
    return Reply(node=f"n{partition}", partition=partition, arrays=[np.zeros(2)], num_examples=examples,
                 metrics={"train-loss": train_loss, "start-loss": start_loss, "phi": 0.0})  # fmt: skip


def test_the_tuner_probes_then_starts_from_the_choice_and_resumes_from_a_checkpoint():
    tuner = FathomTuner(settings=FathomSettings(probe_rounds=2, probe_points=3, probe_factor=10.0),
                        keys={"step": "lr", "work": "local-epochs", "batch": "batch-size"},
                        start={"lr": 0.01, "local-epochs": 1.0, "batch-size": 16})  # fmt: skip
    config = {"lr": 0.01, "local-epochs": 1.0, "batch-size": 16, "server-round": 1}
    assert tuner.probing
    configs = tuner.configs(1, [4, 5, 6], config)  # slots 1, 2, 0: lr 0.01, 0.1, 0.001
    assert [configs[p]["lr"] for p in (4, 5, 6)] == pytest.approx([0.01, 0.1, 0.001])
    replies = [reply(4, 3.0, 4.0), reply(5, 2.0, 4.0), reply(6, 3.9, 4.0)]
    assert [r.partition for r in tuner.model_replies(replies)] == [4]  # the model takes the start value's
    previous = [np.zeros(2)]
    assert tuner.update(previous, None, replies) == {"probe-round": 1.0}
    arrays, scalars = tuner.checkpoint_state()
    resumed = FathomTuner(settings=tuner.settings, keys=tuner.keys, start={"lr": 0.01, "local-epochs": 1.0,
                                                                          "batch-size": 16})  # fmt: skip
    resumed.restore(arrays, scalars)
    for each in (tuner, resumed):
        each.configs(2, [7, 8], config)  # slots 2 and 0: lr 0.1, 0.001
        signals = each.update(previous, [np.ones(2)], [reply(7, 3.8, 4.0), reply(8, 2.8, 4.0)])
        # slot means: 0 -> (0.975 + 0.7) / 2 = 0.8375, 1 -> 0.75, 2 -> (0.5 + 0.95) / 2 = 0.725: lr 0.1 wins
        assert signals == {"probe-round": 2.0, "probe-factor": 10.0, "probe-rho": pytest.approx(0.725)}
        assert each.values()["lr"] == pytest.approx(0.1) and not each.probing
        assert each.configs(3, [1, 2], config) == {1: config, 2: config}


def test_an_even_number_of_probe_points_is_refused_naming_the_key():
    from app.config import ConfigError

    with pytest.raises(ConfigError, match="'fathom-probe-points': 4 is even"):
        settings(strategy="fathom", fathom_probe_points=4)
