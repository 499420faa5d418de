"""Coordinate median, trimmed mean and Krum against hand-computed cases and a brute-force Krum."""

import numpy as np
import pytest

from strategies.aggregation.robust import coordinate_median, krum_choice, krum_scores, trimmed_mean


def scalars(*values, dtype=np.float32):
    """One single-array model per value."""
    return [[np.array([v], dtype=dtype)] for v in values]


def points(*xy):
    """One model per 2-D point: a 2-vector in one array."""
    return [[np.array(p, dtype=np.float32)] for p in xy]


def test_median_and_trimmed_mean_of_five_scalars_by_hand():
    models = scalars(1, 2, 6, 100, -50)
    assert coordinate_median(models)[0].item() == 2.0
    # k = floor(0.2 * 5) = 1: drop 100 and -50, mean(1, 2, 6) = 3
    assert trimmed_mean(models, trim_fraction=0.2)[0].item() == 3.0
    # the brief's case: both robust statistics give 2 where the mean gives 11.2
    assert coordinate_median(scalars(1, 2, 3, 100, -50))[0].item() == 2.0
    assert trimmed_mean(scalars(1, 2, 3, 100, -50), trim_fraction=0.2)[0].item() == 2.0


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert coordinate_median(scalars(10, 1, 3, 2))[0].item() == 2.5


def test_trimmed_mean_without_trimming_is_the_mean():
    # 0.1 * 5 = 0.5 -> k = 0: nothing is dropped
    assert trimmed_mean(scalars(1, 2, 6, 100, -50), trim_fraction=0.1)[0].item() == pytest.approx(59 / 5)
    assert trimmed_mean(scalars(1, 2, 6, 100, -50), trim_fraction=0.0)[0].item() == pytest.approx(59 / 5)


def test_each_coordinate_of_each_array_is_combined_on_its_own():
    a = [np.array([[1.0, 5.0], [0.0, -1.0]]), np.array([3.0, 0.0, 9.0])]
    b = [np.array([[2.0, 4.0], [7.0, -3.0]]), np.array([1.0, 8.0, 9.0])]
    c = [np.array([[9.0, 6.0], [1.0, -2.0]]), np.array([2.0, 4.0, -9.0])]
    median = coordinate_median([a, b, c])
    np.testing.assert_array_equal(median[0], [[2.0, 5.0], [1.0, -2.0]])
    np.testing.assert_array_equal(median[1], [2.0, 4.0, 9.0])
    # n = 3, 0.34 * 3 -> k = 1: the trimmed mean of three values is their median
    trimmed = trimmed_mean([a, b, c], trim_fraction=0.34)
    for got, want in zip(trimmed, median, strict=True):
        np.testing.assert_array_equal(got, want)


def test_trimmed_mean_matches_an_independent_sort_per_coordinate():
    rng = np.random.default_rng(3)
    models = [[rng.normal(size=(3, 4)), rng.normal(size=5)] for _ in range(9)]
    got = trimmed_mean(models, trim_fraction=0.25)  # k = 2
    for layer in range(2):
        stacked = np.stack([m[layer] for m in models]).reshape(9, -1)
        want = [np.mean(sorted(column)[2:7]) for column in stacked.T]
        np.testing.assert_allclose(got[layer].ravel(), want, rtol=1e-12)


def test_integer_layers_take_the_element_wise_max_and_keep_their_dtype():
    models = [[np.array([1.0, 2.0], dtype=np.float32), np.array(c, dtype=np.int64)] for c in ([3, 9], [7, 1], [5, 5])]
    for combined in (coordinate_median(models), trimmed_mean(models, trim_fraction=0.34)):
        assert combined[1].dtype == np.int64
        np.testing.assert_array_equal(combined[1], [7, 9])
        assert combined[0].dtype == np.float32


def test_float_layers_keep_their_dtype_and_are_computed_in_float64():
    # in float32, 2**24 + 1 rounds back to 2**24: the float32 mean would be (2**24 + 2) / 3
    models = scalars(2**24, 1, 2, dtype=np.float32)
    got = trimmed_mean(models, trim_fraction=0.0)[0]
    assert got.dtype == np.float32
    assert got.item() == np.float32((2**24 + 3) / 3)
    assert got.item() != np.float32(2**24 + 2) / np.float32(3)
    assert coordinate_median(scalars(1, 2, 3, dtype=np.float16))[0].dtype == np.float16


