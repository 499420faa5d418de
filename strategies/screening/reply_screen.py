"""The screen every fit reply passes before it may touch the global model, and how failures are recorded.

:class:`ReplyScreen` unpacks each reply by the layout it names, checks the model's
arrays (count, shapes, finiteness), the declared metrics and every array set the contract
``returns``, and hands the accepted ones on in partition order. The checks themselves
are pure functions in ``screening.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from strategies.contracts.contract import Metric
from strategies.contracts.payload import LAYOUT, MODEL, ArraySet, from_bytes, unpack
from strategies.nodes.directory import Declared, NodeDirectory
from strategies.nodes.failure_groups import group_by_cause
from strategies.screening.replies import (
    Received,
    Reply,
    counts_problem,
    extras_problem,
    fit_reply_problem,
    is_non_finite,
)
from strategies.screening.update_screen import UpdateNormScreen

Failures = list[BaseException]  # a node's (strategies.nodes.failures.NodeFailureError names it) or any other


class ReplyScreen:
    """Screens a round's fit replies and reports failures; a member of every strategy (``strategy.reply_screen``).

    Parameters
    ----------
    name
        The method's name (in a rejection's reason).
    returns
        The array sets its replies return (its contract's ``returns``).
    nodes
        The node directory: each node's partition, label and declared counts.
    fit_specs
        The fit metrics a reply may carry, by name, with their ranges.
    sent_shapes, sent_dtypes
        The shapes and dtypes of the model arrays that travel.
    update_screen
        The update-norm screen the accepted replies pass last.

    """

    def __init__(self, *, name: str, returns: tuple[ArraySet, ...], nodes: NodeDirectory, fit_specs: dict[str, Metric],
                 sent_shapes: list[tuple[int, ...]], sent_dtypes: list[np.dtype],
                 update_screen: UpdateNormScreen) -> None:  # fmt: skip
        self.name, self.returns, self.nodes, self.fit_specs = name, returns, nodes, fit_specs
        self.sent_shapes, self.sent_dtypes, self.update_screen = sent_shapes, sent_dtypes, update_screen

    def screen_fit(self, server_round: int, results: list[Received], *,
                   returned: dict[str, tuple[list[tuple[int, ...]], list[np.dtype]]],
                   sent_to: Callable[[int], list[np.ndarray]] | None) -> tuple[list[Reply], int, dict]:  # fmt: skip
        """The replies that may be combined (decoded, in partition order), how many were rejected, the record's entries.

        Each reply is unpacked by the layout it names; its model arrays are screened by
        the shapes and dtypes sent, finiteness and the declared metrics, its example count
        against the node's declared ``num-train``, and every array set it returns by the
        shapes and dtypes in ``returned`` (set name -> (shapes, dtypes)), finiteness and its
        kind (counts against the node's declared counts here; norms against the round's
        median in the update screen, from what ``sent_to(partition)`` gave; ``None`` when no
        model travels). The entries count the rejections for non-finite values
        (``clients-nonfinite``) and hold the update screen's.
        """
        replies, rejected, non_finite = [], 0, 0
        shapes = {name: pair[0] for name, pair in returned.items()}
        dtypes = {name: pair[1] for name, pair in returned.items()}
        for res in results:
            try:
                sets = unpack([from_bytes(tensor) for tensor in res.tensors], res.metrics.get(LAYOUT))
                arrays = sets.pop(MODEL, [])
                metrics = {k: v for k, v in res.metrics.items() if k != LAYOUT}
                declared = self.nodes.declared(res.node)
                problem = (fit_reply_problem(arrays, res.num_examples, metrics, self.sent_shapes, self.fit_specs,
                                             self.sent_dtypes, examples_limit=declared.num_train)
                           or extras_problem(sets, shapes, self.name, dtypes)
                           or self._counts_problem(sets, declared))  # fmt: skip
            except Exception as err:  # undecodable payloads are malformed replies too
                problem = f"unreadable reply ({err})"
            if problem is None:
                partition = self.nodes.partition_of(res.node)
                replies.append(Reply(res.node, partition, arrays, res.num_examples, metrics, extras=sets))
            else:
                log(WARNING, "round %s: rejected fit reply from %s: %s", server_round, self.nodes.label(res.node),
                    problem)  # fmt: skip
                rejected += 1
                non_finite += is_non_finite(problem)
        sent = None if sent_to is None else [sent_to(reply.partition) for reply in replies]
        replies, too_large, entries = self.update_screen.screen(server_round, replies, sent)
        return sorted(replies, key=lambda reply: reply.partition), rejected + too_large, {
            "clients-nonfinite": non_finite, **entries}

    def _counts_problem(self, sets: dict[str, list[np.ndarray]], declared: Declared) -> str | None:
        """Why a returned set of ``counts`` kind cannot be believed against the node's declared counts, or ``None``."""
        for array_set in self.returns:
            if array_set.kind == "counts" and (
                problem := counts_problem(sets[array_set.name], total_limit=declared.num_train,
                                          per_class_limit=declared.train_classes)  # fmt: skip
            ):
                return f"{self.name} array set {array_set.name!r}: {problem}"
        return None

    def failures(self, kind: str, server_round: int, failures: Failures) -> dict:
        """One log line per cause (a hundred nodes failing alike make one); the record's entries for every failure."""
        if not failures:
            return {}
        groups = group_by_cause((self._failed_who(f), describe_failure(f)) for f in failures)
        for group in groups:
            log(WARNING, "round %s: %s failed on %d client(s) (%s): %s", server_round, kind, group["count"],
                ", ".join(group["clients"]), group["cause"])  # fmt: skip
        return {f"{kind}-failures": [describe_failure(f)[:500] for f in failures], f"{kind}-failure-groups": groups}

    def _failed_who(self, failure: BaseException) -> str:
        """The failed client's label where the failure names its node (a ``NodeFailureError``), else ``?``."""
        return self.nodes.label(failure.cid) if hasattr(failure, "cid") else "?"


def describe_failure(failure: BaseException) -> str:
    """A failure as one log-friendly line."""
    return f"{type(failure).__name__}: {failure}"
