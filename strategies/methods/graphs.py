"""Graphs of agents for asynchronous diffusion: built by kind or read from an edge list, checked connected (numpy).

Conventions (ALGORITHMS.md section 3): ``adjacency[l, k]`` is True when agent ``l``
is a neighbour of agent ``k``; every agent is its own neighbour and graphs are
undirected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from strategies.contracts.diffusion import GRAPHS

MAX_GRAPH_DRAWS = 1000


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
    return adjacency_of(edge_pairs(path), num_agents, path=path)


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


def edge_pairs(path: str | Path) -> list[tuple[int, int]]:
    """The ``l k`` pairs of an edge list file (0-based agents, ``#`` comments); errors name the file and line."""
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
