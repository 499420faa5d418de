"""Flower's Message API ``Strategy`` over a stamen strategy: the same parts, rounds and records as the legacy path.

:class:`MessageStrategy` is the Message API adapter. It holds a stamen strategy (the
legacy adapter, :class:`strategies.base.FederatedStrategy`, or one continued from a
checkpoint) and turns its instructions into ``Message`` objects
(:mod:`strategies.message_codec`) and the replies back, so every method runs the same
code on both paths: the preflight (a ``query`` message per node), the sampling, the
reply screen, the aggregation, the tuner, the round record, checkpoints and the
divergence stop. Failures are counted from the messages sent: a reply with Flower's
``error`` is a failure with its ``reason``, a node that sent none is one too.

Flower 1.42's ``Strategy.start`` has no way to stop a run early nor to close a round
after its evaluation, which stamen's record needs; :meth:`MessageStrategy.start`
therefore plays the rounds itself, in the legacy server's order (fit, the server's
test of the global model, the clients' evaluation, then the round's record), calling
the four Message API methods a subclass may override.

On a grid that runs each node's messages in the order they were pushed (Flower's
deployed grid), round r+1's fit goes out with round r's evaluation (``overlap-rounds``):
both carry the same global model, and a SuperNode that has answered the evaluation finds
the fit waiting instead of sleeping 3 s before its next pull
(``flwr/supernode/start_client_internal.py``). The records, the model and every figure
are the same as without the overlap (``FederatedStrategy.can_overlap`` says when it is
allowed); a run that stops at round r's close drops round r+1's fit unread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Protocol

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common import Code, EvaluateRes, FitRes, Parameters, Status
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies.contracts.common import PULL_INTERVAL
from strategies.grid_nodes import GridNodes
from strategies.grid_transport import CLIENT_ERROR, NO_REPLY, NodeError, NoReplyError, replies_by_node
from strategies.message_codec import (
    LOSS,
    MODEL_RECORD,
    MessageFormatError,
    array_records,
    check_like,
    instruction,
    metric_record,
    read_reply,
    same_arrays,
)
from strategies.paced_grid import PacedGrid, Pending, paced_run
from strategies.run_watch import RunDivergedError

OK = Status(code=Code.OK, message="")
RESERVED = ("partition-id", "payload", "server-round")  # config keys a user's train_config may not set


class RoundClosing(Protocol):
    """What the adapter drives: a stamen strategy, or one continued from a checkpoint (``strategies/resume.py``)."""

    def initialize_parameters(self, client_manager: GridNodes) -> Parameters | None: ...
    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: GridNodes) -> list: ...
    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple: ...
    def evaluate(self, server_round: int, parameters: Parameters) -> tuple | None: ...
    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: GridNodes) -> list: ...
    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple: ...
    def end_round(self, server_round: int) -> None: ...
    def can_overlap(self, server_round: int) -> bool: ...
    def fail(self, reason: str) -> None: ...
    def adopt_model(self, model: list) -> Parameters: ...

    sent_names: tuple[str, ...]  # read-only properties of the strategy
    global_parameters: Parameters
    model_names: tuple[str, ...]


class MessageStrategy(Strategy):
    """A stamen strategy on Flower's Message API (see the module's docstring).

    Parameters
    ----------
    strategy
        The stamen strategy it drives, built by ``app.server_run.run_strategy`` (its
        settings, results folder and initial model), or continued from a checkpoint.
    num_rounds
        The rounds it has left to play (a resumed run's remaining rounds).
    pull_interval
        Seconds between two pulls of the replies in :meth:`start` (``strategies/paced_grid.py``).
    overlap_rounds
        Send round r+1's fit with round r's evaluation where the grid allows (the module's docstring).

    """

    def __init__(self, *, strategy: RoundClosing, num_rounds: int, pull_interval: float = PULL_INTERVAL,
                 overlap_rounds: bool = True) -> None:  # fmt: skip
        self.strategy = strategy
        self.num_rounds = num_rounds
        self.pull_interval = pull_interval
        self.overlap_rounds = overlap_rounds
        self.nodes: GridNodes | None = None
        self.parameters: Parameters | None = None  # the global model as the stamen strategy last gave it
        # each phase's messages by (round, message type), until its replies are read (Flower sets their ids on sending)
        self._sent: dict[tuple[int, str], list[tuple[Message, ClientProxy]]] = {}
        self._shadowed: set[str] = set()  # train_config keys already reported as set over stamen's own
        self.timeout = 3600.0  # seconds a phase waits for its replies (start's timeout)
        self._handed: ArrayRecord | None = None  # the global model as last handed to Flower's loop

    @property
    def global_arrays(self) -> ArrayRecord:
        """The global model stamen holds, keyed by ``state_dict`` names (before round 1: the run's initial model).

        Pass it as ``initial_arrays`` to a wrapper's ``start`` (Flower's requires one).
        """
        return self._arrays(self.parameters if self.parameters is not None else self.strategy.global_parameters)

    def summary(self) -> None:
        log(INFO, "\t%r, %d round(s), on Flower's Message API", self.strategy, self.num_rounds)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One ``train`` message per sampled node: its array sets (named ArrayRecords) and its config.

        The first call runs the preflight. ``arrays`` other than the model this strategy
        last returned (``initial_arrays``, or a wrapper's noised aggregate) become the
        global model first. Keys of ``config`` travel too; one that stamen also sends
        overrides stamen's value and is logged once (the round's record keeps stamen's).
        """
        nodes = self._started(grid)
        if arrays is not self._handed and len(arrays) and not same_arrays(arrays, self._arrays(self.parameters)):
            log(INFO, "stamen: round %s starts from the arrays given to configure_train, not the model stamen holds",
                server_round)  # fmt: skip
            self.parameters = self.strategy.adopt_model([a.numpy() for a in arrays.values()])
        instructions = self.strategy.configure_fit(server_round, self.parameters, nodes)
        return self._messages(server_round, instructions, config, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The stamen strategy's aggregate of the screened replies; then the server's own test (``central-eval``)."""
        results, failures = self._read(replies, self._sent.pop((server_round, MessageType.TRAIN), []), fit=True)
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        if parameters is not None:
            self.parameters = parameters
        self.strategy.evaluate(server_round, self.parameters)
        self._handed = self._arrays(self.parameters)
        return (self._handed if parameters is not None else None), metric_record(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        instructions = self.strategy.configure_evaluate(server_round, self.parameters, self._nodes(grid))
        return self._messages(server_round, instructions, config, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The clients' evaluation, then the round closed: its record, checkpoint and divergence watch.

        Raises
        ------
        RunDivergedError
            When the run is to stop (its summary already says why); :meth:`start` ends the run on it.

        """
        results, failures = self._read(replies, self._sent.pop((server_round, MessageType.EVALUATE), []), fit=False)
        metrics = None
        if results or failures:
            metrics = metric_record(self.strategy.aggregate_evaluate(server_round, results, failures)[1])
        self.strategy.end_round(server_round)
        return metrics

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """The preflight, then the rounds, each closed on the stamen strategy; Flower's ``Result`` of the run.

        Flower's own ``start`` would run the same four methods (a wrapper such as Flower's
        differential-privacy strategies does), but it cannot stop a run early nor mark its
        results folder failed; this one does both, and logs one line per round instead of
        every aggregated record.

        Parameters
        ----------
        grid
            The grid the ServerApp was given.
        initial_arrays
            Optional: the model to start from, with the names and shapes of the run's
            model; default: the model stamen built from the run's ``seed`` (so the same
            seed gives the same run).
        num_rounds
            Rounds to play; default: the run config's (less a resumed run's done rounds).
        timeout
            Seconds each phase waits for its replies; a node that has not answered by then failed.
        train_config, evaluate_config
            Extra config values sent with every train / evaluate message.
        evaluate_fn
            Optional: ``(round, arrays) -> MetricRecord``, called after every round as Flower's
            strategies call it; stamen's own server test is the ``central-eval`` key.

        """
        rounds = self.num_rounds if num_rounds is None else num_rounds
        self.timeout = timeout
        result = Result()
        try:
            with paced_run(grid, self.pull_interval) as grid:  # Flower's deployed grid would pull every 3 s
                self._started(grid)
                arrays = self._handed = self._arrays(self.parameters)
                if initial_arrays is not None:
                    check_like(initial_arrays, arrays)
                    arrays = initial_arrays
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
            self.strategy.fail(" ".join(str(err).split()) or type(err).__name__)
            raise
        return result

    def _round(self, grid: Grid, server_round: int, arrays: ArrayRecord, train_config: ConfigRecord,
               evaluate_config: ConfigRecord, evaluate_fn: Callable | None, result: Result,
               train: Pending | list[Message] | None, *, last: int) -> tuple[ArrayRecord, Pending | None]:  # fmt: skip
        """One round as Flower's ``Strategy.start`` plays it; the global model after it, and the next fit if sent.

        ``train`` is this round's fit when it went out with the last round's evaluation.
        """
        if train is None:
            train = self._send(grid, list(self.configure_train(server_round, arrays, train_config, grid)))
        new_arrays, train_metrics = self.aggregate_train(server_round, self._receive(grid, train))
        if new_arrays is not None:
            result.arrays = arrays = new_arrays
        if train_metrics is not None:
            result.train_metrics_clientapp[server_round] = train_metrics
        evaluation = self._send(grid, list(self.configure_evaluate(server_round, arrays, evaluate_config, grid)))
        next_train = None
        if evaluation and self._overlaps(grid, server_round, last):
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

    def _overlaps(self, grid: Grid, server_round: int, last: int) -> bool:
        """Whether round ``server_round + 1``'s fit goes out with this round's evaluation."""
        allowed = self.overlap_rounds and server_round < last and _in_order(grid)
        return allowed and self.strategy.can_overlap(server_round)

    def _send(self, grid: Grid, messages: list[Message]) -> Pending | list[Message]:
        """A phase's messages pushed now where the grid can wait for them later; else kept to push when awaited."""
        return grid.send(messages) if isinstance(grid, PacedGrid) and messages else messages

    def _receive(self, grid: Grid, sent: Pending | list[Message]) -> list[Message]:
        if isinstance(sent, Pending):
            return grid.receive(sent, timeout=self.timeout)
        return list(grid.send_and_receive(sent, timeout=self.timeout)) if sent else []

    def _nodes(self, grid: Grid) -> GridNodes:
        if self.nodes is None or self.nodes.grid is not grid:
            self.nodes = GridNodes(grid=grid)
        return self.nodes

    def _started(self, grid: Grid) -> GridNodes:
        """The grid's nodes, the run started on them first if it was not (the preflight, the method's start)."""
        nodes = self._nodes(grid)
        if self.parameters is None:
            self.parameters = self.strategy.initialize_parameters(nodes)
        return nodes

    def _messages(self, server_round: int, instructions: list, config: ConfigRecord, kind: str) -> list[Message]:
        extra = dict(config)
        if reserved := sorted(set(extra) & set(RESERVED)):
            raise ValueError(f"{kind}_config may not set {reserved}: stamen sets them per message")
        sent = self._sent[(server_round, kind)] = []
        messages = []
        for proxy, ins in instructions:
            if shadowed := sorted(k for k in extra if k in ins.config and k not in self._shadowed):
                log(INFO, "stamen: %s_config sets %s over stamen's values", kind, ", ".join(shadowed))
                self._shadowed.update(shadowed)
            content = instruction(ins.parameters, {**ins.config, **extra}, self.strategy.sent_names)
            messages.append(Message(content=content, dst_node_id=proxy.node_id, message_type=kind,
                                    group_id=str(server_round)))  # fmt: skip
            sent.append((messages[-1], proxy))
        return messages

    def _read(self, replies: Iterable[Message], sent: list[tuple[Message, ClientProxy]], *,
              fit: bool) -> tuple[list, list]:  # fmt: skip
        """The replies as the stamen strategy reads them, and the failures: errors, unreadable and missing replies."""
        results, failures = [], []
        answers = replies_by_node([message for message, _ in sent], replies)
        for message, proxy in sent:  # failures are the messages sent less the usable replies
            answer = answers.get(message.metadata.dst_node_id)
            if answer is None:
                failures.append(NoReplyError(f"{NO_REPLY} {self.timeout:g} s", cid=proxy.cid))
                continue
            if answer.has_error():
                failures.append(NodeError(CLIENT_ERROR.format(reason=answer.error.reason), cid=proxy.cid))
                continue
            try:
                tensors, num_examples, metrics, names = read_reply(answer.content)
                if fit and names and list(names) != list(self.strategy.sent_names or names):
                    raise MessageFormatError(f"the reply's arrays are named {names[:4]}..., the server sent "
                                             f"{list(self.strategy.sent_names)[:4]}...")  # fmt: skip
            except (MessageFormatError, KeyError, TypeError) as err:
                failures.append(NodeError(f"unreadable reply: {err}", cid=proxy.cid))
                continue
            if fit:
                results.append((proxy, FitRes(OK, Parameters(tensors=tensors, tensor_type="numpy.ndarray"),
                                              num_examples, metrics)))  # fmt: skip
            else:
                loss = metrics.pop(LOSS, float("nan"))
                results.append((proxy, EvaluateRes(OK, loss, num_examples, metrics)))
        return results, failures

    def _arrays(self, parameters: Parameters | None) -> ArrayRecord:
        """The whole global model as one ArrayRecord keyed by its ``state_dict`` names."""
        if parameters is None:
            return ArrayRecord()
        return array_records(parameters.tensors, None, self.strategy.model_names)[MODEL_RECORD]


def _in_order(grid: Grid) -> bool:
    """Whether rounds may overlap on ``grid``: it waits by :class:`PacedGrid` and runs a node's messages in order."""
    return isinstance(grid, PacedGrid) and grid.delivers_in_order
