"""Graphs, combination matrices and their sampled versions for asynchronous diffusion (pure numpy).

Conventions (ALGORITHMS.md section 3): ``adjacency[l, k]`` is True when agent ``l``
is a neighbour of agent ``k``; every agent is its own neighbour and graphs are
undirected. A combination matrix ``A`` is left-stochastic: ``A[l, k]`` is the
weight agent ``k`` gives to agent ``l``, each column sums to 1, and ``A[l, k] = 0``
off the graph. Agent ``k``'s new model is ``sum_l A[l, k] psi_l``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strategies.contracts.diffusion import COMBINATIONS, GRAPHS, DiffusionSettings, parse_probabilities

STOCHASTIC_TOL = 1e-9
MAX_GRAPH_DRAWS = 1000


# ------------------------------------------------------------------------ graphs


def make_graph(
    kind: str, num_agents: int, *, edge_probability: float = 0.3, seed: int = 0, path: str | Path = ""
) -> np.ndarray:
    """The ``(K, K)`` boolean adjacency (self-loops included) of graph ``kind``.

    Parameters
    ----------
    kind
        ``ring``; ``grid`` (a near-square lattice, 4 neighbours inside); ``star``
        (agent 0 at the centre); ``full``; ``erdos-renyi``; ``file``.
    num_agents
        K. A graph file must name agents ``0 .. K-1`` only.
    edge_probability, seed
        ``erdos-renyi``: each edge is present with this probability; the graph is
        drawn from this seed, again and again until it is connected.
    path
        ``file``: an edge list, one ``l k`` pair of 0-based agents per line, ``#``
        comments allowed.

    Raises
    ------
    ValueError
        For an unknown kind, K < 1, an edge list naming an agent outside
        ``0 .. K-1``, or a graph that is not connected.

    """
    if kind not in GRAPHS:
        raise ValueError(f"graph {kind!r} is not one of {list(GRAPHS)}")
    if num_agents < 1:
        raise ValueError(f"a graph needs at least one agent, got {num_agents}")
    k = num_agents
    adjacency = np.eye(k, dtype=bool)
    if kind == "ring":
        for a in range(k):
            adjacency[a, (a + 1) % k] = adjacency[(a + 1) % k, a] = True
    elif kind == "grid":
        cols = int(np.ceil(np.sqrt(k)))
        for a in range(k):
            right, down = a + 1, a + cols
            if right < k and right % cols != 0:
                adjacency[a, right] = adjacency[right, a] = True
            if down < k:
                adjacency[a, down] = adjacency[down, a] = True
    elif kind == "star":
        adjacency[0, :] = adjacency[:, 0] = True
    elif kind == "full":
        adjacency[:] = True
    elif kind == "erdos-renyi":
        if not 0.0 < edge_probability <= 1.0:
            raise ValueError(f"diffusion-edge-probability must be in (0, 1], got {edge_probability}")
        rng = np.random.default_rng(seed)
        for _ in range(MAX_GRAPH_DRAWS):
            upper = np.triu(rng.random((k, k)) < edge_probability, 1)
            adjacency = upper | upper.T | np.eye(k, dtype=bool)
            if is_connected(adjacency):
                break
        else:
            raise ValueError(
                f"no connected Erdos-Renyi graph on {k} agents in {MAX_GRAPH_DRAWS} draws with "
                f"diffusion-edge-probability {edge_probability}; raise it"
            )
    else:
        adjacency = read_edge_list(path, k)
    if not is_connected(adjacency):
        raise ValueError(f"graph {kind!r} on {k} agents is not connected")
    return adjacency


def read_edge_list(path: str | Path, num_agents: int) -> np.ndarray:
    """Adjacency from a file of ``l k`` lines (undirected, 0-based); self-loops are added."""
    return adjacency_of(_edge_pairs(path), num_agents, path=path)


def adjacency_of(pairs: list[tuple[int, int]], num_agents: int, *, path: str | Path) -> np.ndarray:
    """The adjacency (self-loops included) of the edge list ``pairs`` read from ``path``, on K agents."""
    adjacency = np.eye(num_agents, dtype=bool)
    for a, b in pairs:
        if not (a < num_agents and b < num_agents):
            raise ValueError(
                f"diffusion-graph-file {path}: agent {max(a, b)} is outside 0..{num_agents - 1} "
                f"(the federation has {num_agents} partitions)"
            )
        adjacency[a, b] = adjacency[b, a] = True
    return adjacency


def is_connected(adjacency: np.ndarray) -> bool:
    """Whether every agent reaches every other one (breadth-first search from agent 0)."""
    seen = np.zeros(len(adjacency), dtype=bool)
    seen[0], frontier = True, [0]
    while frontier:
        nxt = np.flatnonzero(adjacency[frontier].any(axis=0) & ~seen)
        seen[nxt] = True
        frontier = list(nxt)
    return bool(seen.all())


# ---------------------------------------------------------- combination matrices


def combination_matrix(rule: str, adjacency: np.ndarray, *, path: str | Path = "") -> np.ndarray:
    """The left-stochastic combination matrix of ``rule`` on ``adjacency``, validated.

    ``metropolis``: ``a_lk = 1 / max(n_k, n_l)`` for neighbours ``l != k`` (``n`` =
    neighbourhood size, self included), ``a_kk`` takes the rest; doubly stochastic.
    ``uniform``: ``a_lk = 1 / n_k`` for every ``l`` in ``N_k``; left-stochastic only.
    ``file``: a whitespace-separated ``K x K`` matrix read from ``path``.
    """
    if rule not in COMBINATIONS:
        raise ValueError(f"combination {rule!r} is not one of {list(COMBINATIONS)}")
    sizes = adjacency.sum(axis=0).astype(np.float64)
    if rule == "metropolis":
        matrix = np.where(adjacency, 1.0 / np.maximum.outer(sizes, sizes), 0.0)
        np.fill_diagonal(matrix, 0.0)
        np.fill_diagonal(matrix, 1.0 - matrix.sum(axis=0))
    elif rule == "uniform":
        matrix = adjacency / sizes[np.newaxis, :]
    else:
        matrix = read_matrix(path)
        if matrix.shape != adjacency.shape:
            raise ValueError(f"diffusion-combination-file {path} is {matrix.shape}, expected {adjacency.shape} "
                             f"(the federation has {len(adjacency)} agents)")  # fmt: skip
    try:
        check_combination(matrix, adjacency)
    except ValueError as err:
        raise ValueError(f"diffusion-combination-file {path}: {err}" if rule == "file" else str(err)) from err
    return matrix


def read_matrix(path: str | Path) -> np.ndarray:
    """A square matrix of numbers from a whitespace-separated text file; errors name the file."""
    try:
        matrix = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except (OSError, ValueError) as err:
        raise ValueError(f"diffusion-combination-file {path}: not a matrix of numbers ({err})") from err
    if matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"diffusion-combination-file {path}: {matrix.shape[0]} x {matrix.shape[1]} is not square")
    return matrix


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
        pairs = _edge_pairs(settings.graph_file)
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


def _edge_pairs(path: str | Path) -> list[tuple[int, int]]:
    pairs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            a, b = (int(v) for v in text.replace(",", " ").split())
        except ValueError as err:
            raise ValueError(
                f"diffusion-graph-file {path} line {number}: expected two agent numbers, got {line!r}"
            ) from err
        if min(a, b) < 0:
            raise ValueError(f"diffusion-graph-file {path} line {number}: agent {min(a, b)} is negative")
        pairs.append((a, b))
    return pairs


def check_combination(matrix: np.ndarray, adjacency: np.ndarray) -> None:
    """Raise ``ValueError`` naming the first column that is negative, off the graph or not summing to 1."""
    for k in range(matrix.shape[1]):
        column = matrix[:, k]
        if np.any(column < 0):
            raise ValueError(f"combination matrix column {k} has a negative weight (agent {int(np.argmin(column))})")
        off = np.flatnonzero((column != 0) & ~adjacency[:, k])
        if off.size:
            raise ValueError(f"combination matrix column {k} gives weight to agent {off[0]}, not its neighbour")
        if abs(column.sum() - 1.0) > STOCHASTIC_TOL:
            raise ValueError(f"combination matrix column {k} sums to {column.sum():.12g}, not 1 (left-stochastic)")


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


# ------------------------------------------------------------------- sampling


def sampled_combination(
    matrix: np.ndarray, participating: np.ndarray, neighbour_q: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """One draw ``A_i`` (seed eq. 9) given who took part this iteration.

    A participating agent ``k`` keeps each neighbour ``l != k`` with probability
    ``q_lk`` and gives its self-weight the rest; a non-participant's column is
    ``e_k`` (it keeps its model).
    """
    num = len(participating)
    keep = rng.random((num, num)) < neighbour_q
    sampled = np.where(keep & participating[np.newaxis, :], matrix, 0.0)
    np.fill_diagonal(sampled, 0.0)
    np.fill_diagonal(sampled, 1.0 - sampled.sum(axis=0))
    return sampled


def fedavg_combination(participating: np.ndarray) -> np.ndarray:
    """Seed eq. 15: participants average all participants; others keep their model.

    With every agent participating it is eq. 14's ``(1/K) 1 1^T`` (FedSGD).
    """
    num, count = len(participating), int(participating.sum())
    matrix = np.eye(num)
    if count:
        cols = np.flatnonzero(participating)
        matrix[:, cols] = 0.0
        matrix[np.ix_(cols, cols)] = 1.0 / count
    return matrix


def combine(sampled: np.ndarray, psi: np.ndarray) -> np.ndarray:
    """New models ``w_k = sum_l A_i[l, k] psi_l`` for every agent (rows of ``psi`` are agents).

    Only the non-zero weights are used, so a sparse graph costs ``O(edges x P)``.
    """
    out = np.empty_like(psi)
    for k in range(sampled.shape[1]):
        rows = np.flatnonzero(sampled[:, k])
        out[k] = sampled[rows, k] @ psi[rows]
    return out


def disagreement(models: np.ndarray, chunk: int = 8) -> float:
    """Mean squared distance of the agents' models (rows) to their mean.

    Computed ``chunk`` rows at a time, so the server never holds another copy of
    all the models for it.
    """
    mean = models.mean(axis=0, dtype=np.float64)
    total = 0.0
    for start in range(0, len(models), chunk):
        diff = models[start : start + chunk] - mean
        total += float(np.einsum("ij,ij->", diff, diff))
    return total / len(models)


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
