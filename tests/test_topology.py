"""Graphs, combination matrices, Perron vectors and the sampled combination (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.methods.combinations import (
    check_combination,
    combination_matrix,
    combine,
    disagreement,
    fedavg_combination,
    sampled_combination,
)
from strategies.methods.graphs import is_connected, make_graph
from strategies.methods.topology import (
    expected_matrix,
    limit_weights,
    neighbour_probabilities,
    objective_weights,
    perron_vector,
)


@pytest.mark.parametrize("kind", ["ring", "grid", "star", "full", "erdos-renyi"])
@pytest.mark.parametrize("num", [1, 2, 7, 12])
def test_graphs_are_symmetric_connected_with_self_loops(kind, num):
    adjacency = make_graph(kind, num, edge_probability=0.3, seed=3)
    assert adjacency.shape == (num, num)
    assert np.array_equal(adjacency, adjacency.T)
    assert adjacency.diagonal().all()
    assert is_connected(adjacency)


def test_graph_shapes():
    ring = make_graph("ring", 6)
    assert ring.sum(axis=0).tolist() == [3] * 6
    grid = make_graph("grid", 9)  # 3 x 3: corners 3, edges 4, centre 5 (self included)
    assert sorted(grid.sum(axis=0).tolist()) == [3, 3, 3, 3, 4, 4, 4, 4, 5]
    star = make_graph("star", 5)
    assert star.sum(axis=0).tolist() == [5, 2, 2, 2, 2]
    assert make_graph("full", 4).all()
    a, b = make_graph("erdos-renyi", 15, seed=1), make_graph("erdos-renyi", 15, seed=1)
    assert np.array_equal(a, b)


def test_edge_list_file(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("# a path\n0 1\n1 2\n\n2,3\n")
    adjacency = make_graph("file", 4, path=path)
    assert adjacency.sum() == 4 + 2 * 3
    with pytest.raises(ValueError, match="not connected"):
        make_graph("file", 5, path=path)
    with pytest.raises(ValueError, match="agent 3 is outside 0..2"):
        make_graph("file", 3, path=path)
    (tmp_path / "bad.txt").write_text("0 x\n")
    with pytest.raises(ValueError, match="line 1"):
        make_graph("file", 3, path=tmp_path / "bad.txt")


def test_unknown_graph_and_rule_name_the_choices():
    with pytest.raises(ValueError, match=r"graph 'tree' is not one of \['ring'"):
        make_graph("tree", 4)
    with pytest.raises(ValueError, match="combination 'max' is not one of"):
        combination_matrix("max", make_graph("ring", 4))


def test_metropolis_is_doubly_stochastic_and_uniform_left_stochastic():
    adjacency = make_graph("star", 5)
    metro = combination_matrix("metropolis", adjacency)
    assert np.allclose(metro.sum(axis=0), 1) and np.allclose(metro.sum(axis=1), 1)
    assert np.allclose(metro, metro.T)
    assert metro[1, 0] == pytest.approx(1 / 5)  # 1 / max(5, 2)
    uniform = combination_matrix("uniform", adjacency)
    assert np.allclose(uniform.sum(axis=0), 1)
    assert uniform[0, 1] == pytest.approx(1 / 2) and uniform[1, 0] == pytest.approx(1 / 5)
    assert not np.allclose(uniform.sum(axis=1), 1)


def test_bad_matrices_name_the_column(tmp_path):
    adjacency = make_graph("ring", 4)
    good = combination_matrix("uniform", adjacency)
    bad = good.copy()
    bad[0, 2] = 0.1  # agents 0 and 2 are not neighbours on a 4-ring
    bad[2, 2] -= 0.1
    with pytest.raises(ValueError, match="column 2 gives weight to agent 0"):
        check_combination(bad, adjacency)
    bad = good.copy()
    bad[1, 1] += 0.2
    with pytest.raises(ValueError, match="column 1 sums to 1.2"):
        check_combination(bad, adjacency)
    bad = good.copy()
    bad[0, 3], bad[3, 3] = -0.1, bad[3, 3] + 0.1 + good[0, 3]
    with pytest.raises(ValueError, match="column 3 has a negative weight"):
        check_combination(bad, adjacency)
    path = tmp_path / "a.txt"
    np.savetxt(path, good)
    assert np.allclose(combination_matrix("file", adjacency, path=path), good)
    np.savetxt(path, good[:3])
    with pytest.raises(ValueError, match=f"diffusion-combination-file {path}: 3 x 4 is not square"):
        combination_matrix("file", adjacency, path=path)
    np.savetxt(path, combination_matrix("uniform", make_graph("ring", 3)))
    with pytest.raises(ValueError, match=r"is \(3, 3\), expected \(4, 4\) \(the federation has 4 agents\)"):
        combination_matrix("file", adjacency, path=path)
    bad = good.copy()
    bad[1, 1] += 0.2
    np.savetxt(path, bad)
    with pytest.raises(ValueError, match=f"diffusion-combination-file {path}: combination matrix column 1 sums to 1.2"):
        combination_matrix("file", adjacency, path=path)


def test_perron_vectors_of_known_matrices():
    # doubly stochastic: uniform vector
    assert np.allclose(perron_vector(combination_matrix("metropolis", make_graph("ring", 5))), 0.2)
    # two agents: A = [[1-a, b], [a, 1-b]] has p proportional to (b, a)
    a, b = 0.3, 0.1
    p = perron_vector(np.array([[1 - a, b], [a, 1 - b]]))
    assert np.allclose(p, [b / (a + b), a / (a + b)])
    # uniform averaging on a graph: p_k proportional to the neighbourhood size n_k
    adjacency = make_graph("star", 6)
    p = perron_vector(combination_matrix("uniform", adjacency))
    sizes = adjacency.sum(axis=0)
    assert np.allclose(p, sizes / sizes.sum())
    with pytest.raises(ValueError, match="no unique positive Perron vector"):
        perron_vector(np.eye(3))


def test_expected_matrix_formula_and_objective_weights():
    adjacency = make_graph("ring", 5)
    matrix = combination_matrix("metropolis", adjacency)
    q = np.array([0.3, 0.5, 1.0, 0.8, 0.6])
    q_nb = neighbour_probabilities(0.7, 5)
    expected = expected_matrix(matrix, q, q_nb)
    assert np.allclose(expected.sum(axis=0), 1)
    assert expected[1, 0] == pytest.approx(0.3 * 0.7 * matrix[1, 0])
    assert expected[0, 0] == pytest.approx(1 - 0.3 * 0.7 * (matrix[1, 0] + matrix[4, 0]))
    weights = objective_weights(expected, q)
    p = perron_vector(expected)
    assert np.allclose(weights, p * q / np.sum(p * q))
    # Metropolis with q_lk equal: A_bar = I + 0.7 (A - I) diag(q); p_k is proportional to 1/q_k
    assert np.allclose(p, (1 / q) / np.sum(1 / q))
    # uniform averaging: p_bar_k q_k is A's own Perron vector (n_k / sum n), whatever q_k is
    adjacency = make_graph("star", 5)
    expected = expected_matrix(combination_matrix("uniform", adjacency), q, q_nb)
    sizes = adjacency.sum(axis=0)
    assert np.allclose(objective_weights(expected, q), sizes / sizes.sum())
    with pytest.raises(ValueError, match="neighbour-probability must be in"):
        neighbour_probabilities(1.5, 3)


def test_sampled_matrices_are_left_stochastic_and_average_to_the_expected_one():
    adjacency = make_graph("erdos-renyi", 8, edge_probability=0.4, seed=2)
    matrix = combination_matrix("uniform", adjacency)
    q = np.linspace(0.3, 1.0, 8)
    q_nb = neighbour_probabilities(0.7, 8)
    rng = np.random.default_rng(0)
    total, draws = np.zeros_like(matrix), 20000
    for _ in range(draws):
        participating = rng.random(8) < q
        sampled = sampled_combination(matrix, participating, q_nb, rng)
        assert np.allclose(sampled.sum(axis=0), 1, atol=1e-12)
        assert np.all(sampled >= -1e-15)
        assert np.all(sampled[~adjacency] == 0)
        assert np.array_equal(sampled[:, ~participating], np.eye(8)[:, ~participating])
        total += sampled
    # each entry is a mean of bounded draws: 5 standard errors of a [0, 1] variable
    assert np.max(np.abs(total / draws - expected_matrix(matrix, q, q_nb))) < 5 * 0.5 / np.sqrt(draws)


def test_fedavg_and_fedsgd_matrices():
    participating = np.array([True, False, True, True])
    matrix = fedavg_combination(participating)
    assert np.allclose(matrix[:, [0, 2, 3]][[0, 2, 3]], 1 / 3)
    assert np.array_equal(matrix[:, 1], [0, 1, 0, 0]) and matrix[1, [0, 2, 3]].sum() == 0
    assert np.allclose(fedavg_combination(np.ones(4, dtype=bool)), np.full((4, 4), 0.25))
    assert np.array_equal(fedavg_combination(np.zeros(3, dtype=bool)), np.eye(3))


def test_combine_and_disagreement():
    rng = np.random.default_rng(1)
    psi = rng.normal(size=(5, 7))
    matrix = combination_matrix("metropolis", make_graph("ring", 5))
    assert np.allclose(combine(matrix, psi), matrix.T @ psi)
    assert disagreement(np.ones((4, 3))) == 0.0
    models = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert disagreement(models) == pytest.approx(1.0)


def test_limit_weights_closed_form():
    adjacency = make_graph("star", 4)
    matrix = combination_matrix("uniform", adjacency)
    q = np.array([1.0, 0.5, 0.5, 0.5])
    ones = neighbour_probabilities(1.0, 4)
    # p_bar is uniform here (p_k q_k proportional to n_k = (4, 2, 2, 2)); s = (3/4, 1/2, 1/2, 1/2);
    # pi proportional to p q (1 - (1 - q) s) = (1, .5 * .75, ...) = (8, 3, 3, 3) / 17
    assert np.allclose(limit_weights(matrix, q, ones), np.array([8, 3, 3, 3]) / 17)
    # everyone always takes part: the seed's weights are exact
    full = np.ones(4)
    expected = expected_matrix(matrix, full, ones)
    assert np.allclose(limit_weights(matrix, full, ones), objective_weights(expected, full))
