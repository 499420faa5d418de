"""Which partition each connected Flower node serves, asked once per node, and the preflight.

The server sees node ids only (random 64-bit numbers); the partition a node serves
lives in its ``node_config``. Each node is asked for its properties once (with the
first round's fit config in the preflight, so it also checks that config against
its data) and the answer is cached for the run.

A deployed device with its own data (``--node-config "data-dir=..."``) may have no
partition number: the server numbers such nodes after the numbered ones, in the order
of their Flower node ids (which the SuperLink assigns: a device cannot pick its number
by naming its folder), and sends each its number in every instruction. A node whose own
data is at fault (scope ``node``) is left out of the run with its reason logged; any
other fault stops the run.

An answer is the node's word, not a fact (docs: DESIGN.md, trust boundaries). It is
checked once, on admission, into typed values (:func:`checked`): an answer that does
not parse, and every claim of a partition that another node claims too, is that node's
fault and leaves it out with one line naming it. Every string a node sent is escaped
(:func:`escaped`) before it reaches a log line, so a newline or a terminal escape in a
node's answer cannot forge one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.app import Message
from flwr.common import GetPropertiesIns, MessageTypeLegacy, Scalar
from flwr.common.logger import log
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy

from strategies.contracts.code import CODE_FINGERPRINT, CODE_LOCATION, code_identity, code_mismatch
from strategies.contracts.common import (
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
from strategies.failures import by_cause, first_of

WAIT_S = 600  # how long to wait for nodes to connect
REPLY_S = 300  # a node that has not answered the preflight by then cannot start (run config key preflight-timeout)
# ... plus this much per node asked beyond REPLY_NODES: a simulation's workers answer the nodes a few at a time, each
# first message loading the node's data, so the preflight of a large federation on a small machine takes longer
REPLY_S_PER_NODE, REPLY_NODES = 2.0, 100
REPLY_KEY = "preflight-timeout"
NO_REPLY = "sent no reply within"
WORKERS = 8
LISTED_NODES = 10  # the preflight logs one line per node up to this many, else a summary line
LISTED_CLIENTS = 6  # a failure group names this many clients (partitions as ranges), then "..."
STALE = "stale code"  # the preflight detail of a node refused for running other stamen code
RUN_HINT = (
    ": a run must not mix two versions of stamen. With `flwr run .` this means a local SuperLink started in another "
    "folder serves this run and its clients import that folder's code; stop that SuperLink or give this run its own "
    "(docs/troubleshooting.md#two-checkouts has the commands)"
)
DEVICE_HINT = ": this device is left out; restart its SuperNode so that it runs the app of this run"
NAME_CHARS = 120  # a node's string (its data-dir, a bad value) in a log line is cut to this
PROBLEM_CHARS = 2_000  # a node's own account of its fault: a sentence or two, and the server's hint after it
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
    (:meth:`declared`), ``excluded`` the nodes left out of the run (node id -> why).
    """

    def __init__(self, *, code: dict[str, str] | None = None, reply_s: float = 0.0) -> None:
        self.code = code if code is not None else code_identity()  # the server's: every node must run the same
        self.reply_s = reply_s  # the run's preflight-timeout (0: reply_seconds decides by the nodes asked)
        self.properties: dict[str, dict[str, Scalar]] = {}
        self.declarations: dict[str, Declared] = {}
        self.excluded: dict[str, str] = {}
        self.sampled: list[Checked] = []  # a sampled preflight's answers (the data report's sample)

    def wait_for(self, client_manager: ClientManager, count: int) -> None:
        """Wait (up to ``WAIT_S``) until ``count`` nodes are connected; go on with fewer, with a warning."""
        if not client_manager.wait_for(count, timeout=WAIT_S):
            log(WARNING, "only %d of the %d nodes asked for connected within %d s; going on with them",
                client_manager.num_available(), count, WAIT_S)  # fmt: skip

    def preflight(
        self, client_manager: ClientManager, config: dict[str, Scalar], *, sample: int = 0, seed: int = 0
    ) -> PreflightError | None:
        """Ask every connected node for its properties with ``config``; stop the run if any cannot start.

        Every node shares the run config, so one that cannot start (too many clients
        for the data, a missing ``data-dir``, a batch larger than its data under
        ``strict-batches``, no GPU) means the run cannot work as asked: it stops now
        with the nodes' reasons, one line per distinct cause, instead of recording
        every round as failed. A node whose own data is at fault is left out instead,
        and so is one whose answer does not parse or claims a partition another node
        claims too (:func:`screened`).

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
        proxies = list(client_manager.all().values())
        if 0 < sample < len(proxies) and self._sampled_preflight(proxies, config, sample, seed):
            return None
        answers = [self.screen_code(a) for a in _ask(proxies, config, reply_seconds(self.reply_s, len(proxies)))]
        answers, kept = screened(proxies, answers)
        problems = [(p, a) for p, a in zip(proxies, answers, strict=True) if problem_of(a) is not None]
        own_data = [(p, a) for p, a in problems if scope_of(a) == "node"]
        if len(problems) > len(own_data) or (own_data and len(own_data) == len(proxies)):
            groups = failure_groups(problems, len(proxies))
            lines = condensed(groups)
            if problems == own_data:
                lines.append("no node is left to train")
            raise PreflightError(lines, details(problems), groups)
        self.excluded.update({p.cid: problem_of(a) or "" for p, a in own_data})
        self._keep([(p, kept[p.cid]) for p in proxies if p.cid in kept])
        log(INFO, "preflight: %d of %d connected clients accept the config", len(proxies) - len(own_data),
            len(proxies))  # fmt: skip
        warn_of_batch(config, [checked.declared.num_train for checked in kept.values()])
        return preflight_error(own_data, len(proxies)) if own_data else None

    def _sampled_preflight(self, proxies: list[ClientProxy], config: dict[str, Scalar], sample: int, seed: int) -> bool:
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
        ordered = sorted(proxies, key=lambda proxy: proxy.cid)
        chosen = np.random.default_rng([seed, 7]).choice(len(ordered), size=sample, replace=False)
        asked = [ordered[i] for i in sorted(chosen)]
        answers = [self.screen_code(a) for a in _ask(asked, config, reply_seconds(self.reply_s, len(asked)))]
        problems = [(p, a) for p, a in zip(asked, answers, strict=True) if problem_of(a) is not None]
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
        self.sampled = sample_answers
        warn_of_batch(config, [c.declared.num_train for c in sample_answers], sampled=True)
        for number, proxy in enumerate(ordered):
            self.properties[proxy.cid] = {PARTITION_ID: number, NUM_PARTITIONS: len(ordered)}
            self.declarations[proxy.cid] = Declared()  # its answer, if asked, was about another partition
        log(INFO, "preflight: %d of %d connected clients asked (preflight-sample), all accept the config; the server "
            "numbers the nodes 0-%d and each serves the partition it is sent", sample, len(ordered),
            len(ordered) - 1)  # fmt: skip
        return True

    def screen_code(self, answer: dict[str, Scalar] | Exception) -> dict[str, Scalar] | Exception:
        """``answer``, or a problem answer when the node runs other stamen code than the server.

        A deployed node (one not simulated on Ray) that runs other code is left out
        (scope ``node``): only that device is stale. A simulated node means that the run
        itself mixes code (scope ``run``: it stops).
        """
        if isinstance(answer, Exception):
            return answer
        mismatch = code_mismatch(answer, fingerprint=self.code[CODE_FINGERPRINT], location=self.code[CODE_LOCATION])
        if mismatch is None:
            return answer
        device = not answer.get(RAY_NODE)
        return {**answer, PREFLIGHT_ERROR: mismatch + (DEVICE_HINT if device else RUN_HINT),
                PREFLIGHT_SCOPE: "node" if device else "run", PREFLIGHT_DETAIL: STALE}  # fmt: skip

    def admit(
        self, answers: list[tuple[ClientProxy, dict[str, Scalar]]]
    ) -> list[tuple[ClientProxy, dict[str, Scalar] | Exception]]:
        """Check the nodes' answers (:func:`screened`) and keep those that pass; returns the others, as refusals.

        A claim of a partition that a node admitted before serves is refused (scope ``later``).
        """
        proxies = [proxy for proxy, _ in answers]
        held = {self.partition_of(cid): cid for cid in self.properties}
        screened_answers, kept = screened(proxies, [answer for _, answer in answers], held=held)
        self._keep([(proxy, kept[proxy.cid]) for proxy in proxies if proxy.cid in kept])
        return [(p, a) for p, a in zip(proxies, screened_answers, strict=True) if p.cid not in kept]

    def _keep(self, admitted: list[tuple[ClientProxy, Checked]]) -> None:
        """Keep checked answers; number the nodes without a partition after the highest in use, by node id."""
        answers = {proxy.cid: answer for proxy, answer in admitted}
        for cid, answer in answers.items():
            self.declarations[cid] = answer.declared
            if answer.partition >= 0:
                self.properties[cid] = answer.properties
        following = max(map(self.partition_of, self.properties), default=-1) + 1
        unnumbered = sorted((cid for cid, answer in answers.items() if answer.partition < 0), key=node_order)
        for number, cid in enumerate(unnumbered):
            self.properties[cid] = {**answers[cid].properties, PARTITION_ID: following + number}

    def connected(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """Partition -> a connected node serving it; a node not seen before is asked its partition first.

        A node that cannot answer is left out (and asked again next time); one whose
        own data or answer is at fault, or that claims a partition another new node
        claims too, is left out for the run (one line per cause, naming the nodes).
        A new node claiming the partition of a connected node admitted before waits:
        it is asked again next time (a device restarted under a new node id gets in
        once its old id has gone).
        """
        proxies = self._not_excluded(client_manager)
        if not proxies:
            log(WARNING, "no node is connected; waiting up to %d s for one", WAIT_S)
            client_manager.wait_for(1, timeout=WAIT_S)
            proxies = self._not_excluded(client_manager)
        new = [proxy for cid, proxy in proxies.items() if cid not in self.properties]
        answers = [self.screen_code(a) for a in _ask(new, {}, reply_seconds(self.reply_s, len(new)))]
        stale = [(p, a) for p, a in zip(new, answers, strict=True) if is_stale_run(a)]
        if stale:  # without a preflight, round 1 is where a run that mixes two stamens is found: it stops here
            raise preflight_error(stale, len(new), MixedCodeError)
        held = {self.partition_of(cid): cid for cid in proxies if cid in self.properties}
        answers, kept = screened(new, answers, held=held)
        refused = []
        for proxy, answer in zip(new, answers, strict=True):
            problem = problem_of(answer)
            if problem is not None and scope_of(answer) == "node":
                self.excluded[proxy.cid] = problem
                refused.append((proxy, answer))
            elif problem is not None:
                log(WARNING, "node %s is not admitted this round: %s", escaped(proxy.cid), problem)
        for line in condensed(failure_groups(refused, len(new))):
            log(WARNING, "left out of the run: %s", line)
        self._keep([(proxy, kept[proxy.cid]) for proxy in new if proxy.cid in kept])
        by_partition: dict[int, ClientProxy] = {}
        for cid, proxy in sorted(proxies.items()):
            if cid in self.properties:
                by_partition.setdefault(self.partition_of(cid), proxy)
        return by_partition

    def _not_excluded(self, client_manager: ClientManager) -> dict[str, ClientProxy]:
        return {cid: proxy for cid, proxy in client_manager.all().items() if cid not in self.excluded}

    def partition_of(self, node: str) -> int:
        """The partition ``node`` reported (or was given)."""
        return int(self.properties[node][PARTITION_ID])

    def declared(self, node: str) -> Declared:
        """What ``node`` (a proxy's ``cid``) declared of its data in the preflight, checked; ``None`` where it did not.

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
        """Every admitted node's data, by partition: its data-dir, examples per split, examples per class.

        Classes are named by ``class_names`` where given (a user's own data), else by index.
        """
        report = []
        for answer, declared in sorted(self._reported(), key=lambda pair: int(pair[0][PARTITION_ID])):
            entry: dict[str, object] = {"partition": int(answer[PARTITION_ID])}
            if answer.get(DATA_DIR):
                entry[DATA_DIR] = str(answer[DATA_DIR])
            entry.update({NUM_TRAIN: declared.num_train or 0, NUM_TEST: declared.num_test or 0})
            if answer.get(DATA_FINGERPRINT):
                entry[DATA_FINGERPRINT] = str(answer[DATA_FINGERPRINT])
            for key, counts in ((TRAIN_CLASSES, declared.train_classes), (TEST_CLASSES, declared.test_classes)):
                if counts is not None:
                    entry[key] = named_counts(counts, class_names)
            if answer.get(RAY_NODE):
                entry[RAY_NODE] = str(answer[RAY_NODE])
            report.append(entry)
        return report

    def ray_nodes(self) -> dict[str, int]:
        """Admitted clients per Ray node they answered the preflight on (empty outside Ray), most first (escaped)."""
        counts = Counter(escaped(a[RAY_NODE]) for a, _ in self._reported() if a.get(RAY_NODE))
        return dict(counts.most_common())

    def _reported(self) -> list[tuple[dict[str, Scalar], Declared]]:
        """The answers nodes gave, with what they declared: a sampled preflight's sample, else every admitted node's."""
        if self.sampled:
            return [(answer.properties, answer.declared) for answer in self.sampled]
        return [(answer, self.declared(cid)) for cid, answer in self.properties.items()]


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


def named_counts(counts: dict[int, int], class_names: tuple[str, ...] = ()) -> dict[str, int]:
    """``{0: 12, 3: 40}`` -> ``{"0": 12, "3": 40}``, or by name (``{"cat": 12, ...}``) where ``class_names`` name it."""
    return {class_names[index] if index < len(class_names) else str(index): count for index, count in counts.items()}


def data_lines(report: list[dict[str, object]]) -> list[str]:
    """The preflight's log lines on the nodes' data: one per node up to ``LISTED_NODES``, else a summary."""
    if not report:
        return []
    if len(report) > LISTED_NODES:
        sizes = sorted(int(entry[NUM_TRAIN]) for entry in report)
        return [f"{len(report)} clients hold {sizes[0]} to {sizes[-1]} training examples (median "
                f"{sizes[len(sizes) // 2]}); each client's counts are in summary.json"]  # fmt: skip
    lines = []
    for entry in report:
        where = f" ({escaped(entry[DATA_DIR])})" if DATA_DIR in entry else ""
        classes = entry.get(TRAIN_CLASSES)
        held = f"; train classes {', '.join(f'{k} {v}' for k, v in classes.items())}" if classes else ""
        lines.append(f"partition {entry['partition']}{where}: {entry[NUM_TRAIN]} train, {entry[NUM_TEST]} test"
                     f"{held}")  # fmt: skip
    return lines


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
    if not _is_int(partition) or partition < -1:
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(answer: dict[str, Scalar], key: str) -> int | None:
    """``answer[key]`` as a count, ``None`` when absent."""
    if key not in answer:
        return None
    value = answer[key]
    if not _is_int(value) or value < 0:
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
    proxies: list[ClientProxy], answers: list[dict[str, Scalar] | Exception], *, held: Mapping[int, str] | None = None
) -> tuple[list[dict[str, Scalar] | Exception], dict[str, Checked]]:
    """The answers with each refused one made a refusal, and the others checked (node id -> :class:`Checked`).

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
    for i, (proxy, answer) in enumerate(zip(proxies, answers, strict=True)):
        if problem_of(answer) is None and isinstance(answer, dict):
            try:
                kept[proxy.cid] = checked(answer)
            except PropertyError as err:
                answers[i] = _refusal(str(err), f"the node's answer: {shown(answer, PROBLEM_CHARS)}")
    claims: dict[int, list[str]] = {}
    for cid, answer in kept.items():
        if answer.partition >= 0:
            claims.setdefault(answer.partition, []).append(cid)
    index = {proxy.cid: i for i, proxy in enumerate(proxies)}
    for partition, cids in claims.items():
        if len(cids) > 1:
            why = (f"partition {partition} is claimed by {len(cids)} nodes; the server cannot tell which holds it, "
                   "so none of them takes part (give each node its own partition-id)")  # fmt: skip
        elif held and partition in held:
            why = f"partition {partition} is served by node {escaped(held[partition])}; this node is asked again later"
        else:
            continue
        for cid in cids:
            answers[index[cid]] = _refusal(why, "", scope="node" if len(cids) > 1 else LATER)
            del kept[cid]
    return answers, kept


def _refusal(why: str, detail: str, *, scope: str = "node") -> dict[str, Scalar]:
    """A problem answer made by the server: it carries no partition or data-dir, so the node is named by its id."""
    return {PREFLIGHT_ERROR: why, PREFLIGHT_SCOPE: scope, PREFLIGHT_DETAIL: detail}


def node_order(cid: str) -> tuple[int, int, str]:
    """Sort key of node ids: Flower's (decimal integers) by value, then any other text."""
    return (0, int(cid), "") if cid.isascii() and cid.isdigit() else (1, 0, cid)


