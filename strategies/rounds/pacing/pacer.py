"""The run's pace, for the round engine: the fleet model, the virtual clock, and what each round or job may count.

:class:`Pacer` is what the round engine asks about time (``schedule.py`` says what each
pace does). On the virtual clock (a simulation, by default) it builds the fleet model once
the preflight has told the partitions and their data, samples only devices that are on,
times every fit instruction when it is sent, drops the instructions of devices that will
leave before they finish (their work is lost; they count as ``clients-left``) and says
which replies a round counts. On the wall clock (a deployment) the fleet is the real one,
and the engine waits with the deadline instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from strategies.contracts.common import FleetSettings, RunSettings
from strategies.rounds.pacing.fleet_model import FleetModel, JobTiming, lognormal_device, lognormal_fleet, read_trace
from strategies.rounds.pacing.participation import Participation
from strategies.rounds.pacing.schedule import WAIT_S, RoundClose, Slots, close_round


def work_steps(config: Mapping[str, object], num_train: int | None) -> int:
    """The local steps a fit config asks for: ``local-steps``, or ``local-epochs`` passes of ``num_train`` examples."""
    epochs = float(config.get("local-epochs", 0) or 0)
    if epochs > 0 and num_train:
        return max(1, math.ceil(epochs * num_train / max(int(config.get("batch-size", 1) or 1), 1)))
    return max(1, int(config.get("local-steps", 1) or 1))


def job_work(config: Mapping[str, object], tensors: list[bytes], num_train: int | None) -> tuple[int, int]:
    """A fit job's local steps and the bytes its model moves each way (the reply is the size of the instruction)."""
    return work_steps(config, num_train), sum(len(t) for t in tensors)


def data_order(train_classes: Mapping[int, Mapping[int, int] | None]) -> list[int]:
    """Partitions by the mean class label of their training data, highest first (``fleet-speed-tie = "data"``).

    Raises
    ------
    ValueError
        When a partition's class counts are unknown (a preflight that did not ask it).

    """
    unknown = sorted(p for p, counts in train_classes.items() if not counts)
    if unknown:
        raise ValueError(f"fleet-speed-tie = \"data\" needs every partition's class counts from the preflight; "
                         f"partitions {unknown[:10]} declared none (set preflight-sample = 0)")  # fmt: skip
    mean = {p: sum(c * n for c, n in counts.items()) / max(sum(counts.values()), 1)
            for p, counts in train_classes.items()}  # fmt: skip
    return sorted(mean, key=lambda p: (-mean[p], p))


