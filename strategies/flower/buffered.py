"""The buffered pace on Flower's grid: ``concurrency`` devices train at once, every B replies one server update.

:func:`play_buffered` plays a run whose ``pace`` is ``buffered`` (FedBuff, Nguyen et al.,
AISTATS 2022; B = 1 is FedAsync): slots are filled from the idle devices (on the virtual
clock, those on), each job is one ``train`` message carrying the newest model, and each
reply, read as it comes, waits in a buffer; every ``buffer-size`` replies the method
combines them (``RoundPhases.take_fit``), each rebased onto the newest model with its
staleness weight (``strategies/rounds/pacing/staleness.py``), and the update is closed as a
round is: its record (with the replies' staleness), the server's test, the clients'
evaluation when due (only idle devices are asked: a training device would queue it), its
checkpoint and the divergence watch. A device whose reply waits in the buffer gets no new
job until the update. On the virtual clock the replies are taken in the order of their
virtual ends, whenever Ray delivers them; on the wall clock, as they come, and a job not
back within ``deadline`` seconds frees its slot (its device counts as left).
"""

from __future__ import annotations

import json
import math
import time
from logging import INFO, WARNING
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Message, MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid

from strategies.base import FederatedStrategy
from strategies.flower.messages import instruction_messages
from strategies.nodes.failures import NodeFailureError
from strategies.nodes.preflight import connected
from strategies.rounds.pacing.pacer import job_work
from strategies.rounds.pacing.schedule import Job
from strategies.rounds.pacing.staleness import staleness_weight
from strategies.screening.replies import Received

if TYPE_CHECKING:  # the engine imports this module
    from strategies.flower.rounds import Rounds

PARTICIPATION_FILE = "participation.json"


def start_pacer(method: FederatedStrategy, *, virtual: bool) -> None:
    """Start the run's pace on its admitted partitions; a resumed run's virtual clock goes on from its checkpoint."""
    nodes = method.nodes
    classes = {nodes.partition_of(node): nodes.declared(node).train_classes for node in nodes.properties}
    method.phases.pacer.start(virtual=virtual, train_classes=classes)
    if method.history:
        pacer = method.phases.pacer
        pacer.now = float(method.history[-1].get("virtual-seconds", 0.0))
        if pacer.slots is not None:  # the clock and the job numbers (the clients' seeds) go on from the checkpoint
            pacer.slots.now = pacer.now
            pacer.slots.jobs = sum(int(r.get("clients-sampled", 0)) + int(r.get("clients-failed", 0))
                                   + int(r.get("clients-left", 0)) for r in method.history)  # fmt: skip


class _IdleFleet:
    """The run's fleet less the nodes now training: an evaluation between updates asks only idle devices."""

    def __init__(self, fleet, busy: set[str]) -> None:  # noqa: ANN001 - a strategies.nodes.preflight.Fleet
        self.fleet, self.busy = fleet, busy

    def node_ids(self) -> list[str]:
        return [n for n in self.fleet.node_ids() if n not in self.busy]

    def wait_for(self, count: int, timeout: float) -> bool:
        return self.fleet.wait_for(count, timeout)

    def ask(self, cids, config, reply_s):  # noqa: ANN001, ANN201 - as Fleet.ask
        return self.fleet.ask(cids, config, reply_s)