def escaped(text: object, limit: int = NAME_CHARS) -> str:
    r"""``text`` safe for one log line: each non-printable character written as a repr writes it, cut to ``limit``.

    A newline, a terminal escape or a bidirectional override in a node's string becomes
    ``\n``, ``\x1b``, ``\u202e``, so it cannot start a forged log line or recolour one;
    printable text (a non-ASCII folder name too) stays as it is. A cut ends in ``...``.

    >>> escaped("a\nb\x1b[31m")
    'a\\nb\\x1b[31m'
    """
    raw = str(text)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in raw[:limit])
    return out[:limit] + "..." if len(out) > limit or len(raw) > limit else out


def shown(value: object, limit: int = NAME_CHARS) -> str:
    """A node's value in a log line: its repr (quoted where a text), escaped and cut (:func:`escaped`)."""
    return escaped(repr(value), limit)


def reply_seconds(timeout: float, asked: int) -> float:
    """Seconds the server waits for ``asked`` nodes' answers: ``timeout``, else the default scaled to ``asked``.

    The default is ``REPLY_S`` plus ``REPLY_S_PER_NODE`` for each node beyond ``REPLY_NODES``.
    """
    return timeout if timeout > 0 else REPLY_S + REPLY_S_PER_NODE * max(0, asked - REPLY_NODES)


