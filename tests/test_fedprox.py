"""FedProx: one client's local steps against a hand computation, and mu = 0 against FedAvg."""

import numpy as np
import pytest
from conftest import regression_data, settings

from clients.fedavg import FedAvgClient
from clients.fedprox import FedProxClient
from clients.models import build_model
from strategies.base import FederatedStrategy
from strategies.contracts.fedprox import CONTRACT as FEDPROX

N, D = 16, 3


def client(cls, **overrides):
    data, _, _ = regression_data()
    config = {"strategy": "fedprox" if cls is FedProxClient else "fedavg", "dataset": "least-squares",
              "partitioner": "natural", "model": "linear", "lr": 0.1, "batch_size": N, "device": "cpu", **overrides}
    return cls(model=build_model("linear", input_shape=(D,), num_classes=0), data=data, settings=settings(**config),
               partition_id=0)  # fmt: skip


def test_two_full_batch_steps_match_the_proximal_gradient_by_hand():
    mu, lr = 0.5, 0.1
    start = np.array([[0.2, 0.4, -0.3]], dtype=np.float32)
    new, _, metrics = client(FedProxClient, fedprox_mu=mu, local_steps=2).fit([start], {"server-round": 1})
    _, x, y = regression_data()
    w_global = w = start.astype(np.float64).ravel()
    for _ in range(2):  # gradient of mean(0.5 (x w - y)^2) + mu/2 ||w - w_global||^2
        w = w - lr * (x.T @ (x @ w - y) / N + mu * (w - w_global))
    np.testing.assert_allclose(new[0].ravel(), w, rtol=1e-5, atol=1e-6)
    # the first step starts at w_global, where the proximal term is zero: only the second one shows it
    fedavg_w = start.astype(np.float64).ravel()
    for _ in range(2):
        fedavg_w = fedavg_w - lr * x.T @ (x @ fedavg_w - y) / N
    assert np.abs(new[0].ravel() - fedavg_w).max() > 1e-3
    assert metrics["local-steps"] == 2 and metrics["grad-evals"] == 2


def test_mu_zero_is_fedavg_bit_for_bit():
    start = [np.array([[0.2, 0.4, -0.3]], dtype=np.float32)]
    config = {"server-round": 3, "local-steps": 7, "batch-size": 5}
    prox, _, prox_metrics = client(FedProxClient, fedprox_mu=0.0).fit(start, config)
    plain, _, plain_metrics = client(FedAvgClient).fit(start, config)
    np.testing.assert_array_equal(prox[0], plain[0])
    assert prox_metrics == plain_metrics


def test_a_larger_mu_keeps_the_local_model_nearer_the_global_one():
    start = [np.zeros((1, D), dtype=np.float32)]
    distances = []
    for mu in (0.0, 1.0, 10.0):
        new, _, _ = client(FedProxClient, fedprox_mu=mu, local_steps=30, lr=0.05).fit(start, {"server-round": 1})
        distances.append(float(np.linalg.norm(new[0])))
    assert distances[0] > distances[1] > distances[2] > 0


def test_the_strategy_broadcasts_mu_with_fedavgs_keys():
    run = settings(strategy="fedprox", fedprox_mu=0.3, lr=0.2)
    strategy = FederatedStrategy(contract=FEDPROX, settings=run, initial_model=[np.zeros(3, np.float32)])
    assert strategy.fit_config(2) == {"lr": 0.2, "local-steps": 10, "local-epochs": 0.0, "batch-size": 10,
                                      "fedprox-mu": 0.3, "server-round": 2}  # fmt: skip
    with pytest.raises(ValueError, match=r"'fedprox-mu': -0.1 is outside \[0, inf\)"):
        settings(strategy="fedprox", fedprox_mu=-0.1)
