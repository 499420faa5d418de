"""Who trains when: a round's close on the virtual clock, and the buffered mode's slots (pure numpy).

Three paces (the ``pace`` key):

- ``lockstep``: a round sends its fit to the sampled devices and waits for every reply, up
  to ``deadline`` seconds (:data:`WAIT_S` when 0); a device that leaves costs the wait.
- ``deadline`` (Bonawitz et al., MLSys 2019): the round samples ``over-selection`` times its
  target and closes at the target's count of replies or at the deadline, whichever is
  first; later replies are discarded and counted.
- ``buffered`` (FedBuff): ``concurrency`` devices train at once; each reply goes to a
  buffer, every ``buffer-size`` replies make one server update, and a freed slot is given
  at once, with the newest model, to a device drawn from those idle and on.

On the virtual clock a job's end is known when it is sent (``fleet_model.JobTiming``), so
:func:`close_round` and :class:`Slots` decide from the fleet model alone, in an order that
no thread's timing can change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from strategies.rounds.pacing.fleet_model import FleetModel, JobTiming

WAIT_S = 3600.0  # what a phase waits without a deadline (a device that hangs holds a lockstep round this long)


@dataclass(frozen=True)
class RoundClose:
    """A round on the virtual clock: when it closed, whose replies count, whose came late, who left."""

    closed_at: float
    on_time: tuple[int, ...]
    late: tuple[int, ...]
    left: tuple[int, ...]


def close_round(timings: dict[int, JobTiming], *, target: int, wait_s: float, opened_at: float) -> RoundClose:
    """The round closes at the ``target``-th completion or at ``opened_at + wait_s``, whichever is first.

    Completions are ordered by ``(done_at, partition)``; a job whose device leaves never
    completes. ``target`` = every job sent is lockstep; fewer, with over-selection, is the
    deadline mode. Without a deadline (``wait_s`` infinite) no reply is late, and a round
    short of its target because a device left waits :data:`WAIT_S` for it, as a phase
    without a deadline waits on a deployment.
    """
    limit = opened_at + wait_s
    done = sorted((t.done_at, p) for p, t in timings.items() if t.left_at is None and t.done_at <= limit)
    left = tuple(sorted(p for p, t in timings.items() if t.left_at is not None))
    if len(done) >= target > 0:
        closed_at = done[target - 1][0]
        on_time = tuple(sorted(p for _, p in done[:target]))
    else:
        on_time = tuple(sorted(p for _, p in done))
        last = max((d for d, _ in done), default=opened_at)
        if math.isinf(limit):
            closed_at = max(last, opened_at + WAIT_S) if left else last
        else:
            closed_at = limit if (left or len(done) < len(timings)) else last
    late = tuple(sorted(p for p in timings if p not in on_time and p not in left))
    return RoundClose(closed_at, on_time, late, left)


@dataclass
class Job:
    """One fit instruction in flight: its number, device, the server update it started from and its times."""

    number: int
    partition: int
    version: int
    timing: JobTiming
    sent: list[np.ndarray] = field(default_factory=list, repr=False)  # the model arrays it was sent

    @property
    def leaves(self) -> bool:
        return self.timing.left_at is not None


class Slots:
    """The buffered mode's ``concurrency`` slots on a clock (see the module's docstring).

    Parameters
    ----------
    concurrency
        Devices training at once.
    seed
        Seeds the draw of the device a freed slot goes to.
    fleet
        The fleet model of a virtual clock, or ``None`` on the wall clock (every device
        connected counts as on).

    """

    def __init__(self, *, concurrency: int, seed: int, fleet: FleetModel | None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency, self.fleet = concurrency, fleet
        self.rng = np.random.default_rng([seed, 72])
        self.now = 0.0
        self.in_flight: dict[int, Job] = {}  # by job number
        self.jobs = 0  # jobs started so far: the next one's number

    @property
    def busy(self) -> set[int]:
        return {job.partition for job in self.in_flight.values()}

    def idle(self, connected: list[int]) -> list[int]:
        """The connected devices not training now and (on the virtual clock) on now."""
        busy = self.busy
        return [p for p in sorted(connected)
                if p not in busy and (self.fleet is None or self.fleet.is_on(p, self.now))]  # fmt: skip

    def draw(self, connected: list[int]) -> list[int]:
        """The devices the free slots go to now: drawn uniformly from :meth:`idle`, as many as slots are free."""
        free = self.concurrency - len(self.in_flight)
        candidates = self.idle(connected)
        if free <= 0 or not candidates:
            return []
        picks = self.rng.choice(len(candidates), size=min(free, len(candidates)), replace=False)
        return [candidates[i] for i in sorted(picks)]

    def start(self, partition: int, version: int, *, steps: int, bytes_down: int, bytes_up: int,
              sent: list[np.ndarray]) -> Job:  # fmt: skip
        """A job for ``partition`` from server update ``version``, timed by the fleet model (virtual clock)."""
        if self.fleet is not None:
            timing = self.fleet.timing(partition, self.now, steps=steps, bytes_down=bytes_down, bytes_up=bytes_up)
        else:
            timing = JobTiming(self.now, math.inf)
        self.jobs += 1
        job = Job(self.jobs, partition, version, timing, sent)
        self.in_flight[job.number] = job
        return job

    def next_job(self) -> Job | None:
        """The in-flight job that ends first on the virtual clock (``None``: none in flight)."""
        if not self.in_flight:
            return None
        return min(self.in_flight.values(), key=lambda job: (job.timing.ends_at, job.number))

    def finish(self, job: Job) -> None:
        """``job`` ended (a reply, a failure or a departure); the clock moves to its end on the virtual clock."""
        del self.in_flight[job.number]
        if self.fleet is not None:
            self.now = max(self.now, job.timing.ends_at)

    def cancel(self, job: Job) -> None:
        """``job`` is no longer awaited (the run ends); the clock stays where it is."""
        self.in_flight.pop(job.number, None)

    def next_return(self, connected: list[int]) -> float:
        """When a free slot could next be filled by a device coming on (``inf``: no free slot, or never).

        On the wall clock every connected device counts as on, so this is ``inf``.
        """
        if self.fleet is None or len(self.in_flight) >= self.concurrency:
            return math.inf
        busy = self.busy
        return min((self.fleet.availability[p].next_on(self.now) for p in connected if p not in busy),
                   default=math.inf)  # fmt: skip

    def upcoming(self, connected: list[int]) -> Job | None:
        """The next job to end, after moving the virtual clock to any device return before it.

        Returns ``None`` when a device comes on first (the clock is then at its return: draw
        again), or when nothing will ever happen again (no job in flight, no device to come).
        """
        job = self.next_job()
        returns = self.next_return(connected)
        if returns < (job.timing.ends_at if job is not None else math.inf):
            self.now = max(self.now, returns)
            return None
        return job
