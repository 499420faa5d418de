"""SCAFFOLD: one client's step and control update by hand, the server's update, FedAvg's first round, bad replies."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import regression_data, settings
from helpers import aggregate_fit, answers, configure_evaluate, configure_fit, fleet_of, received

from app.local.inprocess import InProcessRun
from app.server_run import build_strategy
from clients.models import build_model
from clients.scaffold import CLIENT_CONTROL, ScaffoldClient
from clients.state import ClientState
from strategies.contracts.payload import from_bytes, pack, unpack

N, D = 16, 3




def sets_of(reply):
    """A fit reply's array sets, by name (its arrays unpacked by the layout in its metrics)."""
    return unpack([from_bytes(t) for t in reply.tensors], reply.metrics["payload"])


def client(state=None, **overrides):
    data, _, _ = regression_data()
    config = {"strategy": "scaffold", "dataset": "least-squares", "partitioner": "natural", "model": "linear",
              "lr": 0.1, "batch_size": N, "device": "cpu", **overrides}  # fmt: skip
    return ScaffoldClient(model=build_model("linear", input_shape=(D,), num_classes=0), data=data,
                          settings=settings(**config), partition_id=0, state=state)  # fmt: skip


def gradient(w, x, y):
    return x.T @ (x @ w - y) / N  # of mean(0.5 (x w - y)^2)


def test_two_corrected_steps_and_the_control_update_match_a_hand_computation():
    lr, steps = 0.1, 2
    start = np.array([0.2, 0.4, -0.3])
    control = np.array([0.05, -0.1, 0.2])  # c, from the server
    client_control = np.array([-0.02, 0.03, 0.01])  # c_i, kept from an earlier round
    state = ClientState(owner="scaffold")
    state.set_arrays(CLIENT_CONTROL, [client_control.astype(np.float32).reshape(1, D)])
    arrays, layout = pack({"model": [start.astype(np.float32).reshape(1, D)],
                           "control": [control.astype(np.float32).reshape(1, D)]})  # fmt: skip
    reply, _, metrics = client(state, local_steps=steps).fit(arrays, {"server-round": 1, "payload": layout})
    sets = unpack(reply, metrics["payload"])
    _, x, y = regression_data()
    w = start
    for _ in range(steps):  # y <- y - lr (g(y) - c_i + c)
        w = w - lr * (gradient(w, x, y) - client_control + control)
    np.testing.assert_allclose(sets["model"][0].ravel(), w, rtol=1e-5, atol=1e-6)
    updated = client_control - control + (start - w) / (steps * lr)  # option II
    np.testing.assert_allclose(sets["delta-control"][0].ravel(), updated - client_control, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state.arrays(CLIENT_CONTROL)[0].ravel(), updated, rtol=1e-4, atol=1e-6)
    assert metrics["scaffold-correction-norm"] == pytest.approx(np.linalg.norm(control - client_control), rel=1e-5)


def test_one_step_from_zero_controls_sets_c_i_to_the_gradient():
    start = np.array([0.2, 0.4, -0.3], dtype=np.float32).reshape(1, D)
    state = ClientState(owner="scaffold")
    arrays, layout = pack({"model": [start], "control": [np.zeros((1, D), np.float32)]})
    client(state, local_steps=1).fit(arrays, {"server-round": 1, "payload": layout})
    _, x, y = regression_data()
    # K = 1: c_i+ = 0 - 0 + (x - (x - lr g)) / lr = g(x)
    np.testing.assert_allclose(state.arrays(CLIENT_CONTROL)[0].ravel(), gradient(start.ravel(), x, y), rtol=1e-4)


def run_config(strategy, **overrides):
    return {"strategy": strategy, "num-server-rounds": 3, "fraction-fit": 0.5, "local-steps": 5, "preflight": False,
            "min-available-clients": 4, **overrides}  # fmt: skip


