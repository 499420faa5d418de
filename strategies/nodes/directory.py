"""The node directory: which partition each admitted Flower node serves, and what it declared of its data.

The server sees node ids only (random 64-bit numbers); the partition a node serves
lives in its ``node_config``, and each node is asked for it once, by the preflight
(``preflight.py``) or when it first connects, over the grid (``strategies/flower/transport.py``).
The directory keeps the answers for the run.

A deployed device with its own data (``--node-config "data-dir=..."``) may have no
partition number: the directory numbers such nodes after the numbered ones, in the
order of their Flower node ids (which the SuperLink assigns: a device cannot pick its
number by naming its folder), and the server sends each its number in every instruction.

An answer is the node's word, not a fact (docs: DESIGN.md, trust boundaries). It is
checked once, on admission, into typed values (:func:`checked`): an answer that does
not parse, and every claim of a partition that another node claims too, is that node's
fault and leaves it out with one line naming it (:func:`screened`). Every string a node
sent is escaped (``node_text.py``) before it reaches a log line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from strategies.contracts.client_reports import (
    DATA_DIR,
    DATA_FINGERPRINT,
    NUM_PARTITIONS,
    NUM_TEST,
    NUM_TRAIN,
    PARTITION_ID,
    PREFLIGHT_DETAIL,
    PREFLIGHT_ERROR,
    PREFLIGHT_SCOPE,
    RAY_NODE,
    TEST_CLASSES,
    TRAIN_CLASSES,
)
from strategies.contracts.code import CODE_FINGERPRINT, CODE_LOCATION, code_identity
from strategies.contracts.payload import Scalar
from strategies.nodes.data import data_report, ray_nodes
from strategies.nodes.failure_groups import problem_of
from strategies.nodes.text import PROBLEM_CHARS, escaped, shown

LATER = "later"  # the scope of a refusal that holds this round only: the node is asked again next round
# "index:count": at most 9 digits of class index and 18 of count (below 2**63), so int() never meets a huge text
CLASS_ITEM = re.compile(r"([0-9]{1,9}):([0-9]{1,18})")
STRINGS = (DATA_DIR, DATA_FINGERPRINT, RAY_NODE, CODE_FINGERPRINT, CODE_LOCATION)  # the text properties kept


@dataclass(frozen=True, kw_only=True)
class Declared:
    """What a node declared of its data in the preflight, checked: the bounds its replies are held to.

    A field is ``None`` where the node did not declare it (and where the server numbered a
    sampled preflight's nodes: each then serves a partition it was not asked about).
    Class counts are keyed by class index, as the node sends them (``"0:12 3:40"``).
    """

    num_train: int | None = None
    num_test: int | None = None
    train_classes: dict[int, int] | None = None
    test_classes: dict[int, int] | None = None


@dataclass(frozen=True, kw_only=True)
class Checked:
    """A node's preflight answer that parsed: the properties the server keeps (typed) and its declared data."""

    properties: dict[str, Scalar]
    declared: Declared = field(default_factory=Declared)

    @property
    def partition(self) -> int:
        """The partition the node claims, -1 for none (the server numbers it)."""
        return int(self.properties[PARTITION_ID])


class PropertyError(ValueError):
    """A property of a node's answer that does not parse: ``key``, and the line that says why."""

    def __init__(self, key: str, value: object, why: str) -> None:
        super().__init__(f"property {key!r} is {shown(value)}: {why}")
        self.key = key


class NodeDirectory:
    """Node id -> the properties it reported (``partition-id``, ``num-partitions``, data sizes and classes).

    ``properties`` holds every admitted node's answer as checked (:func:`checked`: typed,
    the keys the server reads), ``declarations`` what each declared of its data
    (:meth:`declared`), ``excluded`` the nodes left out of the run (node id -> why). ``code``
    and ``reply_s`` are what the preflight (``preflight.py``) holds the nodes to.
    """

    def __init__(self, *, code: dict[str, str] | None = None, reply_s: float = 0.0) -> None:
        self.code = code if code is not None else code_identity()  # the server's: every node must run the same
        self.reply_s = reply_s  # the run's preflight-timeout (0: node_failures.reply_seconds decides)
        self.properties: dict[str, dict[str, Scalar]] = {}
        self.declarations: dict[str, Declared] = {}
        self.excluded: dict[str, str] = {}
        self.sampled: list[Checked] = []  # a sampled preflight's answers (the data report's sample)

    def admit(self, answers: list[tuple[str, dict[str, Scalar]]]) -> list[tuple[str, dict[str, Scalar] | Exception]]:
        """Check the nodes' answers (node id, answer) (:func:`screened`), keep those that pass; the others, refused.

        A claim of a partition that a node admitted before serves is refused (scope ``later``).
        """
        cids = [cid for cid, _ in answers]
        held = {self.partition_of(cid): cid for cid in self.properties}
        screened_answers, kept = screened(cids, [answer for _, answer in answers], held=held)
        self.keep([(cid, kept[cid]) for cid in cids if cid in kept])
        return [(c, a) for c, a in zip(cids, screened_answers, strict=True) if c not in kept]

    def keep(self, admitted: list[tuple[str, Checked]]) -> None:
        """Keep checked (node id, answer) pairs; number the nodes without a partition after the highest, by node id."""
        answers = dict(admitted)
        for cid, answer in answers.items():
            self.declarations[cid] = answer.declared
            if answer.partition >= 0:
                self.properties[cid] = answer.properties
        following = max(map(self.partition_of, self.properties), default=-1) + 1
        unnumbered = sorted((cid for cid, answer in answers.items() if answer.partition < 0), key=node_order)
        for number, cid in enumerate(unnumbered):
            self.properties[cid] = {**answers[cid].properties, PARTITION_ID: following + number}

    def partition_of(self, node: str) -> int:
        """The partition ``node`` reported (or was given)."""
        return int(self.properties[node][PARTITION_ID])

    def declared(self, node: str) -> Declared:
        """What ``node`` (its node id) declared of its data in the preflight, checked; ``None`` where it did not.

        A node known only from a resumed run's checkpoint is checked on first call; a
        checkpoint entry that does not parse declares nothing.

        Raises
        ------
        KeyError
            For a node that was never admitted (as :meth:`partition_of` does).

        """
        if node not in self.declarations:
            try:
                self.declarations[node] = checked(self.properties[node]).declared
            except PropertyError:
                self.declarations[node] = Declared()
        return self.declarations[node]

    def label(self, node: str) -> str:
        """``node`` for a log line: its partition and its own data-dir where known, with its node id (escaped)."""
        answer = self.properties.get(node)
        if answer is None:
            return f"node {escaped(node)}"
        where = f", data-dir {escaped(answer[DATA_DIR])}" if answer.get(DATA_DIR) else ""
        return f"partition {answer[PARTITION_ID]} (node {escaped(node)}{where})"

    def data_report(self, class_names: tuple[str, ...] = ()) -> list[dict[str, object]]:
        """Every admitted node's data, by partition (:func:`strategies.nodes.data.data_report`)."""
        return data_report(self._reported(), class_names)

    def ray_nodes(self) -> dict[str, int]:
        """Admitted clients per Ray node they answered the preflight on (:func:`strategies.nodes.data.ray_nodes`)."""
        return ray_nodes(self._reported())

    def _reported(self) -> list[tuple[dict[str, Scalar], Declared]]:
        """The answers nodes gave, with what they declared: a sampled preflight's sample, else every admitted node's."""
        if self.sampled:
            return [(answer.properties, answer.declared) for answer in self.sampled]
        return [(answer, self.declared(cid)) for cid, answer in self.properties.items()]


# ------------------------------------------------------------------------- checking a node's answer


def checked(answer: dict[str, Scalar]) -> Checked:
    """``answer`` typed: the properties the server keeps (ints as ints, known keys only) and the data it declares.

    Counts (``num-partitions``, ``num-train``, ``num-test``, each class's) are ints of at
    least 0: a bool is not a count, and neither is a float, even a whole one (a stamen
    client sends ``len()`` and Flower keeps ints and floats apart, so a float means a
    client that is not stamen's). ``partition-id`` is -1 (none: the server numbers the
    node) or a partition, below ``num-partitions`` where that is declared (above 0).
    ``train-classes`` and ``test-classes`` are ``"index:count ..."`` with each index once,
    their counts summing to at most ``num-train`` and ``num-test`` where declared.

    Raises
    ------
    PropertyError
        Naming the first property that does not parse.

    """
    num_partitions = _count(answer, NUM_PARTITIONS) or 0
    partition = answer.get(PARTITION_ID, -1)
    if not is_int(partition) or partition < -1:
        raise PropertyError(PARTITION_ID, partition, "not a partition number (an integer, -1 for none)")
    if num_partitions and partition >= num_partitions:
        raise PropertyError(PARTITION_ID, partition, f"outside the {num_partitions} partitions the node declares "
                                                   "(num-partitions)")  # fmt: skip
    num_train, num_test = _count(answer, NUM_TRAIN), _count(answer, NUM_TEST)
    declared = Declared(num_train=num_train, num_test=num_test,
                        train_classes=_classes(answer, TRAIN_CLASSES, num_train, NUM_TRAIN),
                        test_classes=_classes(answer, TEST_CLASSES, num_test, NUM_TEST))  # fmt: skip
    for key in STRINGS:
        if not isinstance(answer.get(key, ""), str):
            raise PropertyError(key, answer[key], "not a text")
    kept = {key: answer[key] for key in (*STRINGS, NUM_TRAIN, NUM_TEST, TRAIN_CLASSES, TEST_CLASSES) if key in answer}
    return Checked(properties={**kept, PARTITION_ID: partition, NUM_PARTITIONS: num_partitions}, declared=declared)


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool (a bool is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _count(answer: dict[str, Scalar], key: str) -> int | None:
    """``answer[key]`` as a count, ``None`` when absent."""
    if key not in answer:
        return None
    value = answer[key]
    if not is_int(value) or value < 0:
        raise PropertyError(key, value, "not a count (an integer of at least 0)")
    return value


def _classes(answer: dict[str, Scalar], key: str, total: int | None, total_key: str) -> dict[int, int] | None:
    """``answer[key]`` (``"0:12 3:40"``) as class index -> count, ``None`` when absent."""
    if key not in answer:
        return None
    text = answer[key]
    if not isinstance(text, str):
        raise PropertyError(key, text, "not a text of index:count pairs")
    counts: dict[int, int] = {}
    for item in text.split():
        match = CLASS_ITEM.fullmatch(item)
        if match is None:
            raise PropertyError(key, text, f"{shown(item)} is not index:count (two integers of at least 0)")
        index, count = int(match[1]), int(match[2])
        if index in counts:
            raise PropertyError(key, text, f"class {index} is counted twice")
        counts[index] = count
    if total is not None and sum(counts.values()) > total:
        raise PropertyError(key, text, f"its counts sum to {sum(counts.values())}, more than its {total_key} {total}")
    return counts


def screened(
    cids: list[str], answers: list[dict[str, Scalar] | Exception], *, held: Mapping[int, str] | None = None
) -> tuple[list[dict[str, Scalar] | Exception], dict[str, Checked]]:
    """The answers of nodes ``cids`` with each refused one made a refusal, the others checked (id -> :class:`Checked`).

    An answer that does not parse (:func:`checked`) is refused, as is every claim of a
    partition that more than one node makes: the server cannot tell which claimant holds
    that partition, so it trusts none (training one partition twice, or on the wrong data,
    is worse than missing it; the operator gives each its own ``partition-id``). Both
    refusals blame the node (scope ``node``: it is left out of the run). A claim of a
    partition that a node admitted before serves (``held``: partition -> node id) is
    refused for now (scope ``later``): the node that was checked alone keeps it, and a
    late claimant cannot displace it. Answers that already report a problem pass as they are.
    """
    answers, kept = list(answers), {}
    for i, (cid, answer) in enumerate(zip(cids, answers, strict=True)):
        if problem_of(answer) is None and isinstance(answer, dict):
            try:
                kept[cid] = checked(answer)
            except PropertyError as err:
                answers[i] = _refusal(str(err), f"the node's answer: {shown(answer, PROBLEM_CHARS)}")
    claims: dict[int, list[str]] = {}
    for cid, answer in kept.items():
        if answer.partition >= 0:
            claims.setdefault(answer.partition, []).append(cid)
    index = {cid: i for i, cid in enumerate(cids)}
    for partition, claimants in claims.items():
        if len(claimants) > 1:
            why = (f"partition {partition} is claimed by {len(claimants)} nodes; the server cannot tell which holds "
                   "it, so none of them takes part (give each node its own partition-id)")  # fmt: skip
        elif held and partition in held:
            why = f"partition {partition} is served by node {escaped(held[partition])}; this node is asked again later"
        else:
            continue
        for cid in claimants:
            answers[index[cid]] = _refusal(why, "", scope="node" if len(claimants) > 1 else LATER)
            del kept[cid]
    return answers, kept


def _refusal(why: str, detail: str, *, scope: str = "node") -> dict[str, Scalar]:
    """A problem answer made by the server: it carries no partition or data-dir, so the node is named by its id."""
    return {PREFLIGHT_ERROR: why, PREFLIGHT_SCOPE: scope, PREFLIGHT_DETAIL: detail}


def node_order(cid: str) -> tuple[int, int, str]:
    """Sort key of node ids: Flower's (decimal integers) by value, then any other text."""
    return (0, int(cid), "") if cid.isascii() and cid.isdigit() else (1, 0, cid)