def _ask(
    proxies: list[ClientProxy], config: dict[str, Scalar], reply_s: float = REPLY_S
) -> list[dict[str, Scalar] | Exception]:
    """Every proxy's properties, or the exception that came back instead (its reason travels in the message).

    Nodes reached through one Flower grid (every ServerApp's) are asked all at once:
    Flower's proxy waits for its one reply by polling the grid (every 0.1 s in a
    simulation), so asking node by node, even eight at a time, made the preflight of
    1,000 nodes take tens of seconds of waiting.
    """
    grids = {id(p.grid) for p in proxies if isinstance(p, GridClientProxy)}
    if proxies and len(grids) == 1 and all(isinstance(p, GridClientProxy) for p in proxies):
        return _ask_at_once(proxies, config, reply_s)

    def ask(proxy: ClientProxy) -> dict[str, Scalar] | Exception:
        try:
            return dict(proxy.get_properties(GetPropertiesIns(config=config), timeout=reply_s, group_id=0).properties)
        except Exception as err:
            return err

    if not proxies:
        return []
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(ask, proxies))


def _ask_at_once(
    proxies: list[GridClientProxy], config: dict[str, Scalar], reply_s: float
) -> list[dict[str, Scalar] | Exception]:
    """The properties of every node behind one grid: one push of a message per node, one wait for all replies.

    The messages and the reading of the replies are those of Flower's
    ``GridClientProxy.get_properties``, and a failed node's exception reads the same.
    """
    messages = [
        Message(content=compat.getpropertiesins_to_recorddict(GetPropertiesIns(config=config)),
                dst_node_id=proxy.node_id, message_type=MessageTypeLegacy.GET_PROPERTIES, ttl=reply_s)
        for proxy in proxies
    ]  # fmt: skip
    received = proxies[0].grid.send_and_receive(messages, timeout=reply_s)
    replies = {reply.metadata.src_node_id: reply for reply in received}
    answers: list[dict[str, Scalar] | Exception] = []
    for proxy in proxies:
        reply = replies.get(proxy.node_id)
        if reply is None:
            answers.append(TimeoutError(f"{NO_REPLY} {reply_s:g} s"))  # the same text for every silent node: one cause
        elif reply.has_error():
            answers.append(ValueError(f"Message contains an Error (reason: {reply.error.reason}). It originated "
                                      "during client-side execution of a message."))  # fmt: skip
        else:
            answers.append(dict(compat.recorddict_to_getpropertiesres(reply.content).properties))
    return answers


