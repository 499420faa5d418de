"""FATHOM: the hyperparameter update against hand computations, the client's plan and phi."""

import math

import numpy as np
import pytest
import torch
from conftest import FakeFleet, FakeNode, settings
from helpers import aggregate_fit, configure_fit, received
from torch.nn import functional as F

from app.config import ConfigError
from clients.batches import batch_indices
from clients.fathom import FathomClient, client_plan
from clients.models import build_model
from clients.runtime import round_generator
from datasets import ClientData
from strategies.contracts.fathom import CONTRACT, FathomSettings
from strategies.methods.fathom import FathomServer
from strategies.screening.replies import metrics_problem
from strategies.tuning.fathom_math import FathomState, RoundAggregate, cosine, fathom_update

# FATHOM's published update: safe ascent, the guard stamen puts over it by default, has its own tests
# (tests/test_fathom_safe_ascent.py); these give no loss, which safe ascent reads as no progress
SETTINGS = FathomSettings(safe_ascent=0.0)


def state(**kw):
    return FathomState(**{"lr": 0.1, "epochs": 1.0, "batch_size": 32.0, **kw})


def aggregate(update, phis=(0.0,), examples=(1.0,)):
    return RoundAggregate(update=np.asarray(update, float), phis=np.asarray(phis, float),
                          examples=np.asarray(examples, float))  # fmt: skip


def test_first_round_leaves_lr_unchanged_and_starts_the_smoothed_update():
    new, hg = fathom_update(state(), aggregate([1.0, 2.0], phis=[0.0]), SETTINGS)
    assert hg.global_term == 0.0 and new.lr == 0.1
    np.testing.assert_allclose(new.smoothed_update, 0.5 * np.array([1.0, 2.0]))
    assert new.round == 1


def test_aligned_consecutive_updates_raise_lr_and_epochs():
    s = state(smoothed_update=np.array([1.0, 0.0]))
    new, hg = fathom_update(s, aggregate([2.0, 0.0], phis=[0.0]), SETTINGS)
    assert hg.global_term == pytest.approx(-1.0)
    assert new.lr > s.lr and new.epochs > s.epochs and new.batch_size == s.batch_size
    opposed, hg = fathom_update(s, aggregate([-2.0, 0.0], phis=[0.0]), SETTINGS)
    assert hg.global_term == pytest.approx(1.0) and opposed.lr < s.lr and opposed.epochs < s.epochs


def test_aligned_local_gradients_lower_batch_size_and_raise_epochs():
    s = state(smoothed_update=np.array([1.0, 0.0]))
    orthogonal = [0.0, 1.0]  # H = 0: only the local term moves things
    aligned, hg = fathom_update(s, aggregate(orthogonal, phis=[0.9, 0.7], examples=[1, 3]), SETTINGS)
    assert hg.local_term == pytest.approx(-(0.9 * 1 + 0.7 * 3) / 4)
    assert aligned.batch_size < s.batch_size and aligned.epochs > s.epochs and aligned.lr == s.lr
    opposed, _ = fathom_update(s, aggregate(orthogonal, phis=[-0.5]), SETTINGS)
    assert opposed.batch_size > s.batch_size and opposed.epochs < s.epochs


def test_update_matches_a_hand_computation():
    previous = np.array([1.0, 1.0, 0.0])
    update = np.array([1.0, 0.0, 1.0])
    settings = FathomSettings(gamma_lr=0.2, gamma_epochs=0.3, gamma_batch=0.4, smoothing=0.25, safe_ascent=0.0)
    s = state(lr=0.05, epochs=2.0, batch_size=64.0, smoothed_update=previous)
    new, hg = fathom_update(s, aggregate(update, phis=[0.2, -0.4, 1.0], examples=[10, 30, 60]), settings)
    h = -(1.0 / (math.sqrt(2) * math.sqrt(2)))  # cos = 1 / 2
    g = -(0.2 * 0.1 - 0.4 * 0.3 + 1.0 * 0.6)
    assert hg.global_term == pytest.approx(h, abs=1e-15) and hg.local_term == pytest.approx(g, abs=1e-15)
    assert new.lr == pytest.approx(0.05 * math.exp(-0.2 * h), rel=1e-15)
    assert new.epochs == pytest.approx(2.0 * math.exp(-0.3 * (h + g)), rel=1e-15)
    assert new.batch_size == pytest.approx(64.0 * math.exp(0.4 * g), rel=1e-15)
    np.testing.assert_allclose(new.smoothed_update, 0.25 * previous + 0.75 * update, rtol=1e-15)


