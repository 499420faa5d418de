"""A diffusion network from its settings: its files checked, its mean behaviour and the weights of its limit (numpy).

The graph (:mod:`strategies.methods.graphs`) and the combination matrix and its draws
(:mod:`strategies.methods.combinations`) follow ALGORITHMS.md section 3: ``A[l, k]`` is the
weight agent ``k`` gives to agent ``l``, each column sums to 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strategies.contracts.diffusion import DiffusionSettings, parse_probabilities
from strategies.methods.combinations import combination_matrix, fedavg_combination, read_matrix, sampled_combination
from strategies.methods.graphs import adjacency_of, edge_pairs, make_graph


def check_network_files(settings: DiffusionSettings) -> int | None:
    """Read and check the network's files before any client works; the number of agents they imply, if any.

    The graph file, the combination matrix and a per-agent participation list each
    imply K; they must agree with each other (the federation's own K is checked once
    the preflight has told it). A matrix is checked as :func:`combination_matrix`
    checks it, on the graph file's edges when there is one, else on its own support.

    Raises
    ------
    ValueError
        Naming the key and the file, for an unreadable file, a matrix that is not
        left-stochastic, or files that disagree on K.

    """
    implied: dict[str, int] = {}
    adjacency = None
    if settings.graph == "file" and settings.graph_file:
        pairs = edge_pairs(settings.graph_file)
        implied["diffusion-graph-file"] = max((max(pair) for pair in pairs), default=0) + 1
        adjacency = adjacency_of(pairs, implied["diffusion-graph-file"], path=settings.graph_file)
    if settings.combination == "file" and settings.combination_file:
        matrix = read_matrix(settings.combination_file)
        implied["diffusion-combination-file"] = len(matrix)
        if adjacency is None or len(adjacency) != len(matrix):
            adjacency = (matrix != 0) | np.eye(len(matrix), dtype=bool)
        combination_matrix("file", adjacency, path=settings.combination_file)
    if settings.participation_per_agent:
        implied["diffusion-participation-per-agent"] = len(parse_probabilities(settings.participation_per_agent))
    if len(set(implied.values())) > 1:
        shown = ", ".join(f"{name} {count}" for name, count in implied.items())
        raise ValueError(f"the network's files disagree on the number of agents: {shown}")
    return next(iter(implied.values()), None)


# --------------------------------------------------------------- mean behaviour


def neighbour_probabilities(value: float | np.ndarray, num_agents: int) -> np.ndarray:
    """``q_lk`` as a ``(K, K)`` matrix from one number or a matrix."""
    q = np.broadcast_to(np.asarray(value, dtype=np.float64), (num_agents, num_agents)).copy()
    if np.any((q < 0) | (q > 1)):
        raise ValueError("diffusion-neighbour-probability must be in [0, 1]")
    return q


def expected_matrix(matrix: np.ndarray, participation: np.ndarray, neighbour_q: np.ndarray) -> np.ndarray:
    """``A_bar = E[A_i]`` of the sampled combination (ALGORITHMS.md section 3).

    Off the diagonal ``E[a_lk,i] = q_k q_lk a_lk``; each diagonal entry makes its
    column sum to 1: ``1 - q_k sum_{l != k} q_lk a_lk``.
    """
    off = matrix * neighbour_q * participation[np.newaxis, :]
    np.fill_diagonal(off, 0.0)
    expected = off.copy()
    np.fill_diagonal(expected, 1.0 - off.sum(axis=0))
    return expected


def perron_vector(matrix: np.ndarray) -> np.ndarray:
    """The right eigenvector ``p`` of a left-stochastic matrix with ``A p = p``, ``p > 0``, ``sum p = 1``.

    Raises ``ValueError`` when the eigenvalue 1 is not simple with a positive
    eigenvector (a matrix whose graph of positive weights is not strongly connected).
    """
    values, vectors = np.linalg.eig(matrix)
    one = int(np.argmin(np.abs(values - 1.0)))
    vector = np.real(vectors[:, one])
    vector = vector / vector.sum()
    if np.sum(np.abs(values - 1.0) < 1e-9) > 1 or np.any(vector <= 0):
        raise ValueError("the combination matrix has no unique positive Perron vector (is the graph connected?)")
    return vector


def objective_weights(expected: np.ndarray, participation: np.ndarray) -> np.ndarray:
    """``p_bar_k q_k``, normalised to sum to 1: the weights of the objective the network converges to."""
    weights = perron_vector(expected) * participation
    return weights / weights.sum()


def limit_weights(matrix: np.ndarray, participation: np.ndarray, neighbour_q: np.ndarray) -> np.ndarray:
    """The weights of the objective the network's limit minimises, exact to first order in ``mu``.

    The seed's ``p_bar_k q_k`` treats an agent's step size and its self-weight as
    independent, but eq. 9 ties them: a participant's self-weight ``1 - sum sampled``
    multiplies its *updated* model, a non-participant's weight 1 multiplies its old
    one. With ``p = p_bar`` (``A_bar p = p``), the ``p``-weighted mean of the models
    is invariant under ``E[A_i]``, so at consensus its drift must vanish:
    ``sum_l (sum_k p_k E[a_lk,i 1{l took part}]) grad J_l(w) = 0``. For ``k != l`` the
    expectation is ``q_k q_lk a_lk q_l``; for ``k = l`` it is ``q_l (1 - s_l)`` with
    ``s_l = sum_{m != l} q_ml a_ml``. Using row ``l`` of ``A_bar p = p`` this is

        pi_l  proportional to  p_l q_l (1 - (1 - q_l) s_l)

    which equals ``p_l q_l`` when every ``q_l = 1`` (or no neighbour is ever kept)
    and differs otherwise. Normalised to sum to 1.
    """
    expected = expected_matrix(matrix, participation, neighbour_q)
    kept = matrix * neighbour_q
    np.fill_diagonal(kept, 0.0)
    weights = perron_vector(expected) * participation * (1.0 - (1.0 - participation) * kept.sum(axis=0))
    return weights / weights.sum()


# ------------------------------------------------------------------- a network


@dataclass(frozen=True, eq=False)
class Network:
    """A built network: graph, combination matrix, probabilities and the weights of the limit.

    ``weights`` are the seed's ``p_bar_k q_k`` and ``limit_weights`` the first-order
    exact ones of :func:`limit_weights` (normalised). ``expected`` is ``A_bar`` in
    ``diffusion`` mode; in ``fedavg`` / ``fedsgd`` mode every draw is doubly
    stochastic (seed eq. 14-15), ``p_bar`` is uniform and both weightings are
    ``q_k / sum q`` (a participant's row of the draw sums to 1); ``expected`` is then
    ``None``.
    """

    mode: str
    adjacency: np.ndarray
    matrix: np.ndarray
    participation: np.ndarray
    neighbour_q: np.ndarray
    expected: np.ndarray | None
    weights: np.ndarray
    limit_weights: np.ndarray

    @property
    def num_agents(self) -> int:
        return len(self.participation)

    def draw(self, participating: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The combination matrix of one iteration, given the agents whose update arrived."""
        if self.mode == "diffusion":
            return sampled_combination(self.matrix, participating, self.neighbour_q, rng)
        return fedavg_combination(participating)

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything about the network as arrays (for ``topology.npz``)."""
        out = {"adjacency": self.adjacency, "matrix": self.matrix, "participation": self.participation,
               "neighbour_q": self.neighbour_q, "weights": self.weights,
               "limit_weights": self.limit_weights}  # fmt: skip
        if self.expected is not None:
            out["expected"] = self.expected
        return out


def build_network(settings: DiffusionSettings, num_agents: int, *, seed: int = 0) -> Network:
    """Graph, combination matrix, ``q_k``, ``q_lk``, ``A_bar`` and the objective weights for K agents.

    ``seed`` draws the Erdos-Renyi graph.

    Raises
    ------
    ValueError
        For a graph or matrix that cannot be used, or per-agent participation with a
        count other than K (the settings themselves were checked when they were built).

    """
    if settings.participation_per_agent:
        participation = parse_probabilities(settings.participation_per_agent)
        if len(participation) != num_agents:
            raise ValueError(f"diffusion-participation-per-agent ({settings.participation_per_agent!r}) has "
                             f"{len(participation)} values but the federation has {num_agents} agents")  # fmt: skip
    else:
        participation = np.full(num_agents, settings.participation)
    neighbour_q = neighbour_probabilities(settings.neighbour_probability, num_agents)
    if settings.mode != "diffusion":
        adjacency = np.ones((num_agents, num_agents), dtype=bool)
        matrix = np.full((num_agents, num_agents), 1.0 / num_agents)
        weights = participation / participation.sum()
        return Network(settings.mode, adjacency, matrix, participation, neighbour_q, None, weights, weights)
    adjacency = make_graph(settings.graph, num_agents, edge_probability=settings.edge_probability,
                           seed=seed, path=settings.graph_file)  # fmt: skip
    matrix = combination_matrix(settings.combination, adjacency, path=settings.combination_file)
    expected = expected_matrix(matrix, participation, neighbour_q)
    weights = objective_weights(expected, participation)
    exact = limit_weights(matrix, participation, neighbour_q)
    return Network(settings.mode, adjacency, matrix, participation, neighbour_q, expected, weights, exact)
