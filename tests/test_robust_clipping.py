"""Centered clipping and bucketing (issue 71 item 1), against hand-computed cases and an independent loop."""

from __future__ import annotations

import numpy as np
import pytest

from app.config import ConfigError, parse_settings
from strategies.aggregation.robust import bucket_means, centered_clip
from strategies.aggregation.rules import aggregate


def model(*values, dtype=np.float64):
    return [np.array(values, dtype=dtype)]


CENTER = model(0.0, 0.0)
# distances from the center: 5, 1 and 1
MODELS = [model(3.0, 4.0), model(0.0, 1.0), model(0.0, -1.0)]


def test_each_step_is_clipped_to_the_radius_and_the_mean_step_taken():
    # radius 2: (3, 4) -> (3, 4) * 2 / 5 = (1.2, 1.6); the others are within it; mean (1.2, 1.6) / 3
    np.testing.assert_allclose(centered_clip(MODELS, CENTER, radius=2.0)[0], [0.4, 1.6 / 3], rtol=1e-12)
    # radius 0: the median distance, 1: (3, 4) -> (0.6, 0.8)
    np.testing.assert_allclose(centered_clip(MODELS, CENTER, radius=0.0)[0], [0.2, 0.8 / 3], rtol=1e-12)
    # a radius no step reaches is the plain mean
    np.testing.assert_allclose(centered_clip(MODELS, CENTER, radius=10.0)[0], [1.0, 4.0 / 3], rtol=1e-12)


def test_more_iterations_follow_the_papers_recursion():
    def by_hand(points, v, tau, iterations):  # v <- v + (1/n) sum (x - v) min(1, tau / |x - v|), written out
        for _ in range(iterations):
            total = np.zeros_like(v)
            for x in points:
                step = x - v
                total += step * min(1.0, tau / float(np.linalg.norm(step)))
            v = v + total / len(points)
        return v

    rng = np.random.default_rng(3)
    points = [rng.normal(size=5) * (10 if i == 0 else 1) for i in range(7)]
    got = centered_clip([[p] for p in points], [np.zeros(5)], radius=1.5, iterations=3)[0]
    np.testing.assert_allclose(got, by_hand(points, np.zeros(5), 1.5, 3), rtol=1e-12)


def test_an_attacker_moves_the_result_at_most_the_radius_over_n():
    honest = [model(1.0, 1.0) for _ in range(9)]
    for far in (1e3, 1e6, np.inf, np.nan):
        result = centered_clip([*honest, model(far, -far)], model(1.0, 1.0), radius=0.5)[0]
        assert np.linalg.norm(result - np.array([1.0, 1.0])) <= 0.5 / 10 + 1e-12, far
        assert np.all(np.isfinite(result))


def test_layers_keep_their_dtypes_and_counters_take_the_maximum():
    models = [[np.array([2.0, 0.0], np.float32), np.array(3, np.int64)],
              [np.array([0.0, 2.0], np.float32), np.array(7, np.int64)]]  # fmt: skip
    result = centered_clip(models, [np.zeros(2, np.float32), np.array(0, np.int64)], radius=1.0)
    assert result[0].dtype == np.float32 and int(result[1]) == 7
    np.testing.assert_allclose(result[0], [0.5, 0.5], rtol=1e-6)  # each step of length 2 clipped to 1


def test_buckets_are_random_groups_averaged_by_weight():
    models = [model(float(v)) for v in range(7)]
    weights = [1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0]
    means, sums = bucket_means(models, weights, size=3, rng=np.random.default_rng(5))
    order = np.random.default_rng(5).permutation(7)  # the same draw, made here
    groups = [order[0:3], order[3:6], order[6:7]]
    expected = [sum(weights[i] * i for i in g) / sum(weights[i] for i in g) for g in groups]
    np.testing.assert_allclose([m[0][0] for m in means], expected, rtol=1e-12)
    assert sums == [sum(weights[i] for i in g) for g in groups]


def test_a_robust_rule_combines_the_bucket_means():
    models = [model(float(v)) for v in (0.0, 1.0, 2.0, 100.0)]
    rng_seed = 9
    order = np.random.default_rng(rng_seed).permutation(4)
    pairs = sorted(np.mean([[0.0, 1.0, 2.0, 100.0][i] for i in order[k : k + 2]]) for k in (0, 2))
    got = aggregate([[a.copy() for a in m] for m in models], [1.0] * 4, rule="median", bucket_size=2,
                    rng=np.random.default_rng(rng_seed))  # fmt: skip
    np.testing.assert_allclose(got[0], [np.mean(pairs)], rtol=1e-12)  # the median of two bucket means
    plain = aggregate([[a.copy() for a in m] for m in models], [1.0] * 4, rule="median")
    np.testing.assert_allclose(plain[0], [1.5])


def test_centered_clip_through_aggregate_starts_at_the_center_given():
    got = aggregate([[a.copy() for a in m] for m in MODELS], [1.0] * 3, rule="centered-clip", center=CENTER,
                    clip_radius=2.0)  # fmt: skip
    np.testing.assert_allclose(got[0], [0.4, 1.6 / 3], rtol=1e-12)


@pytest.mark.parametrize(("keys", "message"), [
    ({"bucket-size": 2}, "run config key 'bucket-size': 2 buckets the replies for a robust rule; aggregation = "
                         "'uniform' averages them all anyway"),
    ({"clip-radius": 1.0, "aggregation": "median"}, "run config key 'clip-radius': it sets centered-clip's radius, "
                                                    "and aggregation is 'median'"),
    ({"aggregation": "centered-clip", "strategy": "fedproto"}, "run config key 'aggregation': 'centered-clip' is a "
                                                               "rule for methods whose server averages"),
])  # fmt: skip
def test_a_key_without_its_rule_is_refused_naming_it(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_settings(keys)


def test_the_new_keys_are_taken_with_their_rules():
    settings = parse_settings({"aggregation": "centered-clip", "clip-radius": 0.5, "bucket-size": 2})
    assert (settings.run.aggregation, settings.run.clip_radius, settings.run.bucket_size) == ("centered-clip", 0.5, 2)