def test_one_reply_retyped_to_int64_cannot_retype_the_layer_or_win_the_max():
    honest = scalars(1.5, 2.5, 3.5, 4.5)
    attacker = [np.array([2**62], dtype=np.int64)]
    median = coordinate_median([attacker, *honest])[0]
    assert median.dtype == np.float32 and median.item() == 3.5
    assert trimmed_mean([attacker, *honest], trim_fraction=0.2)[0].item() == pytest.approx(3.5)


def test_trim_fraction_out_of_range_is_refused():
    for bad in (-0.1, 0.5, 0.7):
        with pytest.raises(ValueError, match=r"trim_fraction must be in \[0, 0.5\)"):
            trimmed_mean(scalars(1, 2, 3), trim_fraction=bad)


def test_krum_scores_of_five_points_by_hand():
    # n = 5, f = 1: each point's 2 nearest others count
    models = points((0, 0), (1, 0), (0, 2), (1, 1), (10, 10))
    # (0,0): 1 to (1,0), 2 to (1,1); (1,0): 1, 1; (0,2): 2 to (1,1), 4 to (0,0); (1,1): 1, 2;
    # (10,10): 81 + 81 to (1,1), 100 + 64 to (0,2)
    np.testing.assert_array_equal(krum_scores(models, attackers=1), [3.0, 2.0, 6.0, 3.0, 326.0])
    assert krum_choice(models, attackers=1, keep=1) == [1]
    assert krum_choice(models, attackers=1, keep=3) == [1, 0, 3]  # 0 and 3 tie at 3: the lower index first


def test_krum_scores_match_a_brute_force_over_whole_models():
    rng = np.random.default_rng(7)
    n, f = 9, 2
    models = [[rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=4).astype(np.float32)] for _ in range(n)]
    flat = [np.concatenate([a.astype(np.float64).ravel() for a in m]) for m in models]
    want = []
    for i in range(n):
        distances = sorted(float(np.sum((flat[i] - flat[j]) ** 2)) for j in range(n) if j != i)
        want.append(sum(distances[: n - f - 2]))
    np.testing.assert_allclose(krum_scores(models, attackers=f), want, rtol=1e-12)
    assert krum_choice(models, attackers=f, keep=1) == [int(np.argmin(want))]


def test_krum_ignores_step_counters():
    models = [[np.array([float(x)]), np.array(steps, dtype=np.int64)] for x, steps in ((0, 5), (1, 500), (3, 7))]
    # f = 0: one neighbour each; 1 from 0 and 1, 4 from 1 to 3
    np.testing.assert_array_equal(krum_scores(models, attackers=0), [1.0, 1.0, 4.0])


def test_a_non_finite_model_scores_infinity_and_is_not_chosen():
    models = points((0, 0), (1, 0), (0, 1), (1, 1), (np.inf, np.nan))
    scores = krum_scores(models, attackers=1)
    assert scores[4] == np.inf and np.all(np.isfinite(scores[:4]))
    assert 4 not in krum_choice(models, attackers=1, keep=4)


def test_krum_refuses_fewer_than_2f_plus_3_models():
    with pytest.raises(ValueError, match=r"n = 6, f = 2"):
        krum_scores(points(*[(i, 0) for i in range(6)]), attackers=2)
    assert krum_scores(points(*[(i, 0) for i in range(7)]), attackers=2).shape == (7,)
    with pytest.raises(ValueError, match="attackers"):
        krum_scores(points((0, 0), (1, 1), (2, 2)), attackers=-1)


def test_keep_must_be_between_one_and_n():
    models = points((0, 0), (1, 0), (0, 1))
    for bad in (0, 4):
        with pytest.raises(ValueError, match=r"keep must be in \[1, 3\]"):
            krum_choice(models, attackers=0, keep=bad)
    assert krum_choice(models, attackers=0, keep=3) == [0, 1, 2]