class PreflightError(RuntimeError):
    """Some nodes cannot start: ``lines`` has one line per distinct cause, ``detail`` every node's full report.

    ``groups`` holds the causes as data (:func:`failure_groups`), for ``summary.json``.
    """

    def __init__(self, lines: list[str], detail: str, groups: list[dict] | None = None) -> None:
        super().__init__("stamen preflight: " + "; ".join(lines))
        self.lines = lines
        self.detail = detail
        self.groups = groups or []


class MixedCodeError(PreflightError):
    """Round 1 of a run without a preflight found simulated clients running other stamen code than the server."""

    def __str__(self) -> str:
        return "stamen: before round 1: " + "; ".join(self.lines)


def is_stale_run(answer: dict[str, Scalar] | Exception) -> bool:
    """Whether ``answer`` is :meth:`NodeDirectory.screen_code`'s refusal of a run that mixes two stamens."""
    return isinstance(answer, dict) and answer.get(PREFLIGHT_DETAIL) == STALE and answer.get(PREFLIGHT_SCOPE) == "run"


def problem_of(answer: dict[str, Scalar] | Exception) -> str | None:
    """Why a node's answer means it cannot start (one line, escaped: the node wrote it), or ``None`` if it can."""
    if isinstance(answer, Exception):
        # Flower's error carries the client's traceback; its last line names the exception
        lines = [line.strip() for line in str(answer).splitlines() if line.strip()]
        return escaped(lines[-1], PROBLEM_CHARS) if lines else type(answer).__name__
    error = answer.get(PREFLIGHT_ERROR)
    return escaped(error, PROBLEM_CHARS) if error else None


