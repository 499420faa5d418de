"""APFL: local steps of w, v and alpha by hand on least squares, alpha's clipping, and the mixture evaluated."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import regression_data, settings

from clients.apfl import LOCAL_MODEL, ApflClient
from clients.models import build_model
from strategies.contracts.apfl import MIXING


def client(**overrides):
    data, _, _ = regression_data()
    config = {"strategy": "apfl", "dataset": "least-squares", "partitioner": "natural", "model": "linear",
              "lr": 0.1, "batch_size": 16, "device": "cpu", **overrides}  # fmt: skip
    return ApflClient(model=build_model("linear", input_shape=(3,), num_classes=0), data=data,
                      settings=settings(**config), partition_id=0)  # fmt: skip


def by_hand(w, v, alpha, *, steps, lr, alpha_lr):
    _, x, y = regression_data()

    def grad(p):
        return x.T @ (x @ p - y) / len(y)

    for _ in range(steps):  # every update from the values before the step
        vbar = alpha * v + (1 - alpha) * w
        g_bar = grad(vbar)
        w, v, alpha = w - lr * grad(w), v - lr * alpha * g_bar, float(np.clip(alpha - alpha_lr * (v - w) @ g_bar, 0, 1))
    return w, v, alpha


@pytest.mark.parametrize("kept", [False, True], ids=["first-round", "kept-v-and-alpha"])
def test_two_steps_of_w_v_and_alpha_match_a_hand_computation(kept):
    lr, alpha_lr = 0.1, 0.5
    start = np.array([0.2, 0.4, -0.3])
    worker = client(local_steps=2, apfl_alpha=0.25, apfl_alpha_lr=alpha_lr)
    v, alpha = start, 0.25  # the first time: v_k is the model received, alpha_k is apfl-alpha
    if kept:
        v, alpha = np.array([1.0, -1.5, 0.7]), 0.6
        worker.state.set_arrays(LOCAL_MODEL, [v.astype(np.float32).reshape(1, 3)])
        worker.state.set_value(MIXING, alpha)
    reply, _, metrics = worker.fit([start.astype(np.float32).reshape(1, 3)], {"server-round": 1})
    w, v, alpha = by_hand(start, v, alpha, steps=2, lr=lr, alpha_lr=alpha_lr)
    np.testing.assert_allclose(reply[0].ravel(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(worker.state.arrays(LOCAL_MODEL)[0].ravel(), v, rtol=1e-5, atol=1e-6)
    assert worker.state.value(MIXING, -1.0) == pytest.approx(alpha, rel=1e-5) == metrics["apfl-mixing"]
    assert metrics["grad-evals"] == 4 and metrics["apfl-personal-loss"] > 0


def test_alpha_stays_put_without_its_step_and_is_clipped_to_the_unit_interval():
    start = [np.array([[0.2, 0.4, -0.3]], np.float32)]
    fixed = client(local_steps=3, apfl_alpha=0.4, apfl_alpha_lr=0.0)
    fixed.fit(start, {"server-round": 1})
    assert fixed.state.value(MIXING, -1.0) == pytest.approx(0.4)
    pushed = client(local_steps=3, apfl_alpha=0.4, apfl_alpha_lr=1e6)
    pushed.state.set_arrays(LOCAL_MODEL, [np.array([[3.0, -3.0, 3.0]], np.float32)])  # far from w: a steep slope
    pushed.fit(start, {"server-round": 1})
    assert pushed.state.value(MIXING, -1.0) in (0.0, 1.0)


def test_evaluation_tests_the_mixture_with_the_model_received():
    worker = client(local_steps=2)
    start = [np.array([[0.2, 0.4, -0.3]], np.float32)]
    loss, _, metrics = worker.evaluate(start, {"adapt-steps": 0})
    assert loss == metrics["global-loss"]  # never sampled: the model received, for both
    worker.fit(start, {"server-round": 1})
    received = [np.array([[0.5, -1.0, 0.2]], np.float32)]
    loss, _, metrics = worker.evaluate(received, {"server-round": 2})
    alpha, v = worker.state.value(MIXING, -1.0), worker.state.arrays(LOCAL_MODEL)[0].ravel()
    mixture = alpha * v + (1 - alpha) * received[0].ravel()
    _, x, y = regression_data()
    assert loss == pytest.approx(np.mean(0.5 * (x[:4] @ mixture - y[:4]) ** 2), rel=1e-5)
    assert metrics["global-loss"] == pytest.approx(np.mean(0.5 * (x[:4] @ received[0].ravel() - y[:4]) ** 2), rel=1e-5)
