"""Combination matrices for asynchronous diffusion: by rule or from a file, checked, and each iteration's draw (numpy).

Conventions (ALGORITHMS.md section 3): a combination matrix ``A`` is left-stochastic:
``A[l, k]`` is the weight agent ``k`` gives to agent ``l``, each column sums to 1, and
``A[l, k] = 0`` off the graph (:mod:`strategies.methods.graphs`). Agent ``k``'s new model is
``sum_l A[l, k] psi_l``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from strategies.contracts.diffusion import COMBINATIONS

STOCHASTIC_TOL = 1e-9


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
