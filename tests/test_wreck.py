"""The wreck watch (issue 71 item 3): starved rounds in a row, and a run that ends at the majority-class floor."""

from __future__ import annotations

import pytest

from strategies.rounds.wreck import WreckWatch, majority_floor

KEYS = ("accuracy", "global-accuracy")


def record(round_, sampled, accepted, **accuracies):
    return {"round": round_, "clients-sampled": sampled, "clients-succeeded": accepted, **accuracies}


def test_the_verdict_comes_after_patience_starved_rounds_in_a_row():
    watch = WreckWatch(patience=3)
    # 4 of 10 accepted is starved, 5 of 10 is not: half is enough
    rounds = [(10, 4), (10, 3), (10, 5), (10, 0), (10, 1)]
    assert [watch.observe(r, record(r, s, a)) for r, (s, a) in enumerate(rounds, start=1)] == [None] * 5
    verdict = watch.observe(6, record(6, 10, 2))
    assert (verdict.first_round, verdict.last_round) == (4, 6)
    assert "fewer than half of the sampled replies were accepted (last: 2 of 10)" in verdict.reason
    assert "robust aggregation" in verdict.reason
    assert WreckWatch(patience=0).observe(1, record(1, 10, 0)) is None  # 0: never


def test_a_round_that_sampled_nobody_is_not_starved():
    watch = WreckWatch(patience=1)
    assert watch.observe(1, record(1, 0, 0)) is None and watch.streak == 0


@pytest.mark.parametrize(("final", "wrecked"), [
    ({"accuracy": 0.002, "global-accuracy": 0.002}, True),    # below the floor: the run
    ({"accuracy": 0.305, "global-accuracy": 0.31}, True),     # within 0.01 of it
    ({"accuracy": 0.35, "global-accuracy": 0.30}, False),     # the personal models learned
    ({"global-accuracy": 0.29}, True),                         # only a global test
])  # fmt: skip
def test_a_run_ending_with_every_accuracy_at_the_majority_floor_is_wrecked(final, wrecked):
    floor = majority_floor([{0: 30, 1: 10}, {0: 0, 1: 60}, {2: 0}])  # pooled: 30, 70, 0 of 100
    assert floor == pytest.approx(0.7)
    assert majority_floor([{0: 30, 1: 20}, {2: 50}, None]) == pytest.approx(0.5)
    floor = 0.3  # the cases above are written for a floor of 0.3
    history = [record(r, 10, 10) for r in range(1, 5)] + [record(5, 10, 10, **final)]
    verdict = WreckWatch(patience=5).at_the_end(history, floor, KEYS)
    assert (verdict is not None) == wrecked
    if wrecked:
        assert "the run ended at the majority-class floor" in verdict.reason and "0.3000" in verdict.reason


def test_a_short_run_or_an_unknown_floor_is_never_held_against_it():
    at_floor = [record(r, 10, 10, accuracy=0.1) for r in range(1, 5)]
    assert WreckWatch(patience=5).at_the_end(at_floor, 0.3, KEYS) is None  # 4 rounds < patience
    assert WreckWatch(patience=3).at_the_end(at_floor, None, KEYS) is None
    assert WreckWatch(patience=3).at_the_end([record(r, 1, 1) for r in range(1, 5)], 0.3, KEYS) is None  # untested
    assert majority_floor([None, {}]) is None