def test_eq12_reading_scales_the_local_term_by_lr():
    s = state(lr=0.2)
    _, hg = fathom_update(s, aggregate([1.0], phis=[0.5]), FathomSettings(local_term="eq12"))
    assert hg.local_term == pytest.approx(-0.2 * 0.5)


def test_bounds_are_respected():
    settings = FathomSettings(gamma_lr=50.0, gamma_epochs=50.0, gamma_batch=50.0, lr_min=0.01, lr_max=0.2,
                              epochs_min=0.5, epochs_max=3.0, batch_min=4.0, batch_max=128.0,
                              safe_ascent=0.0)  # fmt: skip
    s = state(lr=0.1, epochs=1.0, batch_size=32.0, smoothed_update=np.array([1.0]))
    up, _ = fathom_update(s, aggregate([1.0], phis=[1.0]), settings)  # H = -1, G = -1
    assert (up.lr, up.epochs, up.batch_size) == (0.2, 3.0, 4.0)
    down, _ = fathom_update(s, aggregate([-1.0], phis=[-1.0]), settings)
    assert (down.lr, down.epochs, down.batch_size) == (0.01, 0.5, 128.0)


def test_cosine_is_zero_for_a_zero_vector():
    assert cosine(np.zeros(3), np.ones(3)) == 0.0
    assert cosine(np.array([1.0, 0.0]), np.array([0.0, 2.0])) == 0.0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gamma_lr": -1.0}, r"'fathom-gamma-lr': -1.0 is outside \[0, inf\)"),
        ({"smoothing": 1.0}, r"'fathom-smoothing': 1.0 is outside \[0, 1\)"),
        ({"batch_min": 10.0, "batch_max": 2.0}, "'fathom-batch-min': 10.0 is above 'fathom-batch-max' = 2.0"),
        ({"local_term": "other"}, "'fathom-local-term': 'other' is not allowed"),
    ],
)
def test_bad_settings(values, message):
    with pytest.raises(ConfigError, match=message):
        FathomSettings(**values)


@pytest.mark.parametrize(
    ("examples", "epochs", "batch", "expected"),
    [
        (3, 1.0, 32.0, (3, 1)),  # tiny client: the batch is capped at its data, one pass is one step
        (100, 1.0, 1e6, (100, 1)),  # huge batch
        (100, 0.3, 10.0, (10, 3)),  # fractional epochs: ceil(100 * 0.3 / 10)
        (100, 0.001, 10.0, (10, 1)),  # at least one step
        (100, 2.0, 0.2, (1, 200)),  # batch below one rounds up to one
        (100, 1.0, 32.6, (33, 4)),  # B is rounded, then K = ceil(100 / 33)
    ],
)
def test_client_plan_at_its_edges(examples, epochs, batch, expected):
    assert client_plan(examples, epochs, batch) == expected