def test_with_zero_controls_the_first_round_is_fedavgs_bit_for_bit():
    models = {}
    for strategy in ("fedavg", "scaffold"):
        run = InProcessRun(run_config=run_config(strategy), num_clients=4)
        run.step()
        models[strategy] = run.strategy.global_model
    for a, b in zip(models["fedavg"], models["scaffold"], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("aggregation", ["uniform", "examples"])
def test_the_server_moves_x_by_eta_g_and_c_by_the_sampled_share_of_the_mean_delta(aggregation):
    run = InProcessRun(run_config=run_config("scaffold", **{"scaffold-server-lr": 0.5, "aggregation": aggregation}),
                       num_clients=4)  # fmt: skip
    strategy, fleet = run.strategy, fleet_of(run)
    before = [a.copy() for a in strategy.global_model]
    control = [c.copy() for c in strategy.control]
    instructions = configure_fit(strategy, 1, fleet)
    arrays = len(before)
    assert all(ins.config["payload"] == f"model:{arrays} control:{arrays}" for ins in instructions)
    results, failures = answers(fleet, instructions)
    assert failures == []
    replies = [sets_of(res) for res in results]
    # the perfedavg-paper split of 4 users: 40 examples for users 0 and 1, 12 for users 2 and 3
    weights = [res.num_examples if aggregation == "examples" else 1 for res in results]
    assert aggregation == "uniform" or len(set(weights)) == 2
    aggregate_fit(strategy, 1, results)
    for i in range(arrays):
        mean_y = np.average([r["model"][i].astype(np.float64) for r in replies], axis=0, weights=weights)
        mean_dc = np.average([r["delta-control"][i].astype(np.float64) for r in replies], axis=0, weights=weights)
        moved = before[i] + 0.5 * (mean_y - before[i])  # x + eta_g (mean(y) - x)
        np.testing.assert_allclose(strategy.global_model[i], moved, rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose(strategy.control[i], control[i] + len(replies) / 4 * mean_dc, rtol=1e-5,
                                   atol=1e-7)  # fmt: skip
        if aggregation == "uniform":  # the paper's mean, as computed before the weights were shared: bit for bit
            paper = np.mean([r["delta-control"][i] for r in replies], axis=0, dtype=np.float64).astype(np.float32)
            np.testing.assert_array_equal(strategy.control[i], control[i] + len(replies) / 4 * paper)
    assert len(replies) == 2 and strategy.record["scaffold-control-norm"] > 0
    evaluations = configure_evaluate(strategy, 10, fleet)
    assert all(ins.config["payload"] == f"model:{arrays}" for ins in evaluations)  # c goes with fits only


def test_a_reply_without_a_good_delta_control_is_rejected_naming_it_and_the_run_goes_on(caplog):
    run = InProcessRun(run_config=run_config("scaffold", **{"fraction-fit": 1.0}), num_clients=4)
    strategy, fleet = run.strategy, fleet_of(run)
    results, failures = answers(fleet, configure_fit(strategy, 1, fleet))
    assert failures == []

    def without(sets):
        return {"model": sets["model"]}

    def misshapen(sets):
        return {**sets, "delta-control": [np.zeros(3, np.float32), *sets["delta-control"][1:]]}

    def with_nan(sets):
        return {**sets, "delta-control": [np.full_like(sets["delta-control"][0], np.nan), *sets["delta-control"][1:]]}

    tampered = {1: without, 2: misshapen, 3: with_nan}
    for partition, change in tampered.items():
        res = results[partition]
        arrays, layout = pack(change(sets_of(res)))
        results[partition] = received(res.node, arrays, res.num_examples, {**res.metrics, "payload": layout})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        model, _ = aggregate_fit(strategy, 1, results)
    assert model is not None and strategy.record["clients-succeeded"] == 1  # partition 0's reply was used
    lines = [r.getMessage() for r in caplog.records if "rejected fit reply" in r.getMessage()]
    for partition, problem in ((1, "is missing"), (2, "shape"), (3, "non-finite")):
        assert any(f"partition {partition} " in line and "scaffold array set 'delta-control'" in line
                   and problem in line for line in lines), lines  # fmt: skip


def test_a_resumed_run_restarts_c_at_zero_with_the_clients_c_i_and_says_so(caplog):
    run_settings = settings(strategy="scaffold", model="logreg", num_server_rounds=4)
    strategy = build_strategy(run_settings)
    strategy.control = [np.full_like(c, 0.25) for c in strategy.control]
    checkpoint = strategy.checkpoint(2)
    assert not [name for name in checkpoint.arrays if "control" in name]
    resumed = build_strategy(run_settings)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        resumed.resume(checkpoint)
    assert all(np.all(c == 0) for c in resumed.control)
    messages = [r.getMessage() for r in caplog.records]
    assert any("its control variate c_i" in m and "differ from an uninterrupted run" in m for m in messages), messages


def test_a_round_that_diverges_leaves_the_clients_c_i_as_it_was():
    start = np.array([0.2, 0.4, -0.3], dtype=np.float32).reshape(1, D)
    state = ClientState(owner="scaffold")
    kept = [np.full((1, D), 0.01, np.float32)]
    state.set_arrays(CLIENT_CONTROL, kept)
    arrays, layout = pack({"model": [start], "control": [np.zeros((1, D), np.float32)]})
    reply, _, _ = client(state, lr=1e30, local_steps=3).fit(arrays, {"server-round": 1, "payload": layout})
    assert not np.all(np.isfinite(reply[0]))  # the server rejects this reply ...
    np.testing.assert_array_equal(state.arrays(CLIENT_CONTROL)[0], kept[0])  # ... and the client keeps its c_i


def test_a_diverged_run_names_lr_and_how_the_control_variate_grew():
    strategy = build_strategy(settings(strategy="scaffold", model="logreg", lr=0.1))
    assert strategy.divergence_hint() == "most likely the cause: lower them"  # no rounds yet: the base's words
    strategy.watch.history = [{"round": 1, "scaffold-control-norm": 0.1}, {"round": 2, "scaffold-control-norm": 51.0},
                              {"round": 3, "scaffold-control-norm": 4308.0}, {"round": 4}]  # round 4: no reply accepted
    hint = strategy.divergence_hint()
    assert hint.startswith("most likely the cause: lower lr") and "from 0.1 in the first round to 4.31e+03" in hint
    assert strategy.contract.step_keys() == ("lr",)  # the reason's "step sizes in force" name lr