def scope_of(answer: dict[str, Scalar] | Exception) -> str:
    """``node`` when a node's answer blames its own data, else ``run``."""
    return "run" if isinstance(answer, Exception) else str(answer.get(PREFLIGHT_SCOPE, "run"))


def _who(proxy: ClientProxy, answer: dict[str, Scalar] | Exception) -> int | str:
    """A node's partition when it names one, else its data-dir, else its (random) node id; strings escaped.

    A problem answer is not checked (:func:`checked`): a ``partition-id`` that is not a
    non-negative int is passed over.
    """
    partition = -1 if isinstance(answer, Exception) else answer.get(PARTITION_ID, -1)
    if _is_int(partition) and partition >= 0:
        return partition
    if isinstance(answer, dict) and answer.get(DATA_DIR):
        return f"data-dir {escaped(answer[DATA_DIR])}"
    return f"node {escaped(proxy.cid)}"


def ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    spans: list[list[int]] = []
    for number in sorted(set(numbers)):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def failure_groups(problems: list[tuple[ClientProxy, dict[str, Scalar] | Exception]], asked: int) -> list[dict]:
    """The problems grouped by cause, most common first: ``cause``, ``count``, ``asked``, the first few ``clients``.

    The cause is the problem's text with node ids taken out (:func:`strategies.failures.cause_of`),
    so a hundred nodes failing the same way make one group whatever their ids.
    """
    groups = []
    for cause, who in by_cause((_who(proxy, answer), problem_of(answer) or "") for proxy, answer in problems):
        partitions = [w for w in who if isinstance(w, int)]
        plural = "s" if len(partitions) > 1 else ""
        named = [f"partition{plural} {ranges(partitions)}"] if partitions else []
        named += [w for w in who if isinstance(w, str)]
        groups.append({"cause": cause + _advice(cause, len(who), asked), "count": len(who), "asked": asked,
                       "clients": first_of(named, LISTED_CLIENTS)})  # fmt: skip
    return groups