class BufferedPlay:
    """One buffered run on ``grid`` (see the module's docstring); :meth:`play` runs it."""

    def __init__(self, rounds: Rounds, grid: Grid, train_config: ConfigRecord, evaluate_config: ConfigRecord) -> None:
        self.rounds, self.grid = rounds, grid
        self.method, self.phases = rounds.method, rounds.phases
        self.pacer = self.phases.pacer
        self.slots = self.pacer.slots
        self.train_config, self.evaluate_config = train_config, evaluate_config
        self.interval = getattr(grid, "interval", rounds.pull_interval)
        self.started_at = time.monotonic()
        self.pending: dict[str, tuple[Job, Message]] = {}  # message id -> its job and message
        self.arrived: dict[str, Message] = {}
        self.buffer: list[tuple[Job, Received]] = []
        self.failures: list[NodeFailureError] = []
        self.left = 0
        self.lost_in_row = 0  # jobs lost (departed or past the deadline) since the last reply that came

    def play(self, num_updates: int) -> None:
        version, last = self.rounds.offset, self.rounds.offset + num_updates
        fleet = self.rounds.started(self.grid)
        nodes = connected(self.method.nodes, fleet)
        self.pacer.available(list(nodes))  # a node the fleet model has not seen joins it
        log(INFO, "stamen: buffered pace: %d devices train at once, an update every %d replies (%s clock)",
            self.slots.concurrency, self.pacer.buffer_size, "virtual" if self.pacer.virtual else "wall")  # fmt: skip
        while version < last:
            waiting = {job.partition for job, _ in self.buffer}
            for partition in self.slots.draw([p for p in nodes if p not in waiting]):
                self._dispatch(partition, nodes[partition], version)
            job = self._next(nodes, waiting)
            if job is None:
                continue
            if len(self.buffer) >= self.pacer.buffer_size:
                version += 1
                self._update(version, last)
                nodes = connected(self.method.nodes, fleet)  # nodes come and go between updates
                self.pacer.available(list(nodes))
        self._drop_in_flight()

    def _dispatch(self, partition: int, node: str, version: int) -> None:
        if not self.pacer.virtual:
            self.slots.now = time.monotonic() - self.started_at
        config = {**self.method.fit_config(version + 1), "server-round": self.slots.jobs + 1}  # seeds the job's batches
        instruction = self.phases._instruction(node, partition, "fit", config)
        sent = list(self.method.parameters_for(partition, "fit"))
        steps, size = job_work(config, instruction.tensors, self.method.nodes.declared(node).num_train)
        job = self.slots.start(partition, version, steps=steps, bytes_down=size, bytes_up=size, sent=sent)
        if job.leaves:  # on the virtual clock: the device goes off before it finishes; its work would be lost
            return
        message = instruction_messages([instruction], dict(self.train_config), kind=MessageType.TRAIN,
                                       group=str(job.number), names=self.method.sent_names,
                                       shadowed=self.rounds._shadowed)[0]  # fmt: skip
        (message_id,) = self.grid.push_messages([message])
        self.pending[message_id] = (job, message)

    def _next(self, nodes: dict[int, str], waiting: set[int]) -> Job | None:
        """The next job to end, read into the buffer or the failures; ``None`` when only the clock moved."""
        if self.pacer.virtual:
            job = self.slots.upcoming([p for p in nodes if p not in waiting])
            if job is None:
                if not self.slots.in_flight and math.isinf(self.slots.next_return(list(nodes))):
                    raise RuntimeError("buffered pace: no device is training and none will come on again")
                return None
            if job.leaves:
                self.slots.finish(job)
                self._lost()
                return None
            message_id = next(i for i, (j, _) in self.pending.items() if j is job)
            self._pull_until(lambda: message_id in self.arrived, self.rounds.timeout)
        else:
            message_id = self._pull_until(lambda: next(iter(self.arrived), None), self.interval * 20)
            if message_id is None:
                self._expire()
                return None
        job, message = self.pending.pop(message_id)
        self.slots.finish(job)
        self.lost_in_row = 0
        reply = self.arrived.pop(message_id, None)
        results, failures = self.rounds.read([reply] if reply is not None else [], [message], fit=True)
        self.failures.extend(failures)
        self.buffer.extend((job, result) for result in results)
        return job

    def _pull_until(self, ready, timeout: float):  # noqa: ANN001, ANN202 - a predicate, and what it returns
        """Pull the pending replies every pull interval until ``ready()`` is truthy or ``timeout`` s pass."""
        give_up = time.monotonic() + timeout
        while not (found := ready()) and time.monotonic() < give_up:
            awaited = [i for i in self.pending if i not in self.arrived]
            for reply in self.grid.pull_messages(awaited) if awaited else []:
                self.arrived[reply.metadata.reply_to_message_id] = reply
            if not (found := ready()):
                time.sleep(self.interval)
        return found

    def _expire(self) -> None:
        """On the wall clock: jobs out longer than the deadline free their slots; their devices count as left."""
        now = time.monotonic() - self.started_at
        for message_id, (job, _) in list(self.pending.items()):
            if now - job.timing.sent_at > self.pacer.wait_s:
                del self.pending[message_id]
                self.slots.finish(job)
                self._lost()
                log(WARNING, "buffered pace: partition %s did not answer within %g s; its slot goes to another device",
                    job.partition, self.pacer.wait_s)  # fmt: skip

    def _lost(self) -> None:
        """A job lost; when every slot's last jobs were, the run cannot progress and stops, saying why.

        Raises
        ------
        RuntimeError
            After ``4 x concurrency`` jobs in a row lost (a deadline shorter than the work, or
            devices that never stay on long enough).

        """
        self.left += 1
        self.lost_in_row += 1
        if self.lost_in_row >= 4 * self.slots.concurrency:
            raise RuntimeError(f"buffered pace: the last {self.lost_in_row} jobs were all lost (their devices left, "
                               f"or they took longer than deadline = {self.pacer.wait_s:g} s) and none came back; "
                               "raise deadline, or lower local-steps")  # fmt: skip

    def _update(self, version: int, last: int) -> None:
        """One server update from the buffer, closed as a round is (see the module's docstring)."""
        buffer, self.buffer = self.buffer, []
        participation = self.pacer.participation
        record = self.phases.round_of(version).record
        record.update({f"hp-{k}": v for k, v in self.method.fit_config(version).items() if k != "server-round"})
        taus = [version - 1 - job.version for job, _ in buffer]
        stale = {}
        for (job, _), tau in zip(buffer, taus, strict=True):
            own = self.method.contract.asynchronous == "own"  # an agent's model changed only with its own replies
            weight = staleness_weight(0 if own else tau, self.pacer.settings.staleness)
            scale = self.pacer.settings.server_lr * weight * participation.weight(job.partition)
            stale[job.partition] = (job.sent, scale)
            participation.add(job.partition, tau, weight=weight)
        record.update({"clients-sampled": len(buffer), "fit-partitions": sorted(job.partition for job, _ in buffer),
                       "staleness-mean": sum(taus) / len(taus), "staleness-max": max(taus),
                       "clients-left": self.left, "virtual-seconds": round(self.slots.now, 6)})  # fmt: skip
        failures, self.failures, self.left = self.failures, [], 0
        self.phases.take_fit(version, [received for _, received in buffer], failures, stale=stale)
        self.phases.central_test(version)
        if version == last:
            self._drop_in_flight()  # the run ends: every device is idle for the last evaluation
        self._evaluate(version)
        self.method.recorder.save_text(PARTICIPATION_FILE, json.dumps(participation.report(), indent=1))
        self.method.end_round(version)

    def _evaluate(self, version: int) -> None:
        training = {job.partition for job, _ in self.pending.values()}
        busy = {node for node in self.method.nodes.properties if self.method.nodes.partition_of(node) in training}
        instructions = self.phases.evaluate_instructions(version, _IdleFleet(self.rounds.fleet, busy))
        if not instructions:
            return
        messages = instruction_messages(instructions, dict(self.evaluate_config), kind=MessageType.EVALUATE,
                                        group=f"evaluate-{version}", names=self.method.sent_names,
                                        shadowed=self.rounds._shadowed)  # fmt: skip
        replies = list(self.grid.send_and_receive(messages, timeout=self.rounds.timeout))
        results, failures = self.rounds.read(replies, messages, fit=False)
        self.phases.take_evaluation(version, results, failures)

    def _drop_in_flight(self) -> None:
        for job, _ in self.pending.values():
            self.slots.cancel(job)
        self.pending.clear()
        self.arrived.clear()


def play_buffered(rounds: Rounds, grid: Grid, num_updates: int, train_config: ConfigRecord,
                  evaluate_config: ConfigRecord) -> None:  # fmt: skip
    """Play ``num_updates`` buffered server updates on ``grid`` (see the module's docstring)."""
    BufferedPlay(rounds, grid, train_config, evaluate_config).play(num_updates)
