"""FATHOM's stationarity test (the decay): does the recent hypergradient ``H`` still show progress? (pure numpy).

``H = -cos(Delta_t, Delta_sm)`` is negative while consecutive global updates agree; the
tuner decays its step sizes once a window of ``H`` no longer shows progress
(``strategies/tuning/fathom_math.py``), and doubles the window after each decay.
"""

from __future__ import annotations

import math

import numpy as np

DECAY_Z = 2.0  # progress must be 2 standard errors clear of none; a window of zero-mean noise nearly always decays


def t_statistic(recent_h: np.ndarray) -> float | None:
    """The one-sample t statistic of ``recent_h`` against 0; ``None`` under two values.

    Identical values give ``+-inf`` by their sign (0 when they are all 0): no spread, so any
    nonzero mean is as clear as it gets.
    """
    values = np.asarray(recent_h, dtype=np.float64)
    if values.size < 2:
        return None
    mean, spread = float(values.mean()), float(values.std(ddof=1))
    if spread == 0:
        return math.copysign(math.inf, mean) if mean != 0 else 0.0
    return mean / (spread / math.sqrt(values.size))


def stationary(recent_h: np.ndarray, z: float = DECAY_Z) -> bool:
    """Whether ``recent_h`` shows no progress: its mean is not below 0 by ``z`` standard errors or more.

    ``H = -cos(Delta_t, Delta_sm)`` is negative while consecutive global updates agree, so
    progress is a mean ``H`` clearly below 0; the test is one-sided on the t statistic.
    """
    t = t_statistic(recent_h)
    return t is not None and t > -z


def overshooting(recent_h: np.ndarray, z: float = DECAY_Z) -> bool:
    """Whether ``recent_h`` says the step is too large: its mean is above 0 by more than ``z`` standard errors.

    ``H`` is positive while consecutive global updates point against each other, as an
    oversized step's do across a valley; the test is one-sided on the t statistic.
    """
    t = t_statistic(recent_h)
    return t is not None and t > z


def decay_window(window: int, decays: int) -> int:
    """How many values of ``H`` the test needs after ``decays`` decays: ``window * 2**decays``."""
    return window * 2**decays
