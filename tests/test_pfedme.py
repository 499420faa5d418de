"""pFedMe: two local rounds by hand on least squares, the server's beta, and what evaluation tests."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import regression_data, settings
from helpers import aggregate_fit, answers, configure_evaluate, configure_fit, fleet_of, replied_arrays

from app.local.inprocess import InProcessRun
from clients.models import build_model
from clients.pfedme import PERSONAL, PFedMeClient


def client(**overrides):
    data, _, _ = regression_data()
    config = {"strategy": "pfedme", "dataset": "least-squares", "partitioner": "natural", "model": "linear",
              "lr": 0.05, "batch_size": 16, "device": "cpu", **overrides}  # fmt: skip
    return PFedMeClient(model=build_model("linear", input_shape=(3,), num_classes=0), data=data,
                        settings=settings(**config), partition_id=0)  # fmt: skip


def test_two_local_rounds_of_two_inner_steps_match_a_hand_computation():
    lam, lr, personal_lr, rounds, inner = 15.0, 0.05, 0.02, 2, 2
    start = np.array([0.2, 0.4, -0.3])
    worker = client(local_steps=rounds, pfedme_lambda=lam, pfedme_personal_lr=personal_lr, pfedme_inner_steps=inner)
    reply, _, metrics = worker.fit([start.astype(np.float32).reshape(1, 3)], {"server-round": 1})
    _, x, y = regression_data()
    w = theta = start
    for _ in range(rounds):  # full batches: D is the whole training set every time
        for _ in range(inner):  # theta <- theta - eta_p (grad f(theta) + lambda (theta - w_k))
            theta = theta - personal_lr * (x.T @ (x @ theta - y) / len(y) + lam * (theta - w))
        w = w - lr * lam * (w - theta)  # w_k <- w_k - eta lambda (w_k - theta)
    np.testing.assert_allclose(reply[0].ravel(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(worker.state.arrays(PERSONAL)[0].ravel(), theta, rtol=1e-5, atol=1e-6)
    assert metrics["local-steps"] == rounds and metrics["grad-evals"] == rounds * inner
    assert metrics["pfedme-personal-distance"] == pytest.approx(np.linalg.norm(theta - w), rel=1e-4)


def test_evaluation_tests_the_personal_model_beside_the_one_received():
    worker = client(local_steps=3)
    start = [np.array([[0.2, 0.4, -0.3]], np.float32)]
    loss, _, metrics = worker.evaluate(start, {"server-round": 1, "adapt-steps": 0})
    assert loss == metrics["global-loss"]  # never sampled, no theta yet: the model received, for both
    reply, _, _ = worker.fit(start, {"server-round": 1})
    loss, _, metrics = worker.evaluate(reply, {"server-round": 1})
    _, x, y = regression_data()
    theta, w = worker.state.arrays(PERSONAL)[0].ravel(), reply[0].ravel()
    test_x, test_y = x[:4], y[:4]
    assert loss == pytest.approx(np.mean(0.5 * (test_x @ theta - test_y) ** 2), rel=1e-5)
    assert metrics["global-loss"] == pytest.approx(np.mean(0.5 * (test_x @ w - test_y) ** 2), rel=1e-5)


def test_the_server_steps_beta_towards_the_average():
    run = InProcessRun(run_config={"strategy": "pfedme", "pfedme-beta": 2.0, "fraction-fit": 0.5,
                                   "min-available-clients": 4, "local-steps": 2}, num_clients=4)  # fmt: skip
    strategy, fleet = run.strategy, fleet_of(run)
    before = [a.copy() for a in strategy.global_model]
    results, failures = answers(fleet, configure_fit(strategy, 1, fleet))
    assert failures == []
    replies = [replied_arrays(res) for res in results]
    aggregate_fit(strategy, 1, results)
    for i, got in enumerate(strategy.global_model):  # w + beta (mean(w_k) - w), beta = 2: past the average
        mean = np.mean([r[i].astype(np.float64) for r in replies], axis=0)
        np.testing.assert_allclose(got, before[i] + 2.0 * (mean - before[i]), rtol=1e-5, atol=1e-7)
    assert all(ins.config["adapt-steps"] == 0 for ins in configure_evaluate(strategy, 10, fleet))
