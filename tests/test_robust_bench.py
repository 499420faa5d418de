"""B10's attacks (bench/robust.py) do what they say, on known updates; the wrapper rewrites what the server receives."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench.robust import (
    ATTACKS,
    arm,
    attacker_partitions,
    context,
    flipped_labels,
    gaussian_noise,
    huge_float64,
    int64_reply,
    reference,
    report,
    scaled,
    sign_flip,
)

SENT = [np.array([1.0, 2.0], dtype=np.float32), np.array([3], dtype=np.int64)]
HONEST = [np.array([1.5, 1.0], dtype=np.float32), np.array([13], dtype=np.int64)]  # update (0.5, -1); 10 steps


def test_sign_flip_reverses_the_update_five_times_over():
    flipped = sign_flip(SENT, HONEST)
    np.testing.assert_array_equal(flipped[0], [1.0 - 5 * 0.5, 2.0 + 5 * 1.0])
    assert flipped[0].dtype == np.float32
    np.testing.assert_array_equal(flipped[1], [13])  # a step counter is no update: sent as trained


def test_scaling_moves_a_hundred_times_as_far():
    np.testing.assert_array_equal(scaled(SENT, HONEST)[0], [1.0 + 50.0, 2.0 - 100.0])


def test_huge_float64_is_finite_float64_everywhere():
    reply = huge_float64(SENT, HONEST)
    assert reply[0].dtype == np.float64 and reply[0].shape == (2,)
    assert np.all(reply[0] == 1e300) and np.all(np.isfinite(reply[0]))
    np.testing.assert_array_equal(reply[1], HONEST[1])


def test_int64_reply_truncates_and_plants_two_to_the_62():
    honest = [np.array([[2.7, -1.5]], dtype=np.float32), np.array([0.9, 4.2], dtype=np.float32)]
    reply = int64_reply(SENT, honest)
    assert all(a.dtype == np.int64 for a in reply)
    np.testing.assert_array_equal(reply[0], [[2**62, -1]])
    np.testing.assert_array_equal(reply[1], [0, 4])
    assert honest[0][0, 0] == np.float32(2.7)  # the honest arrays are left as they were


def test_gaussian_noise_has_ten_times_the_update_rms():
    sent = [np.zeros(2, dtype=np.float32), np.zeros(1, dtype=np.float32)]
    honest = [np.array([3.0, 4.0], dtype=np.float32), np.array([0.0], dtype=np.float32)]
    sigma = 10 * np.sqrt(25 / 3)  # RMS over all three coordinates
    reply = gaussian_noise(sent, honest, rng=np.random.default_rng(5))
    expected = np.random.default_rng(5)
    np.testing.assert_allclose(reply[0], expected.normal(0, sigma, size=2), rtol=1e-6)
    np.testing.assert_allclose(reply[1], expected.normal(0, sigma, size=1), rtol=1e-6)
    many = gaussian_noise([np.zeros(20_000)], [np.full(20_000, 0.5)], rng=np.random.default_rng(1))[0]
    assert abs(many.std() - 5.0) < 0.1 and abs(many.mean()) < 0.1  # centred on sent, not on the trained model


def test_label_flip_maps_y_to_c_minus_1_minus_y():
    np.testing.assert_array_equal(flipped_labels(np.array([0, 1, 9, 4]), num_classes=10), [9, 8, 0, 5])


def test_attackers_are_nested_distinct_and_drawn_from_the_seed():
    for seed in range(5):
        one, two, three = (attacker_partitions(seed, k) for k in (1, 2, 3))
        assert set(one) <= set(two) <= set(three) and len(set(three)) == 3
        assert all(0 <= p < 10 for p in three)
        assert attacker_partitions(seed, 3) == three
    assert len({tuple(attacker_partitions(seed, 2)) for seed in range(5)}) > 1


class FakeClient:
    """Replies with ``sent + 1`` (as a stamen client's ``fit``) and remembers the labels it trained on."""

    def __init__(self, partition: int) -> None:
        self.partition_id = partition
        self.data = SimpleNamespace(num_classes=10)
        self.train_y = torch.tensor([0, 3, 9])
        self.trained_on = None

    def fit(self, parameters, config):
        self.trained_on = self.train_y.clone()
        return [a + 1 for a in parameters], 3, {"payload": "model:1"}


def fake_run(partitions: int):
    clients = [FakeClient(p) for p in range(partitions)]
    return SimpleNamespace(clients=clients), clients


def fit_on(client):
    """The client's reply to a fit of ``[2, 4]`` in round 1: its arrays."""
    return client.fit([np.array([2.0, 4.0], dtype=np.float32)], {"server-round": 1, "payload": "model:1"})[0]


def test_arm_rewrites_only_the_attackers_encoded_replies():
    run, clients = fake_run(3)
    arm(run, [1], ATTACKS["sign-flip"], seed=0)
    honest, attacked = fit_on(clients[0]), fit_on(clients[1])
    np.testing.assert_array_equal(honest[0], [3.0, 5.0])
    np.testing.assert_array_equal(attacked[0], [2.0 - 5, 4.0 - 5])


def test_label_flipping_attacker_trains_on_flipped_labels_and_keeps_its_own():
    run, clients = fake_run(2)
    arm(run, [0], ATTACKS["label-flip"], seed=0)
    reply = fit_on(clients[0])
    client = clients[0]
    assert client.trained_on.tolist() == [9, 6, 0]
    assert client.train_y.tolist() == [0, 3, 9]  # restored for its evaluation and the next round
    np.testing.assert_array_equal(reply[0], [3.0, 5.0])  # the model as trained, unaltered


def cell(aggregation, attack, attackers, seed, accuracy, **flags):
    return {"dataset": "mnist-dirichlet", "seed": seed, "aggregation": aggregation, "attack": attack,
            "attackers": attackers, "global-accuracy": accuracy, "honest-personalised-accuracy": accuracy,
            "non-finite": flags.get("non_finite", False), "at-chance": flags.get("at_chance", False),
            "error": None, "rejected": flags.get("rejected", 0), "git-commit": "abc", "rounds": 2}  # fmt: skip


def test_report_gives_mean_sd_seeds_the_gap_to_clean_and_flags():
    cells = [cell("mean", "clean", 0, 0, 0.80), cell("mean", "clean", 0, 1, 0.90),
             cell("mean", "sign-flip", 1, 0, 0.70), cell("mean", "sign-flip", 1, 1, 0.10, at_chance=True),
             cell("median", "clean", 0, 0, 0.85), cell("median", "sign-flip", 1, 0, 0.84, rejected=2)]  # fmt: skip
    text = report({"cells": cells})
    # mean: 40.0 ± sd(70, 10) = 42.4 over 2 seeds; gaps -10 and -80: -45.0
    assert "| sign flip x5 | 1 | 40.0 ± 42.4 (2); -45.0 **[1 at chance]** | 84.0 ± 0.0 (1); -1.0 [rej 2] |" in text
    assert "| none (clean) | 0 | 85.0 ± 7.1 (2) | 85.0 ± 0.0 (1) |" in text
    assert "the default mean never non-finite or at chance: no: sign-flip x1" in text
    assert "with up to 2 attackers: yes" in text  # median's -1.0 is within 2 points


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_attack_keeps_the_shapes(attack):
    transform = ATTACKS[attack].transform
    if transform is None:
        return
    options = {"rng": np.random.default_rng(0)} if ATTACKS[attack].noisy else {}
    reply = transform(SENT, HONEST, **options)
    assert [a.shape for a in reply] == [a.shape for a in HONEST]


def test_a_client_mean_is_compared_with_the_same_clients_of_the_clean_run():
    clean = {"honest-personalised-accuracy": 0.6, "global-accuracy": 0.5,
             "per-partition": {"0": {"accuracy": 0.9}, "1": {"accuracy": 0.3}, "2": {"accuracy": 0.6}}}  # fmt: skip
    attacked = {"attacker-partitions": [1]}
    assert reference(clean, attacked, "honest-personalised-accuracy") == pytest.approx(0.75)  # (0.9 + 0.6) / 2
    assert reference(clean, attacked, "global-accuracy") == 0.5  # the global model is one model: as it is
    assert reference(None, attacked, "global-accuracy") is None


def test_context_names_the_clean_cost_and_the_attacks_screened_out_whole():
    cells = [cell("mean", "clean", 0, 0, 0.80), cell("median", "clean", 0, 0, 0.55),
             cell("mean", "scaling", 2, 0, 0.70, rejected=4), cell("mean", "sign-flip", 2, 0, 0.70, rejected=3)]
    text = "\n".join(context(cells))
    assert "median -25.0" in text
    # 2 rounds x 2 attackers = 4 rejections: scaling was screened out whole, sign flip (3 of 4) was not
    assert "every reply of scaling was rejected" in text
