"""``bench/self_tuning.py``'s seed-paired gaps, checked by hand (the runs themselves are the benchmark's)."""

from __future__ import annotations

import pytest

from bench.self_tuning import paired_gaps


def run(seed: int, accuracy: float | None) -> dict:
    return {"seed": seed, "accuracy": accuracy}


def test_each_tuned_row_is_paired_seed_by_seed_with_the_best_fixed_row():
    runs = {"fixed a": [run(0, 0.90), run(1, 0.80), run(2, 0.70)], "fixed b": [run(0, 0.5), run(1, 0.5)],
            "tuned": [run(1, 0.79), run(0, 0.92), run(2, 0.69)]}  # fmt: skip
    rows = [{"label": "fixed a", "method": "m", "tuned": False}, {"label": "fixed b", "method": "m", "tuned": False},
            {"label": "tuned", "method": "m", "tuned": True}]  # fmt: skip
    [pair] = paired_gaps(rows, {"m": {"best-fixed": "fixed a"}}, runs)
    # differences +2, -1, -1 points: mean 0, sd sqrt(3), so the half-width is t(2) sqrt(3) / sqrt(3) = 4.303
    assert pair["against"] == "fixed a" and pair["seeds"] == 3
    assert pair["gap-points"] == pytest.approx(0.0, abs=1e-9)
    assert pair["ci95-points"] == pytest.approx(4.303)


def test_a_partial_sweep_pairs_with_every_fixed_row_on_the_seeds_both_have():
    runs = {"fixed a": [run(0, 0.9), run(1, 0.8)], "fixed b": [run(1, 0.5), run(2, 0.6)],
            "tuned": [run(0, 0.8), run(1, 0.7), run(2, 0.7)]}  # fmt: skip
    rows = [{"label": "fixed a", "method": "m", "tuned": False}, {"label": "fixed b", "method": "m", "tuned": False},
            {"label": "tuned", "method": "m", "tuned": True}]  # fmt: skip
    pairs = {p["against"]: p for p in paired_gaps(rows, {}, runs)}
    assert pairs["fixed a"]["gap-points"] == pytest.approx(-10.0)
    assert pairs["fixed a"]["ci95-points"] == pytest.approx(0.0, abs=1e-9)  # both seeds lose exactly 10 points
    assert pairs["fixed b"]["gap-points"] == pytest.approx(15.0) and pairs["fixed b"]["seeds"] == 2


def test_a_run_that_diverged_and_stopped_is_left_out_of_the_pairs():
    stopped = {"seed": 1, "accuracy": 0.17, "status": "stopped"}  # the run log's older lines kept the last evaluation
    runs = {"fixed": [run(0, 0.9), run(1, 0.8), run(2, 0.7)], "tuned": [run(0, 0.8), stopped, run(2, 0.6)]}
    rows = [{"label": "fixed", "method": "m", "tuned": False}, {"label": "tuned", "method": "m", "tuned": True}]
    [pair] = paired_gaps(rows, {"m": {"best-fixed": "fixed"}}, runs)
    assert pair["seeds"] == 2 and pair["gap-points"] == pytest.approx(-10.0)
