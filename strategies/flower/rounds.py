"""The round engine: one Flower Message API ``Strategy`` that plays a stamen run, for every method.

:class:`Rounds` plays a run on Flower's grid: the preflight (a ``query`` message per node),
then each round's ``train`` messages, the screened replies combined into the global model,
the server's own test, the ``evaluate`` messages and the round's record, checkpoint and
divergence watch. The maths and the run's bookkeeping are the method's (a
:class:`strategies.base.FederatedStrategy`: its hooks and members) and its round phases
(:class:`strategies.rounds.phases.RoundPhases`); this class reads Flower's messages into
them and writes their instructions back as messages. A run resumed from a checkpoint
starts after the checkpoint's round: Flower's loop counts its rounds from 1, the records
and the clients' seeds keep the run's own numbers.

Flower 1.42's ``Strategy.start`` has no way to stop a run early nor to close a round after
its evaluation, which stamen's record needs; :meth:`Rounds.start` therefore plays the rounds
itself (fit, the server's test, the clients' evaluation, then the round's record), calling
the four Message API methods a subclass or a wrapper may override.

On a grid that runs each node's messages in the order they were pushed (Flower's deployed
grid), lockstep round r+1's fit goes out with round r's evaluation (``overlap-rounds``):
a SuperNode that has answered the evaluation finds the fit waiting instead of sleeping 3 s;
the records and model are the same (``FederatedStrategy.can_overlap`` says when allowed).
Deadline rounds are timed by ``pacing.py``; the buffered pace is ``buffered.py``'s (docs/fleets.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies.base import FederatedStrategy
from strategies.contracts.common import PULL_INTERVAL
from strategies.flower.buffered import play_buffered, start_pacer
from strategies.flower.codec import MODEL_RECORD, array_records, check_like, metric_record, same_arrays
from strategies.flower.fleet import GridFleet
from strategies.flower.messages import instruction_messages, read_replies
from strategies.flower.paced_grid import PacedGrid, Pending, is_deployed, paced_run
from strategies.flower.pacing import counted_replies, timed_instructions
from strategies.nodes.failures import NodeFailureError
from strategies.rounds.checkpoint import Checkpoint
from strategies.rounds.pacing.fleet_model import JobTiming
from strategies.rounds.phases import Instruction
from strategies.rounds.run_watch import RunDivergedError
from strategies.screening.replies import Evaluation, Received


class Rounds(Strategy):
    """A stamen method's run on Flower's Message API (see the module's docstring).

    Parameters
    ----------
    method
        The method: its settings, hooks and members (``app.server_run.run_method`` builds it
        from a run config, with its results folder and initial model).
    checkpoint
        Continue the run after this checkpoint's round (restored after the preflight and
        the method's own start-up), or ``None``.
    pull_interval
        Seconds between two pulls of the replies in :meth:`start` (``strategies/flower/paced_grid.py``).
    overlap_rounds
        Send round r+1's fit with round r's evaluation where the grid allows (the module's docstring).

    """

    def __init__(self, *, method: FederatedStrategy, checkpoint: Checkpoint | None = None,
                 pull_interval: float = PULL_INTERVAL, overlap_rounds: bool = True) -> None:  # fmt: skip
        self.offset = checkpoint.round if checkpoint is not None else 0
        if self.offset >= method.num_rounds:
            raise ValueError(f"num-server-rounds = {method.num_rounds} must exceed the checkpoint's round "
                             f"{self.offset}")
        self.method = method
        self.phases = method.phases
        self.checkpoint = checkpoint
        self.num_rounds = method.num_rounds - self.offset  # the rounds left to play
        self.pull_interval = pull_interval
        self.overlap_rounds = overlap_rounds
        self.timeout = method.phases.pacer.wait_s  # seconds a phase waits for its replies (the deadline key)
        self.fleet: GridFleet | None = None  # the grid's nodes, once the run has started on them
        # each phase's messages by (round, message type), until its replies are read (Flower sets their ids on sending)
        self._sent: dict[tuple[int, str], list[Message]] = {}
        self._shadowed: set[str] = set()  # train_config keys already reported as set over stamen's own
        self._handed: ArrayRecord | None = None  # the global model as last handed to Flower's loop
        self._timings: dict[int, dict[int, JobTiming]] = {}  # on the virtual clock: each fit's job times, by round

    def __repr__(self) -> str:
        after = f", after round {self.offset}" if self.offset else ""
        return f"Rounds({self.method!r}{after})"

    @property
    def record(self) -> dict:
        """The record of the round begun last (read it; the round writes it)."""
        return self.phases.record

    @property
    def global_arrays(self) -> ArrayRecord:
        """The global model stamen holds, keyed by ``state_dict`` names (before round 1: the run's initial model).

        Pass it as ``initial_arrays`` to a wrapper's ``start`` (Flower's requires one).
        """
        return array_records(self.method.model.tensors, None, self.method.model_names)[MODEL_RECORD]

    def summary(self) -> None:
        log(INFO, "\t%r, %d round(s), on Flower's Message API", self, self.num_rounds)

    # ------------------------------------------------------------------ Flower's Message API

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One ``train`` message per sampled node: its array sets (named ArrayRecords) and its config.

        The first call starts the run (the preflight). ``arrays`` other than the model this
        strategy last returned (``initial_arrays``, or a wrapper's noised aggregate) become
        the global model first. Keys of ``config`` travel too; one that stamen also sends
        overrides stamen's value and is logged once (the round's record keeps stamen's).
        """
        fleet = self.started(grid)
        if arrays is not self._handed and len(arrays) and not same_arrays(arrays, self.global_arrays):
            log(INFO, "stamen: round %s starts from the arrays given to configure_train, not the model stamen holds",
                server_round)  # fmt: skip
            self.method.adopt_model([a.numpy() for a in arrays.values()])
        instructions = self.phases.fit_instructions(server_round + self.offset, fleet)
        instructions, self._timings[server_round] = timed_instructions(  # the pace's: who will leave, when each ends
            self.phases.pacer, self.method.nodes, instructions, self.phases.round_of(server_round + self.offset).record)
        return self._messages(server_round, instructions, config, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The method's combination of the screened replies; then the server's own test (``central-eval``)."""
        replies, sent = counted_replies(self.phases.pacer, self.method.nodes, server_round + self.offset, list(replies),
                                        self._sent.pop((server_round, MessageType.TRAIN), []),
                                        self._timings.pop(server_round, {}),
                                        self.phases.round_of(server_round + self.offset).record)  # fmt: skip
        results, failures = self.read(replies, sent, fit=True)
        changed, metrics = self.phases.take_fit(server_round + self.offset, results, failures)
        self.phases.central_test(server_round + self.offset)
        self._handed = self.global_arrays
        return (self._handed if changed else None), metric_record(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        instructions = self.phases.evaluate_instructions(server_round + self.offset, self.started(grid))
        return self._messages(server_round, instructions, config, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The clients' evaluation, then the round closed: its record, checkpoint and divergence watch.

        Raises
        ------
        RunDivergedError
            When the run is to stop (its summary already says why); :meth:`start` ends the run on it.

        """
        results, failures = self.read(replies, self._sent.pop((server_round, MessageType.EVALUATE), []), fit=False)
        metrics = None
        if results or failures:
            metrics = metric_record(self.phases.take_evaluation(server_round + self.offset, results, failures))
        self.method.end_round(server_round + self.offset)
        return metrics

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """The preflight, then the rounds, each closed on the method; Flower's ``Result`` of the run.

        Flower's own ``start`` cannot stop a run early nor mark its results folder failed; this can.

        Parameters
        ----------
        grid
            The grid the ServerApp was given.
        initial_arrays
            Optional: the model to start from (the run's names and shapes); default: the
            model stamen built from the run's ``seed``.
        num_rounds
            Rounds to play; default: the run config's (less a resumed run's done rounds).
        timeout
            Seconds each phase waits for its replies (default: the ``deadline`` key, or
            3600 s without one); a node that has not answered by then failed.
        train_config, evaluate_config
            Extra config values sent with every train / evaluate message.
        evaluate_fn
            Optional: ``(round, arrays) -> MetricRecord`` after every round, as Flower calls it
            (stamen's own server test is the ``central-eval`` key).

        """
        rounds = self.num_rounds if num_rounds is None else num_rounds
        self.timeout = timeout or self.phases.pacer.wait_s
        result = Result()
        try:
            with paced_run(grid, self.pull_interval) as grid:  # Flower's deployed grid would pull every 3 s
                self.started(grid)
                arrays = self._handed = self.global_arrays
                if initial_arrays is not None:
                    check_like(initial_arrays, arrays)
                    arrays = initial_arrays
                if self.phases.pacer.pace == "buffered":  # the model it starts from, as configure_train adopts it
                    if arrays is not self._handed and not same_arrays(arrays, self._handed):
                        self.method.adopt_model([a.numpy() for a in arrays.values()])
                    play_buffered(self, grid, rounds, train_config or ConfigRecord(), evaluate_config or ConfigRecord())
                    result.arrays = self.global_arrays
                    return result
                self.overlap_rounds &= self.phases.pacer.pace == "lockstep"  # a deadline round drops its late replies
                if self.overlap_rounds and rounds > 1 and _in_order(grid):
                    log(INFO, "stamen: each round's evaluation goes out with the next round's fit (overlap-rounds)")
                train: Pending | list[Message] | None = None  # the round's fit, when it went out with the last round
                for server_round in range(1, rounds + 1):
                    arrays, train = self._round(grid, server_round, arrays, train_config or ConfigRecord(),
                                                evaluate_config or ConfigRecord(), evaluate_fn, result, train,
                                                last=rounds)  # fmt: skip
        except RunDivergedError as stop:
            log(WARNING, "the run stopped early: %s", stop)
        except Exception as err:
            self.method.fail(" ".join(str(err).split()) or type(err).__name__)
            raise
        return result

    # ------------------------------------------------------------------ the loop and the messages

    def _round(self, grid: Grid, server_round: int, arrays: ArrayRecord, train_config: ConfigRecord,
               evaluate_config: ConfigRecord, evaluate_fn: Callable | None, result: Result,
               train: Pending | list[Message] | None, *, last: int) -> tuple[ArrayRecord, Pending | None]:  # fmt: skip
        """One round as Flower's ``Strategy.start`` plays it; the global model after it, and the next fit if sent."""
        if train is None:
            train = self._send(grid, list(self.configure_train(server_round, arrays, train_config, grid)))
        pacer, sent = self.phases.pacer, len(self._sent.get((server_round, MessageType.TRAIN), []))
        enough = pacer.target(server_round + self.offset, sent) if pacer.pace == "deadline" and not pacer.virtual else 0
        new_arrays, train_metrics = self.aggregate_train(server_round, self._receive(grid, train, enough))
        if new_arrays is not None:
            result.arrays = arrays = new_arrays
        if train_metrics is not None:
            result.train_metrics_clientapp[server_round] = train_metrics
        evaluation = self._send(grid, list(self.configure_evaluate(server_round, arrays, evaluate_config, grid)))
        next_train = None
        overlap = self.overlap_rounds and server_round < last and _in_order(grid)
        if evaluation and overlap and self.method.can_overlap(server_round + self.offset):
            next_train = self._send(grid, list(self.configure_train(server_round + 1, arrays, train_config, grid)))
        try:
            evaluate_metrics = self.aggregate_evaluate(server_round, self._receive(grid, evaluation))
        except BaseException:
            if isinstance(next_train, Pending):  # the run stops: the next fit's replies are not awaited
                grid.discard(next_train)
            raise
        if evaluate_metrics is not None:
            result.evaluate_metrics_clientapp[server_round] = evaluate_metrics
        if evaluate_fn is not None and (metrics := evaluate_fn(server_round, arrays)) is not None:
            result.evaluate_metrics_serverapp[server_round] = metrics
        return arrays, next_train

    def _send(self, grid: Grid, messages: list[Message]) -> Pending | list[Message]:
        """A phase's messages pushed now where the grid can wait for them later; else kept to push when awaited."""
        return grid.send(messages) if isinstance(grid, PacedGrid) and messages else messages

    def _receive(self, grid: Grid, sent: Pending | list[Message], enough: int = 0) -> list[Message]:
        if isinstance(sent, Pending):
            return grid.receive(sent, timeout=self.timeout, enough=enough)
        return list(grid.send_and_receive(sent, timeout=self.timeout)) if sent else []

    def started(self, grid: Grid) -> GridFleet:
        """The grid's nodes, the run started on them first if it was not (the preflight, the method's start, resume)."""
        if self.fleet is None:
            self.fleet = GridFleet(grid=grid)
            self.phases.start_run(self.fleet)
            if self.checkpoint is not None:
                self.method.resume(self.checkpoint)
            start_pacer(self.method, virtual=self.phases.pacer.settings.clock == "virtual" or (
                self.phases.pacer.settings.clock == "auto" and not is_deployed(grid)))  # fmt: skip
        elif self.fleet.grid is not grid:
            self.fleet = GridFleet(grid=grid)
        return self.fleet

    def _messages(self, server_round: int, instructions: list[Instruction], config: ConfigRecord,
                  kind: str) -> list[Message]:  # fmt: skip
        self._sent[(server_round, kind)] = instruction_messages(
            instructions, dict(config), kind=kind, group=str(server_round), names=self.method.sent_names,
            shadowed=self._shadowed)  # fmt: skip
        return self._sent[(server_round, kind)]

    def read(self, replies: Iterable[Message], sent: list[Message], *,
             fit: bool) -> tuple[list[Received | Evaluation], list[NodeFailureError]]:  # fmt: skip
        """The replies as the round's phases read them, and the failures: errors, unreadable and missing replies."""
        return read_replies(replies, sent, fit=fit, names=self.method.sent_names, waited_s=self.timeout)


def _in_order(grid: Grid) -> bool:
    """Whether rounds may overlap on ``grid``: it waits by :class:`PacedGrid` and runs a node's messages in order."""
    return isinstance(grid, PacedGrid) and grid.delivers_in_order