def _advice(cause: str, silent: int, asked: int) -> str:
    """What to do about a cause the server itself names (no reply within the wait)."""
    if not cause.startswith(NO_REPLY):
        return ""
    return (f" ({asked - silent} of {asked} answered; run config key {REPLY_KEY!r} sets the wait: raise it on a "
            "loaded machine or a large federation, where each node's first message imports torch and loads its data)")


def preflight_error(
    problems: list[tuple[ClientProxy, dict[str, Scalar] | Exception]], asked: int,
    kind: type[PreflightError] | None = None,
) -> PreflightError:
    """The error (``kind``, default :class:`PreflightError`) for ``problems``: its lines, every report, its groups."""
    groups = failure_groups(problems, asked)
    return (kind or PreflightError)(condensed(groups), details(problems), groups)


def condensed(groups: list[dict]) -> list[str]:
    """One line per group (:func:`failure_groups`): how many clients of those asked, which ones, and the cause."""
    return [f"{g['count']} of {g['asked']} clients ({', '.join(g['clients'])}): {g['cause']}" for g in groups]


def details(problems: list[tuple[ClientProxy, dict[str, Scalar] | Exception]]) -> str:
    """Every failing node's full report (its traceback), for a log file."""
    parts = []
    for proxy, answer in problems:
        who = _who(proxy, answer)
        label = f"partition {who} (node {proxy.cid})" if isinstance(who, int) else str(who)
        body = str(answer) if isinstance(answer, Exception) else str(answer.get(PREFLIGHT_DETAIL, ""))
        parts.append(f"===== {label}: {problem_of(answer)}\n{body.rstrip()}\n")
    return "\n".join(parts)