def test_client_phi_equals_a_direct_computation_from_the_gradients():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 3)).astype(np.float32)
    y = rng.integers(0, 3, 23).astype(np.int64)
    data = ClientData(x, y, x[:5], y[:5], num_classes=3)
    run = settings(strategy="fathom", lr=0.3, local_epochs=1.5, batch_size=8, seed=4, device="cpu", model="logreg")
    start = build_model("logreg", input_shape=(3,), num_classes=3, seed=2)
    weights = [v.detach().numpy().copy() for v in start.state_dict().values()]
    client = FathomClient(model=build_model("logreg", input_shape=(3,), num_classes=3), data=data, settings=run,
                          partition_id=7)  # fmt: skip
    config = {"server-round": 5, "lr": 0.3, "local-epochs": 1.5, "batch-size": 7.6}
    new, n, metrics = client.fit(weights, config)
    batch, steps = client_plan(23, 1.5, 7.6)
    assert (metrics["used-batch-size"], metrics["local-steps"], metrics["sample-grads"]) == (8, 5, 40)
    assert (batch, steps) == (8, 5) and metrics["lr"] == 0.3 and n == 23

    # replay: the same batches, plain SGD, every gradient recorded
    model = build_model("logreg", input_shape=(3,), num_classes=3, seed=2)
    grads = []
    for idx in batch_indices(23, batch, steps, round_generator(4, 7, 5, "fit")):
        loss = F.cross_entropy(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]))
        g = torch.autograd.grad(loss, list(model.parameters()))
        grads.append(np.concatenate([t.numpy().ravel() for t in g]).astype(np.float64))
        with torch.no_grad():
            for p, gp in zip(model.parameters(), g, strict=True):
                p -= 0.3 * gp
    running = np.cumsum(grads, axis=0)
    phi = min(float(g @ s / (np.linalg.norm(g) * np.linalg.norm(s))) for g, s in zip(grads, running, strict=True))
    assert metrics["phi"] == pytest.approx(phi, abs=1e-6)
    assert -1.0 <= phi < 1.0  # several steps: not trivially aligned
    for got, want in zip(new, [p.detach().numpy() for p in model.parameters()], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_one_step_has_phi_one():
    data = ClientData(np.ones((4, 2), np.float32), np.array([0, 1, 0, 1]), np.ones((1, 2), np.float32),
                      np.array([0]), num_classes=2)  # fmt: skip
    run = settings(strategy="fathom", local_epochs=1.0, device="cpu", model="logreg")
    client = FathomClient(model=build_model("logreg", input_shape=(2,), num_classes=2), data=data, settings=run,
                          partition_id=0)  # fmt: skip
    _, _, metrics = client.fit(client.get_parameters({}), {"lr": 0.1, "local-epochs": 1.0, "batch-size": 4.0})
    assert metrics["local-steps"] == 1 and metrics["phi"] == pytest.approx(1.0)


@pytest.mark.parametrize("phi", [1.5, -1.2, float("nan"), float("inf")])
def test_replies_with_a_bad_phi_are_malformed(phi):
    assert metrics_problem({"phi": phi}, {m.name: m for m in CONTRACT.metrics}) is not None


def test_strategy_broadcasts_state_rejects_missing_phi_and_updates():
    zeros = [np.zeros(3, np.float32)]
    run = settings(strategy="fathom", lr=0.1, local_epochs=1.0, batch_size=16, num_server_rounds=3, fraction_fit=1.0,
                   min_fit_clients=1, min_available_clients=1, preflight=False, aggregation="examples",
                   fathom_safe_ascent=0.0)  # fmt: skip
    strategy = FathomServer(settings=run, initial_model=zeros)
    nodes = [FakeNode(str(i)) for i in range(3)]
    fleet = FakeFleet(*nodes)
    instructions = configure_fit(strategy, 1, fleet)
    partition = instructions[0].config["partition-id"]  # each node is told its partition
    assert instructions[0].config == {"lr": 0.1, "local-epochs": 1.0, "batch-size": 16.0, "server-round": 1,
                                      "partition-id": partition, "payload": "model:1"}  # fmt: skip
    replies = [
        received(nodes[0], [np.ones(3, np.float32)], 10, {"phi": 0.5, "lr": 0.1}),
        received(nodes[1], [np.ones(3, np.float32)], 10, {"phi": 0.5, "lr": 0.1}),
        received(nodes[2], [np.full(3, 9.0, np.float32)], 10, {"lr": 0.1}),
    ]
    _, metrics = aggregate_fit(strategy, 1, replies)
    assert strategy.record["clients-rejected"] == 1  # no phi: rejected, its 9s never reach the model
    assert metrics["G"] == pytest.approx(-0.5) and metrics["H"] == 0.0
    assert strategy.tuner.state.batch_size == pytest.approx(16.0 * math.exp(0.1 * -0.5))
    assert strategy.record["hp-batch-size"] == 16.0  # the record keeps the values in force that round
    assert strategy.fit_config(2)["batch-size"] == pytest.approx(strategy.tuner.state.batch_size)
    np.testing.assert_allclose(strategy.global_model[0], 1.0)
