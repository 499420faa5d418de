"""The preflight: every node asked once for its properties before round 1, and the run stopped if it cannot work.

Each node is asked for its properties once (over the :class:`Fleet`: the grid's nodes), with
the first round's fit config, so it also checks that config against its data; the
answers are kept in the run's :class:`strategies.nodes.directory.NodeDirectory`. A node that
connects later is asked when it is first needed (:func:`connected`). A node whose own
data is at fault (scope ``node``) is left out of the run with its reason logged, and so
is a deployed device running other stamen code (``stale_code.py``); any other fault stops
the run (:class:`PreflightError`, one line per cause, ``preflight_errors.py``: ``failures.py``
groups them).
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Protocol

import numpy as np
from flwr.common.logger import log

from strategies.contracts.client_reports import DATA_DIR, NUM_PARTITIONS, PARTITION_ID
from strategies.contracts.payload import Scalar
from strategies.nodes.directory import Declared, NodeDirectory, PropertyError, checked, screened
from strategies.nodes.failure_groups import problem_of, scope_of
from strategies.nodes.failures import reply_seconds
from strategies.nodes.preflight_errors import (
    MixedCodeError,
    PreflightError,
    condensed,
    details,
    failure_groups,
    preflight_error,
)
from strategies.nodes.stale_code import is_stale_run, screen_code
from strategies.nodes.text import escaped

WAIT_S = 600  # how long to wait for nodes to connect

Answer = dict[str, Scalar] | Exception  # a node's properties, or why it gave none


class Fleet(Protocol):
    """The nodes a run can reach: their ids (Flower's node ids, as text), a wait for them, and a question to them.

    The Flower adapter's is the grid's nodes (``strategies/flower/fleet.py``); a test's may answer by hand.
    """

    def node_ids(self) -> list[str]:
        """The ids of the nodes connected now."""
        ...

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether ``count`` nodes connected within ``timeout`` seconds."""
        ...

    def ask(self, cids: list[str], config: dict[str, Scalar], reply_s: float) -> list[Answer]:
        """Each node's properties for ``config`` (its ClientApp's ``query``), or the exception that came instead."""
        ...


def wait_for(fleet: Fleet, count: int) -> None:
    """Wait (up to ``WAIT_S``) until ``count`` nodes are connected; go on with fewer, with a warning."""
    if not fleet.wait_for(count, timeout=WAIT_S):
        log(WARNING, "only %d of the %d nodes asked for connected within %d s; going on with them",
            len(fleet.node_ids()), count, WAIT_S)  # fmt: skip


def preflight(
    nodes: NodeDirectory, fleet: Fleet, config: dict[str, Scalar], *, sample: int = 0, seed: int = 0
) -> PreflightError | None:
    """Ask every connected node for its properties with ``config``, kept in ``nodes``; stop the run if any cannot start.

    Every node shares the run config, so one that cannot start (too many clients
    for the data, a missing ``data-dir``, a batch larger than its data under
    ``strict-batches``, no GPU) means the run cannot work as asked: it stops now
    with the nodes' reasons, one line per distinct cause, instead of recording
    every round as failed. A node whose own data is at fault is left out instead,
    and so is one whose answer does not parse or claims a partition another node
    claims too (:func:`strategies.nodes.directory.screened`).

    Returns
    -------
    PreflightError or None
        The nodes left out for faults in their own data or answers, if any (the run goes on).

    Raises
    ------
    PreflightError
        With those lines and every node's full report, when a fault is the run's
        or no node is left.

    """
    cids = fleet.node_ids()
    if 0 < sample < len(cids) and _sampled_preflight(nodes, fleet, cids, config, sample, seed):
        return None
    answers = _ask(nodes, fleet, cids, config)
    answers, kept = screened(cids, answers)
    problems = [(c, a) for c, a in zip(cids, answers, strict=True) if problem_of(a) is not None]
    own_data = [(c, a) for c, a in problems if scope_of(a) == "node"]
    if len(problems) > len(own_data) or (own_data and len(own_data) == len(cids)):
        groups = failure_groups(problems, len(cids))
        lines = condensed(groups)
        if problems == own_data:
            lines.append("no node is left to train")
        raise PreflightError(lines, details(problems), groups)
    nodes.excluded.update({c: problem_of(a) or "" for c, a in own_data})
    nodes.keep([(c, kept[c]) for c in cids if c in kept])
    log(INFO, "preflight: %d of %d connected clients accept the config", len(cids) - len(own_data),
        len(cids))  # fmt: skip
    warn_of_batch(config, [checked.declared.num_train for checked in kept.values()])
    return preflight_error(own_data, len(cids)) if own_data else None


def _sampled_preflight(
    nodes: NodeDirectory, fleet: Fleet, cids: list[str], config: dict[str, Scalar], sample: int, seed: int
) -> bool:
    """Ask ``sample`` nodes (seeded); if they are simulated slices of one dataset, number every node and say so.

    A node that holds a partition of the run's dataset (no ``data-dir``, ``num-partitions``
    equal to the nodes connected) can serve any partition: the server numbers the
    nodes 0 to N-1 in node-id order without asking them, and each loads the partition
    it is sent (:meth:`clients.base.TorchClient.take_partition`); the clients' batches
    follow the partition, so the run is the one a full preflight gives. Otherwise
    (devices with their own data, or an answer that does not parse) every node must
    be asked: returns False.

    Raises
    ------
    PreflightError
        When a sampled node cannot start (the run's config is at fault).

    """
    ordered = sorted(cids)
    chosen = np.random.default_rng([seed, 7]).choice(len(ordered), size=sample, replace=False)
    asked = [ordered[i] for i in sorted(chosen)]
    answers = _ask(nodes, fleet, asked, config)
    problems = [(c, a) for c, a in zip(asked, answers, strict=True) if problem_of(a) is not None]
    if problems:
        raise preflight_error(problems, len(asked))
    try:
        sample_answers = [checked(a) for a in answers if isinstance(a, dict)]
    except PropertyError as err:  # the full preflight leaves that node out, with the line that names it
        log(INFO, "preflight: a node asked sent an answer that does not parse (%s); asking every node", err)
        return False
    if any(c.properties.get(DATA_DIR) or c.properties[NUM_PARTITIONS] != len(ordered) for c in sample_answers):
        log(INFO, "preflight: the nodes asked hold their own data or another number of partitions than the %d "
            "connected; asking every node", len(ordered))  # fmt: skip
        return False
    nodes.sampled = sample_answers
    warn_of_batch(config, [c.declared.num_train for c in sample_answers], sampled=True)
    for number, cid in enumerate(ordered):
        nodes.properties[cid] = {PARTITION_ID: number, NUM_PARTITIONS: len(ordered)}
        nodes.declarations[cid] = Declared()  # its answer, if asked, was about another partition
    log(INFO, "preflight: %d of %d connected clients asked (preflight-sample), all accept the config; the server "
        "numbers the nodes 0-%d and each serves the partition it is sent", sample, len(ordered),
        len(ordered) - 1)  # fmt: skip
    return True


def _ask(nodes: NodeDirectory, fleet: Fleet, cids: list[str], config: dict[str, Scalar]) -> list[Answer]:
    """The answers of nodes ``cids`` to ``config`` (:meth:`Fleet.ask`), their code screened."""
    if not cids:
        return []
    asked = fleet.ask(cids, config, reply_seconds(nodes.reply_s, len(cids)))
    return [screen_code(answer, nodes.code) for answer in asked]


def connected(nodes: NodeDirectory, fleet: Fleet) -> dict[int, str]:
    """Partition -> the id of a connected node serving it; a node not seen before is asked its partition first.

    A node that cannot answer is left out (and asked again next time); one whose
    own data or answer is at fault, or that claims a partition another new node
    claims too, is left out for the run (one line per cause, naming the nodes).
    A new node claiming the partition of a connected node admitted before waits:
    it is asked again next time (a device restarted under a new node id gets in
    once its old id has gone).
    """
    cids = _not_excluded(nodes, fleet)
    if not cids:
        log(WARNING, "no node is connected; waiting up to %d s for one", WAIT_S)
        fleet.wait_for(1, timeout=WAIT_S)
        cids = _not_excluded(nodes, fleet)
    new = [cid for cid in cids if cid not in nodes.properties]
    answers = _ask(nodes, fleet, new, {})
    stale = [(c, a) for c, a in zip(new, answers, strict=True) if is_stale_run(a)]
    if stale:  # without a preflight, round 1 is where a run that mixes two stamens is found: it stops here
        raise preflight_error(stale, len(new), MixedCodeError)
    held = {nodes.partition_of(cid): cid for cid in cids if cid in nodes.properties}
    answers, kept = screened(new, answers, held=held)
    refused = []
    for cid, answer in zip(new, answers, strict=True):
        problem = problem_of(answer)
        if problem is not None and scope_of(answer) == "node":
            nodes.excluded[cid] = problem
            refused.append((cid, answer))
        elif problem is not None:
            log(WARNING, "node %s is not admitted this round: %s", escaped(cid), problem)
    for line in condensed(failure_groups(refused, len(new))):
        log(WARNING, "left out of the run: %s", line)
    nodes.keep([(cid, kept[cid]) for cid in new if cid in kept])
    by_partition: dict[int, str] = {}
    for cid in sorted(cids):
        if cid in nodes.properties:
            by_partition.setdefault(nodes.partition_of(cid), cid)
    return by_partition


def _not_excluded(nodes: NodeDirectory, fleet: Fleet) -> list[str]:
    return [cid for cid in fleet.node_ids() if cid not in nodes.excluded]


def warn_of_batch(config: dict[str, Scalar], sizes: list[int | None], *, sampled: bool = False) -> None:
    """Warn when ``batch-size`` exceeds the training set (``sizes``: num-train) of every admitted client.

    Such a run works (a local step uses a client's whole set), but not as its batch size
    says; with a sampled preflight only the sample's sets are known.
    """
    largest = max((size for size in sizes if size is not None), default=0)
    batch = config.get("batch-size")
    if isinstance(batch, int | float) and largest and batch > largest:
        whose = f"the {len(sizes)} clients asked" if sampled else "every client"
        log(WARNING, "run config key 'batch-size': %s exceeds the training set of %s (the largest holds %d "
            "examples); every local step uses a client's whole set", batch, whose, largest)  # fmt: skip
