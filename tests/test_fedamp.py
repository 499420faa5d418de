"""FedAMP: the attention and each client's cloud model by hand; the client's proximal step; what each client is sent."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import regression_data, settings
from helpers import aggregate_fit, answers, configure_evaluate, configure_fit, fleet_of, sent_arrays

from app.local.inprocess import InProcessRun
from clients.fedamp import FedAmpClient
from clients.models import build_model
from strategies.contracts.payload import from_bytes
from strategies.methods.fedamp_math import attention_row, worst_self_weight

MODELS = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])




def test_cosine_attention_shares_alpha_among_the_others_by_a_softmax_of_their_cosines():
    row = attention_row(MODELS, 0, alpha=0.4, sigma=2.0, attention="cosine")
    # cos(w0, w1) = 0, cos(w0, w2) = 1/sqrt(2): weights e^(2*0) and e^(2/sqrt 2), normalised, times 0.4
    a, b = 1.0, math.exp(2 / math.sqrt(2))
    np.testing.assert_allclose(row, [0.6, 0.4 * a / (a + b), 0.4 * b / (a + b)], rtol=1e-12)
    assert worst_self_weight(50, alpha=0.4, sigma=2.0, attention="cosine") == pytest.approx(0.6)


def test_exponential_attention_is_the_papers_derivative_of_one_minus_e_to_the_minus_x_over_sigma():
    row = attention_row(MODELS, 2, alpha=0.1, sigma=4.0, attention="exponential")
    # ||w2 - w0||^2 = ||w2 - w1||^2 = 1: xi = 0.1 e^(-1/4) / 4 each, xi_22 = 1 - their sum
    other = 0.1 * math.exp(-0.25) / 4
    np.testing.assert_allclose(row, [other, other, 1 - 2 * other], rtol=1e-12)
    assert worst_self_weight(3, alpha=0.1, sigma=4.0, attention="exponential") == pytest.approx(1 - 0.1 * 2 / 4)
    assert attention_row(MODELS[:1], 0, alpha=0.9, sigma=1.0, attention="cosine").tolist() == [1.0]


def test_the_client_steps_from_its_cloud_model_with_the_proximal_weight_lambda_over_alpha():
    data, x, y = regression_data()
    lr, lam, alpha = 0.1, 0.3, 0.5
    run = settings(strategy="fedamp", dataset="least-squares", partitioner="natural", model="linear", lr=lr,
                   batch_size=16, local_steps=2, fedamp_lambda=lam, fedamp_alpha_k=alpha, device="cpu")  # fmt: skip
    cloud = np.array([[0.2, 0.4, -0.3]], dtype=np.float32)
    client = FedAmpClient(model=build_model("linear", input_shape=(3,), num_classes=0), data=data, settings=run,
                          partition_id=0)  # fmt: skip
    new, _, _ = client.fit([cloud], {"server-round": 1})
    u = w = cloud.astype(np.float64).ravel()
    for _ in range(2):
        w = w - lr * (x.T @ (x @ w - y) / 16 + lam / alpha * (w - u))
    np.testing.assert_allclose(new[0].ravel(), w, rtol=1e-5, atol=1e-6)


def test_each_client_is_sent_its_own_cloud_model_and_evaluates_its_own_last_model():
    run = InProcessRun(run_config={"strategy": "fedamp", "fraction-fit": 1.0, "min-available-clients": 4,
                                   "fedamp-alpha-k": 0.6, "fedamp-sigma": 5.0, "local-steps": 3, "eval-every": 2},
                       num_clients=4)  # fmt: skip
    strategy, fleet = run.strategy, fleet_of(run)  # started: the preflight has mapped the nodes
    initial = [a.copy() for a in strategy.global_model]
    for server_round in (1, 2):
        kept = {p: v.copy() for p, v in strategy.kept.items()}
        instructions = configure_fit(strategy, server_round, fleet)
        stacked = np.stack([kept[p] for p in sorted(kept)]).astype(np.float64)
        for ins in instructions:  # u_i = sum_j xi_ij w_j, xi by hand from the cosines
            i = sorted(kept).index(strategy.nodes.partition_of(ins.node))
            norms = np.linalg.norm(stacked, axis=1)
            cos = stacked @ stacked[i] / (norms * norms[i])
            weights = np.exp(5.0 * np.delete(cos, i))
            row = np.insert(0.6 * weights / weights.sum(), i, 0.4)
            sent = np.concatenate([a.ravel() for a in sent_arrays(ins)])
            np.testing.assert_allclose(sent, row @ stacked, rtol=1e-5, atol=1e-6)
            if server_round == 1:  # every kept model is the initial one: u_i is that model
                np.testing.assert_allclose(sent, np.concatenate([a.ravel() for a in initial]), rtol=1e-6)
        results, failures = answers(fleet, instructions)
        assert failures == []
        aggregate_fit(strategy, server_round, results)
        for res in results:  # each reply is that client's kept model now
            replied = np.concatenate([from_bytes(t).ravel() for t in res.tensors])
            np.testing.assert_array_equal(strategy.kept[strategy.nodes.partition_of(res.node)], replied)
    clouds = [strategy.cloud[p] for p in sorted(strategy.cloud)]
    assert not np.allclose(clouds[0][0], clouds[1][0])  # round 2: each client its own u_i
    evaluation = configure_evaluate(strategy, 2, fleet)
    assert len(evaluation) == 4  # round 2 evaluates (eval-every 2): every client is checked
    for ins in evaluation:
        sent = np.concatenate([a.ravel() for a in sent_arrays(ins)])
        np.testing.assert_array_equal(sent, strategy.kept[strategy.nodes.partition_of(ins.node)])
        assert ins.config["adapt-steps"] == 0


def test_exponential_attention_that_could_extrapolate_is_refused_at_the_start():
    with pytest.raises(RuntimeError, match=r"'fedamp-alpha-k'.*set fedamp-alpha-k at most 0.333"):
        InProcessRun(run_config={"strategy": "fedamp", "fedamp-attention": "exponential", "fedamp-alpha-k": 0.5,
                                 "fedamp-sigma": 1.0, "min-available-clients": 4}, num_clients=4)  # fmt: skip
