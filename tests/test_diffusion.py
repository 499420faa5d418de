"""The Diffusion strategy driven by hand with real DiffusionClients, checked against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    K,
    aggregate_evaluate,
    aggregate_fit,
    answers,
    configure_evaluate,
    configure_fit,
    federation,
    sent_arrays,
    settings_for,
    start_run,
)
from helpers import diffusion_strategy as make_strategy

from app.config import ConfigError, check_on_server
from datasets.least_squares import least_squares_optimum
from strategies.methods.combinations import combination_matrix
from strategies.methods.graphs import make_graph


def gradient(part, w):
    x, y = part.train_x.astype(np.float64), part.train_y.astype(np.float64)
    return x.T @ (x @ w - y) / len(y)


def one_round(strategy, fleet, server_round):
    if server_round == 1:
        start_run(strategy, fleet)
    instructions = configure_fit(strategy, server_round, fleet)
    return aggregate_fit(strategy, server_round, *answers(fleet, instructions))


def test_fedsgd_round_is_the_averaged_gradient_step():
    settings = settings_for()
    fleet, parts = federation(settings)
    strategy, w0, _ = make_strategy(settings)
    model, metrics = one_round(strategy, fleet, 1)
    expected = w0 - 0.1 * np.mean([gradient(p, w0) for p in parts], axis=0)
    for agent in range(K):
        np.testing.assert_allclose(strategy.agents[agent], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model[0].ravel(), expected, rtol=1e-5, atol=1e-6)
    assert metrics["agents-participated"] == K and metrics["disagreement"] < 1e-10
    # and again from the common model
    one_round(strategy, fleet, 2)
    expected = expected - 0.1 * np.mean([gradient(p, expected) for p in parts], axis=0)
    np.testing.assert_allclose(strategy.agents[0], expected, rtol=1e-5, atol=1e-6)


def test_devices_with_their_own_data_are_numbered_by_node_id_and_run_exactly_as_numbered_agents():
    # the server numbers the devices by node id as agents 0-3 and tells each its number, which seeds its batches:
    # the same run as agents that knew their numbers
    runs = []
    for own_data in (False, True):
        settings = settings_for(mode="diffusion", participation=0.7, batch_size=20, local_steps=3)
        fleet, _ = federation(settings, own_data=own_data)
        strategy, _, _ = make_strategy(settings)
        for server_round in (1, 2, 3):
            one_round(strategy, fleet, server_round)
        runs.append(strategy.agents.copy())
        assert strategy.network.num_agents == K
    np.testing.assert_array_equal(runs[0], runs[1])


def test_diffusion_round_with_everyone_is_the_combination_of_the_local_steps():
    settings = settings_for(mode="diffusion", graph="ring", combination="uniform", local_steps=2)
    fleet, parts = federation(settings)
    strategy, w0, _ = make_strategy(settings)
    one_round(strategy, fleet, 1)
    psi = []
    for part in parts:  # two full-batch steps
        w = w0 - 0.1 * gradient(part, w0)
        psi.append(w - 0.1 * gradient(part, w))
    matrix = combination_matrix("uniform", make_graph("ring", K))
    expected = matrix.T @ np.array(psi)
    np.testing.assert_allclose(strategy.agents, expected, rtol=1e-5, atol=1e-6)
    assert strategy.agents.dtype == np.float32 and strategy.agents.nbytes == K * 10 * 4  # 4 bytes per parameter


@pytest.mark.parametrize("how", ["raise", "nan"])
def test_a_failed_or_rejected_agent_keeps_its_model_and_neighbours_use_it(how):
    settings = settings_for(mode="diffusion", graph="ring", combination="metropolis")
    fleet, parts = federation(settings, broken={2: how})
    strategy, w0, _ = make_strategy(settings)
    _, metrics = one_round(strategy, fleet, 1)
    assert metrics["agents-participated"] == K - 1
    assert strategy.record["clients-failed"] == 1
    psi = np.array([w0 - 0.1 * gradient(p, w0) for p in parts])
    psi[2] = w0  # no update arrived: it counts as not taking part
    matrix = combination_matrix("metropolis", make_graph("ring", K))
    matrix[:, 2] = np.eye(K)[2]
    np.testing.assert_allclose(strategy.agents, matrix.T @ psi, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(strategy.agents))


def test_participation_draws_and_evaluation_of_each_agents_own_model():
    # the rounds get no replies here (only the draws are counted): the wreck watch would end the run
    settings = settings_for(mode="diffusion", graph="full", participation_per_agent="0.2,0.4,0.6,1.0", rounds=200,
                            wreck_rounds=0)  # fmt: skip
    fleet, _ = federation(settings)
    strategy, _, recorder = make_strategy(settings)
    counts = np.zeros(K)
    for server_round in range(1, 201):
        if server_round == 1:
            start_run(strategy, fleet)
        instructions = configure_fit(strategy, server_round, fleet)
        for ins in instructions:
            counts[strategy.nodes.partition_of(ins.node)] += 1
        aggregate_fit(strategy, server_round, [])
        if server_round < 200:
            strategy.end_round(server_round)
    # binomial(200, q): 4 standard deviations
    q = np.array([0.2, 0.4, 0.6, 1.0])
    assert np.all(np.abs(counts / 200 - q) <= 4 * np.sqrt(q * (1 - q) / 200) + 1e-9)
    instructions = configure_evaluate(strategy, 200, fleet)
    assert len(instructions) == K and all(ins.config["adapt-steps"] == 0 for ins in instructions)
    for ins in instructions:
        agent = strategy.nodes.partition_of(ins.node)
        np.testing.assert_array_equal(sent_arrays(ins)[0].ravel(), strategy.agents[agent])
    replies, failures = answers(fleet, instructions, evaluate=True)
    assert failures == []
    _, metrics = aggregate_evaluate(strategy, 200, replies)
    assert metrics["eval-clients"] == K and np.isfinite(metrics["loss"]) and "accuracy" not in metrics
    assert set(recorder.arrays["topology"]) >= {"adjacency", "matrix", "expected", "weights", "participation"}


def test_network_mean_heads_for_the_weighted_optimum_and_the_first_order_limit():
    """The network mean ends near argmin sum pi_k J_k, far from the plain optimum.

    Star graph, uniform averaging, q = (1, .5, .5, .5): the seed's weights p_k q_k are
    (.4, .2, .2, .2); the first-order exact ones (``limit_weights``) are
    (8/17, 3/17, 3/17, 3/17). Over the second half of 2,000 rounds at mu = 0.02 the
    mean is nearer the seed's w_o than the plain optimum, and nearer still to the
    first-order limit (at O(mu) from it; measured 0.09 against 0.41 for the seed's).
    """
    rounds = 2000
    settings = settings_for(mode="diffusion", graph="star", combination="uniform", mu=0.02, local_steps=1,
                            participation_per_agent="1.0,0.5,0.5,0.5", synthetic_alpha=2.0, rounds=rounds)  # fmt: skip
    fleet, parts = federation(settings)
    strategy, _, _ = make_strategy(settings)
    total = np.zeros(10)
    for server_round in range(1, rounds + 1):
        one_round(strategy, fleet, server_round)
        if server_round > rounds // 2:
            total += strategy.agents.mean(axis=0)
    mean = total / (rounds - rounds // 2)
    network = strategy.network
    np.testing.assert_allclose(network.weights, [0.4, 0.2, 0.2, 0.2])
    np.testing.assert_allclose(network.limit_weights, np.array([8, 3, 3, 3]) / 17)
    xs, ys = [p.train_x for p in parts], [p.train_y for p in parts]
    w_seed = least_squares_optimum(xs, ys, network.weights)
    w_limit = least_squares_optimum(xs, ys, network.limit_weights)
    w_plain = least_squares_optimum(xs, ys, np.ones(K))
    assert np.linalg.norm(w_seed - w_plain) > 0.5
    assert np.linalg.norm(mean - w_seed) < 0.5 * np.linalg.norm(mean - w_plain)
    assert np.linalg.norm(mean - w_limit) < 0.5 * np.linalg.norm(mean - w_seed)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mu": 0.0}, "'diffusion-mu': 0.0 is outside (0, inf)"),
        ({"local_steps": 0}, "'local-steps': 0 is outside [1, 1000000]"),
        ({"participation": 1.5}, "'diffusion-participation': 1.5 is outside (0, 1]"),
        ({"participation": 0.0}, "'diffusion-participation': 0.0 is outside (0, 1]"),
        ({"neighbour_probability": -0.1}, "'diffusion-neighbour-probability': -0.1 is outside [0, 1]"),
        (
            {"mode": "diffusion", "participation_per_agent": "0.5,1.2"},
            "'diffusion-participation-per-agent': needs one or more numbers in (0, 1]",
        ),
        ({"graph": "tree"}, "'diffusion-graph': 'tree' is not allowed; choose one of ['ring'"),
        ({"graph": "file"}, "'diffusion-graph-file' is set exactly when 'diffusion-graph' is 'file'"),
        ({"mode": "diffusion", "combination": "file", "combination_file": "/nonexistent"}, "is not a file"),
        ({"mode": "fedsgd", "participation": 0.5}, "'fedsgd' has every agent take part"),
    ],
)
def test_bad_settings_fail_before_any_work_with_the_key_named(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_on_server(settings_for(**overrides))  # what server_fn runs first
    assert message in str(err.value)


def test_clients_do_not_need_the_servers_files():
    # a SuperNode parses the same run config but never reads the network's files
    settings = settings_for(mode="diffusion", graph="file", combination="file", graph_file="/only/on/the/server.txt",
                            combination_file="/only/on/the/server.npy",
                            participation_per_agent="/only/on/the/server-q.txt")  # fmt: skip
    assert settings.method.graph_file == "/only/on/the/server.txt"
    with pytest.raises(ConfigError, match="'diffusion-graph-file': '/only/on/the/server.txt' is not a file"):
        check_on_server(settings)


def test_bad_networks_fail_at_the_start_naming_the_problem(tmp_path):
    graph = tmp_path / "edges.txt"
    graph.write_text("0 1\n2 3\n")
    settings = settings_for(mode="diffusion", graph="file", graph_file=str(graph))
    fleet, _ = federation(settings)
    with pytest.raises(ValueError, match="graph 'file' on 4 agents is not connected"):
        start_run(make_strategy(settings)[0], fleet)
    graph.write_text("0 1\n1 2\n2 3\n3 7\n")  # agent 7: more agents than the 4 partitions
    with pytest.raises(ValueError, match="agent 7 is outside 0..3"):
        start_run(make_strategy(settings)[0], fleet)
    matrix = tmp_path / "a.txt"
    np.savetxt(matrix, np.full((K, K), 0.3))
    settings = settings_for(mode="diffusion", graph="full", combination="file", combination_file=str(matrix))
    with pytest.raises(ValueError, match="column 0 sums to 1.2, not 1"):
        start_run(make_strategy(settings)[0], fleet)
    settings = settings_for(mode="diffusion", participation_per_agent="0.5,0.5")
    expected = r"diffusion-participation-per-agent \('0.5,0.5'\) has 2 values but the federation has 4"
    with pytest.raises(ValueError, match=expected):
        start_run(make_strategy(settings)[0], fleet)
