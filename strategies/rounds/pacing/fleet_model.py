"""A simulated fleet: each device's compute speed, link and availability, seeded or read from a trace (pure numpy).

A device ``k`` takes ``step_seconds[k]`` per local step, moves ``bandwidth[k]`` bytes per
second each way, and is on only inside its availability windows. A job sent at ``t``
(download ``bytes_down``, ``steps`` local steps, upload ``bytes_up``) ends at
``t + bytes_down / bandwidth + steps * step_seconds + bytes_up / bandwidth``, unless the
device's window closes first: the device then leaves, its work is lost, at the window's end.
Both times are known when the job is sent, which is what lets the server order replies by
virtual completion time (``clock.py``): a simulated run does not depend on Ray's
scheduling nor on this machine's speed, and one seed gives one run.

The default fleet (:func:`lognormal_fleet`) draws speeds from a log-normal whose p90/p10
ratio is ``spread`` (tenfold by default, phones and boards: FedScale, Lai et al., ICML 2022)
and on/off periods from exponentials. :func:`read_trace` reads the same from a CSV.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

Z90 = 1.2815515655446004  # the standard normal's 90th percentile: p90 / p10 = exp(2 * Z90 * sigma)
TRACE_COLUMNS = ("partition", "step-seconds", "bandwidth", "windows")


@dataclass
class Availability:
    """When a device is on: windows ``[start, end)`` in virtual seconds, drawn lazily as the clock needs them.

    ``on_seconds`` and ``off_seconds`` are the means of exponential on and off periods
    (``off_seconds`` 0: always on); ``fixed`` windows (a trace's) replace the draws.
    """

    on_seconds: float = math.inf
    off_seconds: float = 0.0
    seed: tuple[int, ...] = (0,)
    fixed: tuple[tuple[float, float], ...] | None = None
    windows: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(list(self.seed))
        if self.fixed is not None:
            self.windows = sorted(self.fixed)
        elif self.off_seconds <= 0 or math.isinf(self.on_seconds):
            self.windows = [(0.0, math.inf)]
        else:  # a device starts on or off as the long-run shares say
            start = 0.0 if self._rng.random() < self.on_share else self._rng.exponential(self.off_seconds)
            self.windows = [(start, start + self._rng.exponential(self.on_seconds))]

    @property
    def on_share(self) -> float:
        """The long-run share of time the device is on."""
        if self.off_seconds <= 0 or math.isinf(self.on_seconds):
            return 1.0
        return self.on_seconds / (self.on_seconds + self.off_seconds)

    def _extend(self, t: float) -> None:
        while self.fixed is None and self.windows[-1][1] <= t:
            end = self.windows[-1][1]
            start = end + self._rng.exponential(self.off_seconds)
            self.windows.append((start, start + self._rng.exponential(self.on_seconds)))

    def window_at(self, t: float) -> tuple[float, float] | None:
        """The on-window holding ``t``, or ``None`` while the device is off."""
        self._extend(t)
        i = bisect.bisect_right(self.windows, (t, math.inf)) - 1  # the last window starting at or before t
        if i >= 0 and t < self.windows[i][1]:
            return self.windows[i]
        return None

    def next_on(self, t: float) -> float:
        """The first time at or after ``t`` the device is on (``inf``: never again)."""
        if (window := self.window_at(t)) is not None:
            return t if window[0] <= t else window[0]
        i = bisect.bisect_right(self.windows, (t, math.inf))  # the first window starting after t
        return self.windows[i][0] if i < len(self.windows) else math.inf


@dataclass(frozen=True)
class JobTiming:
    """A job's virtual times: ``done_at`` if it finishes, or ``left_at`` when the device leaves first."""

    sent_at: float
    done_at: float
    left_at: float | None = None

    @property
    def ends_at(self) -> float:
        """When its slot frees: the reply's arrival, or the device's departure."""
        return self.done_at if self.left_at is None else self.left_at


class FleetModel:
    """Every device's speed, link and availability (see the module's docstring).

    Parameters
    ----------
    step_seconds, bandwidth
        Per partition: seconds per local step, bytes per second each way.
    availability
        Per partition: its :class:`Availability`.

    """

    def __init__(self, *, step_seconds: dict[int, float], bandwidth: dict[int, float],
                 availability: dict[int, Availability]) -> None:  # fmt: skip
        if not step_seconds.keys() == bandwidth.keys() == availability.keys():
            raise ValueError("fleet model: step_seconds, bandwidth and availability must name the same partitions")
        if any(not (s > 0 and math.isfinite(s)) for s in step_seconds.values()):
            raise ValueError("fleet model: every step time must be a positive number of seconds")
        if any(not b > 0 for b in bandwidth.values()):
            raise ValueError("fleet model: every bandwidth must be a positive number of bytes per second")
        self.step_seconds, self.bandwidth, self.availability = step_seconds, bandwidth, availability

    def add(self, partition: int, *, step_seconds: float, bandwidth: float, availability: Availability) -> None:
        """A device that joined the fleet."""
        if not (step_seconds > 0 and math.isfinite(step_seconds)) or not bandwidth > 0:
            raise ValueError(f"fleet model: partition {partition} needs a positive step time and bandwidth")
        self.step_seconds[partition], self.bandwidth[partition] = step_seconds, bandwidth
        self.availability[partition] = availability

    @property
    def partitions(self) -> list[int]:
        return sorted(self.step_seconds)

    def is_on(self, partition: int, t: float) -> bool:
        return self.availability[partition].window_at(t) is not None

    def timing(self, partition: int, sent_at: float, *, steps: int, bytes_down: int, bytes_up: int) -> JobTiming:
        """When a job sent to ``partition`` at ``sent_at`` ends (``ValueError`` if the device is off then)."""
        window = self.availability[partition].window_at(sent_at)
        if window is None:
            raise ValueError(f"fleet model: partition {partition} is off at {sent_at:.3f} s; no job can start")
        seconds = (bytes_down + bytes_up) / self.bandwidth[partition] + steps * self.step_seconds[partition]
        done_at = sent_at + seconds
        return JobTiming(sent_at, done_at, window[1] if window[1] < done_at else None)

    def order_by_speed(self, order: list[int]) -> None:
        """Give the slowest step times to the partitions first in ``order`` (speed tied to data), keeping the draws."""
        if sorted(order) != self.partitions:
            raise ValueError("fleet model: the order must name every partition once")
        times = sorted(self.step_seconds.values(), reverse=True)
        self.step_seconds = {p: times[i] for i, p in enumerate(order)}


def lognormal_fleet(partitions: list[int], *, seed: int, step_seconds: float, spread: float, bandwidth: float,
                    on_seconds: float, off_seconds: float) -> FleetModel:  # fmt: skip
    """Log-normal step times (median ``step_seconds``, p90/p10 = ``spread``), one link speed, exponential on/off.

    Parameters
    ----------
    partitions
        The devices.
    seed
        The run's seed: the same seed gives the same fleet.
    step_seconds
        The median device's seconds per local step.
    spread
        The ratio of the 90th to the 10th percentile of the step times (1: all equal).
    bandwidth
        Bytes per second, each way, for every device.
    on_seconds, off_seconds
        Mean on and off periods (``off_seconds`` 0: always on).

    """
    fleet = FleetModel(step_seconds={}, bandwidth={}, availability={})
    for partition in partitions:
        fleet.add(partition, **lognormal_device(partition, seed=seed, step_seconds=step_seconds, spread=spread,
                                                bandwidth=bandwidth, on_seconds=on_seconds,
                                                off_seconds=off_seconds))  # fmt: skip
    return fleet


def lognormal_device(partition: int, *, seed: int, step_seconds: float, spread: float, bandwidth: float,
                     on_seconds: float, off_seconds: float) -> dict[str, object]:  # fmt: skip
    """One device of :func:`lognormal_fleet`, drawn from ``(seed, partition)`` alone.

    A device that joins late is then the device it would have been from the start.
    """
    sigma = math.log(spread) / (2 * Z90) if spread > 1 else 0.0
    step = step_seconds * math.exp(sigma * np.random.default_rng([seed, 70, partition]).standard_normal())
    return {"step_seconds": float(step), "bandwidth": float(bandwidth),
            "availability": Availability(on_seconds=on_seconds, off_seconds=off_seconds, seed=(seed, 71, partition))}


def read_trace(path: str | Path, partitions: list[int]) -> FleetModel:
    """A fleet from a CSV with one row per partition: ``partition,step-seconds,bandwidth,windows``.

    ``windows`` is empty (always on) or ``start-end`` pairs in seconds separated by ``;``
    (``0-600;900-1800``). Every partition of the run must have a row.

    Raises
    ------
    ValueError
        Naming the file, the row and the column that cannot be used.

    """
    step_seconds, bandwidth, availability = {}, {}, {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or tuple(reader.fieldnames[:4]) != TRACE_COLUMNS:
            raise ValueError(f"fleet trace {path}: the header must be {','.join(TRACE_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            try:
                partition = int(row["partition"])
                step_seconds[partition] = float(row["step-seconds"])
                bandwidth[partition] = float(row["bandwidth"])
                windows = tuple(_window(w) for w in (row["windows"] or "").split(";") if w.strip())
            except (TypeError, ValueError) as err:
                raise ValueError(f"fleet trace {path}, line {line}: {err}") from err
            availability[partition] = Availability(fixed=windows or None)
    missing = sorted(set(partitions) - set(step_seconds))
    if missing:
        raise ValueError(f"fleet trace {path}: no row for partitions {missing[:10]}")
    keep = set(partitions)
    return FleetModel(step_seconds={p: s for p, s in step_seconds.items() if p in keep},
                      bandwidth={p: b for p, b in bandwidth.items() if p in keep},
                      availability={p: a for p, a in availability.items() if p in keep})  # fmt: skip


def _window(text: str) -> tuple[float, float]:
    start, _, end = text.strip().partition("-")
    window = (float(start), float(end))
    if not 0 <= window[0] < window[1]:
        raise ValueError(f"window {text.strip()!r} must be start-end with 0 <= start < end")
    return window