class Pacer:
    """A run's pace (see the module's docstring).

    Parameters
    ----------
    fleet
        The ``pace`` and ``fleet-*`` keys.
    run
        The run's keys (its seed, ``fraction-fit``, ``min-fit-clients``).

    """

    def __init__(self, *, fleet: FleetSettings, run: RunSettings) -> None:
        self.settings, self.run = fleet, run
        self.pace = fleet.pace
        self.virtual = False  # set by the engine once it knows its grid (clock = auto)
        self.model: FleetModel | None = None
        self.now = 0.0  # virtual seconds since the run began
        self.participation: Participation | None = None
        self.slots: Slots | None = None
        self.targets: dict[int, int] = {}  # a deadline round's target count, by round

    @property
    def counts_departures(self) -> bool:
        """Whether records count late replies and departures: a pace other than lockstep, or devices that go off."""
        return self.pace != "lockstep" or (self.model is not None and any(
            a.on_share < 1 or a.fixed is not None for a in self.model.availability.values()))  # fmt: skip

    @property
    def wait_s(self) -> float:
        """What a round (or a buffered job) may take: ``deadline``, or :data:`WAIT_S` without one."""
        return self.settings.deadline or WAIT_S

    def start(self, *, virtual: bool, train_classes: Mapping[int, Mapping[int, int] | None]) -> None:
        """The run's partitions (with their declared class counts) are known: build the fleet on the virtual clock."""
        self.virtual = virtual
        partitions = sorted(train_classes)
        if virtual:
            fleet = self.settings
            if fleet.fleet == "trace":
                self.model = read_trace(fleet.fleet_trace, partitions)
            else:
                self.model = lognormal_fleet(partitions, seed=self.run.seed, step_seconds=fleet.fleet_step_seconds,
                                             spread=fleet.fleet_spread, bandwidth=fleet.fleet_bandwidth,
                                             on_seconds=fleet.fleet_on_seconds,
                                             off_seconds=fleet.fleet_off_seconds)  # fmt: skip
            if fleet.fleet_speed_tie == "data":
                self.model.order_by_speed(data_order(train_classes))
        self.participation = Participation(partitions=partitions, correction=self.settings.bias_correction)
        if self.pace == "buffered":
            self.slots = Slots(concurrency=self.concurrency(len(partitions)), seed=self.run.seed, fleet=self.model)

    def concurrency(self, num_partitions: int) -> int:
        """``concurrency``, or the fit sample's size for ``num_partitions`` devices."""
        if self.settings.concurrency:
            return min(self.settings.concurrency, num_partitions)
        return min(max(int(num_partitions * self.run.fraction_fit), self.run.min_fit_clients), num_partitions)

    @property
    def buffer_size(self) -> int:
        """``buffer-size``, or half the concurrency."""
        if self.settings.buffer_size:
            return self.settings.buffer_size
        return max(1, (self.slots.concurrency if self.slots is not None else 2) // 2)

    # ------------------------------------------------------------------ lockstep and deadline rounds

    def available(self, partitions: list[int]) -> list[int]:
        """The partitions that may be sampled now: on the virtual clock, those whose device is on."""
        if self.model is None:
            return partitions
        for partition in partitions:
            self.join(partition)
        return [p for p in partitions if self.model.is_on(p, self.now)]

    def join(self, partition: int) -> None:
        """A partition the fleet model has not seen (a node that connected after the start) joins it.

        Raises
        ------
        ValueError
            On a trace fleet, which must name every partition.

        """
        if self.model is None or partition in self.model.step_seconds:
            return
        if self.settings.fleet == "trace":
            raise ValueError(f"fleet trace {self.settings.fleet_trace} has no row for partition {partition}")
        fleet = self.settings
        self.model.add(partition, **lognormal_device(partition, seed=self.run.seed,
                                                     step_seconds=fleet.fleet_step_seconds, spread=fleet.fleet_spread,
                                                     bandwidth=fleet.fleet_bandwidth, on_seconds=fleet.fleet_on_seconds,
                                                     off_seconds=fleet.fleet_off_seconds))  # fmt: skip

    def over_select(self, server_round: int, chosen: list[int], available: list[int]) -> list[int]:
        """In the deadline pace, ``chosen`` and ``over-selection - 1`` times as many more, drawn from ``available``."""
        if self.pace != "deadline" or not chosen:
            return chosen
        self.targets[server_round] = len(chosen)
        extra = min(math.ceil(len(chosen) * self.settings.over_selection) - len(chosen), len(available) - len(chosen))
        rest = [p for p in available if p not in set(chosen)]
        if extra <= 0 or not rest:
            return chosen
        rng = np.random.default_rng([self.run.seed, server_round, 73])
        return sorted(chosen + [rest[i] for i in rng.choice(len(rest), size=extra, replace=False)])

    def target(self, server_round: int, sent: int) -> int:
        """How many replies close a round that sent ``sent``: all (lockstep) or the target before over-selection."""
        return min(self.targets.get(server_round, sent), sent) if self.pace == "deadline" else sent

    def time_jobs(self, jobs: Mapping[int, tuple[int, int]]) -> dict[int, JobTiming]:
        """Each partition's job (``(steps, bytes)`` each way) timed from now on the virtual clock."""
        return {p: self.model.timing(p, self.now, steps=steps, bytes_down=size, bytes_up=size)
                for p, (steps, size) in jobs.items()}  # fmt: skip

    def close(self, timings: Mapping[int, JobTiming], target: int) -> RoundClose:
        """The round's close on the virtual clock; the clock moves to it."""
        wait = self.settings.deadline or math.inf  # without a deadline no reply is late on the virtual clock
        closed = close_round(dict(timings), target=target, wait_s=wait, opened_at=self.now)
        self.now = closed.closed_at
        return closed
