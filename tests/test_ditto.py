"""Ditto: the two local updates against a hand computation, evaluation of the personal model, and a run."""

import numpy as np
import pytest
from conftest import settings

from app.local.inprocess import InProcessRun
from clients.ditto import PERSONAL, DittoClient
from clients.models import build_model
from datasets import ClientData

N, D = 16, 3


def regression_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=N)).astype(np.float32)
    return ClientData(x, y, x, y, num_classes=0), x.astype(np.float64), y.astype(np.float64)


def client(**overrides):
    data, _, _ = regression_data()
    config = {"strategy": "ditto", "dataset": "least-squares", "partitioner": "natural", "model": "linear",
              "lr": 0.1, "batch_size": N, "local_steps": 1, "ditto_personal_steps": 1, "ditto_personal_lr": 0.2,
              "device": "cpu", **overrides}  # fmt: skip
    return DittoClient(model=build_model("linear", input_shape=(D,), num_classes=0), data=data,
                       settings=settings(**config), partition_id=0)  # fmt: skip


def grad(x, y, w):
    return x.T @ (x @ w - y) / len(y)


def test_one_round_is_fedavgs_step_for_the_server_and_a_regularised_step_for_the_personal_model():
    lam = 0.7
    ditto = client(ditto_lambda=lam)
    w_global = np.array([0.2, 0.4, -0.3])
    v = np.array([1.0, -1.0, 0.0])
    ditto.state.set_arrays(PERSONAL, [v.astype(np.float32).reshape(1, D)])
    returned, _, metrics = ditto.fit([w_global.astype(np.float32).reshape(1, D)], {"server-round": 1})
    _, x, y = regression_data()
    np.testing.assert_allclose(returned[0].ravel(), w_global - 0.1 * grad(x, y, w_global), rtol=1e-5, atol=1e-6)
    expected_v = v - 0.2 * (grad(x, y, v) + lam * (v - w_global))
    np.testing.assert_allclose(ditto.state.arrays(PERSONAL)[0].ravel(), expected_v, rtol=1e-5, atol=1e-6)
    assert metrics["ditto-personal-rounds"] == 1 and metrics["local-steps"] == 2 and metrics["grad-evals"] == 2
    assert metrics["ditto-personal-loss"] == pytest.approx(0.5 * np.mean((x @ v - y) ** 2), rel=1e-5)


def test_the_first_personal_model_is_the_first_global_model_received():
    ditto = client(ditto_lambda=5.0)
    w_global = np.array([0.2, 0.4, -0.3])
    ditto.fit([w_global.astype(np.float32).reshape(1, D)], {"server-round": 1})
    _, x, y = regression_data()  # v starts at w^t, where the regulariser is zero
    expected_v = w_global - 0.2 * grad(x, y, w_global)
    np.testing.assert_allclose(ditto.state.arrays(PERSONAL)[0].ravel(), expected_v, rtol=1e-5, atol=1e-6)


def test_lambda_zero_makes_the_personal_model_purely_local():
    personal = []
    for w_global in (np.zeros(D), np.array([5.0, 5.0, 5.0])):
        ditto = client(ditto_lambda=0.0, ditto_personal_steps=3)
        ditto.state.set_arrays(PERSONAL, [np.ones((1, D), np.float32)])
        ditto.fit([w_global.astype(np.float32).reshape(1, D)], {"server-round": 2})
        personal.append(ditto.state.arrays(PERSONAL)[0])
    np.testing.assert_array_equal(personal[0], personal[1])


def test_personal_epochs_are_passes_of_regularised_full_batch_steps():
    lam, w_global, v = 0.5, np.array([0.2, 0.4, -0.3]), np.array([1.0, -1.0, 0.0])
    ditto = client(ditto_lambda=lam, ditto_personal_epochs=2.0, ditto_personal_steps=7)  # epochs win over steps
    ditto.state.set_arrays(PERSONAL, [v.astype(np.float32).reshape(1, D)])
    _, _, metrics = ditto.fit([w_global.astype(np.float32).reshape(1, D)], {"server-round": 1})
    _, x, y = regression_data()
    for _ in range(2):  # a batch of N is the whole set: one pass is one full-batch step
        v = v - 0.2 * (grad(x, y, v) + lam * (v - w_global))
    np.testing.assert_allclose(ditto.state.arrays(PERSONAL)[0].ravel(), v, rtol=1e-5, atol=1e-6)
    assert metrics["local-steps"] == 1 + 2
    halves = client(ditto_personal_epochs=1.5, batch_size=N // 4)  # a pass is 4 batches: 1.5 passes are 6 steps
    _, _, metrics = halves.fit([w_global.astype(np.float32).reshape(1, D)], {"server-round": 1})
    assert metrics["local-steps"] == 1 + 6


def test_evaluation_tests_the_personal_model_and_reports_the_global_one_beside_it():
    ditto = client()
    _, x, y = regression_data()
    solution = np.linalg.lstsq(x, y, rcond=None)[0]
    w_global = [np.zeros((1, D), np.float32)]
    never_sampled, _, metrics = ditto.evaluate(w_global, {"server-round": 1})
    assert never_sampled == pytest.approx(metrics["global-loss"])  # no personal model yet: w^t for both
    ditto.state.set_arrays(PERSONAL, [solution.astype(np.float32).reshape(1, D)])
    loss, n, metrics = ditto.evaluate(w_global, {"server-round": 1})
    assert n == N and loss == pytest.approx(0.5 * np.mean((x @ solution - y) ** 2), rel=1e-4)
    assert metrics["global-loss"] == pytest.approx(0.5 * np.mean(y**2), rel=1e-5) and loss < metrics["global-loss"]


def test_personal_models_persist_across_rounds_in_each_nodes_context():
    # each node's Context lives the whole run, as a SuperNode's does (that Flower keeps Context.state from round to
    # round in a simulation is tests/test_reproducibility.py's state app)
    config = {"strategy": "ditto", "fraction-fit": 1.0, "min-fit-clients": 4, "min-available-clients": 4,
              "ditto-lambda": 0.5, "eval-every": 1}  # fmt: skip
    run = InProcessRun(run_config=config, num_clients=4)
    records = [run.play_round() for _ in range(3)]
    # every client updates its personal model every round: 4, 8, 12 updates counted from Context.state
    assert [r["ditto-personal-rounds"] for r in records] == [4, 8, 12]
    assert all(r["clients-failed"] == 0 and r["eval-clients-failed"] == 0 and 0 <= r["accuracy"] <= 1 for r in records)
    assert records[-1]["accuracy"] > records[-1]["global-accuracy"]  # personal models fit their own clients
