"""Which partition each connected Flower node serves, asked once per node, and the preflight.

The server sees node ids only (random 64-bit numbers); the partition a node serves
lives in its ``node_config``. Each node is asked for its properties once (with the
first round's fit config in the preflight, so it also checks that config against
its data) and the answer is cached for the run.

A deployed device with its own data (``--node-config "data-dir=..."``) may have no
partition number: the server numbers such nodes after the numbered ones, in the order
of their data-dir (then node id), and sends each its number in every instruction. A
node whose own data is at fault (scope ``node``) is left out of the run with its
reason logged; any other fault stops the run.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
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


class NodeDirectory:
    """Node id -> the properties it reported (``partition-id``, ``num-partitions``, data sizes and classes).

    ``excluded`` holds the nodes left out of the run (node id -> why).
    """

    def __init__(self, *, code: dict[str, str] | None = None, reply_s: float = 0.0) -> None:
        self.code = code if code is not None else code_identity()  # the server's: every node must run the same
        self.reply_s = reply_s  # the run's preflight-timeout (0: reply_seconds decides by the nodes asked)
        self.properties: dict[str, dict[str, Scalar]] = {}
        self.excluded: dict[str, str] = {}
        self.sampled: list[dict[str, Scalar]] = []  # a sampled preflight's answers (the data report's sample)

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
        every round as failed. A node whose own data is at fault is left out instead.

        Returns
        -------
        PreflightError or None
            The nodes left out for faults in their own data, if any (the run goes on).

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
        problems = [(p, a) for p, a in zip(proxies, answers, strict=True) if problem_of(a) is not None]
        own_data = [(p, a) for p, a in problems if scope_of(a) == "node"]
        if len(problems) > len(own_data) or (own_data and len(own_data) == len(proxies)):
            groups = failure_groups(problems, len(proxies))
            lines = condensed(groups)
            if problems == own_data:
                lines.append("no node is left to train")
            raise PreflightError(lines, details(problems), groups)
        self.excluded.update({p.cid: problem_of(a) or "" for p, a in own_data})
        self.admit([(p, a) for p, a in zip(proxies, answers, strict=True) if problem_of(a) is None])
        log(INFO, "preflight: %d of %d connected clients accept the config", len(proxies) - len(own_data),
            len(proxies))  # fmt: skip
        warn_of_batch(config, answers)
        return preflight_error(own_data, len(proxies)) if own_data else None

    def _sampled_preflight(self, proxies: list[ClientProxy], config: dict[str, Scalar], sample: int, seed: int) -> bool:
        """Ask ``sample`` nodes (seeded); if they are simulated slices of one dataset, number every node and say so.

        A node that holds a partition of the run's dataset (no ``data-dir``, ``num-partitions``
        equal to the nodes connected) can serve any partition: the server numbers the
        nodes 0 to N-1 in node-id order without asking them, and each loads the partition
        it is sent (:meth:`clients.base.TorchClient.take_partition`); the clients' batches
        follow the partition, so the run is the one a full preflight gives. Otherwise
        (devices with their own data) every node must be asked: returns False.

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
        if any(a.get(DATA_DIR) or int(a.get(NUM_PARTITIONS, 0)) != len(ordered) for a in answers):
            log(INFO, "preflight: the nodes asked hold their own data or another number of partitions than the %d "
                "connected; asking every node", len(ordered))  # fmt: skip
            return False
        self.sampled = [dict(a) for a in answers]
        warn_of_batch(config, answers, sampled=True)
        for number, proxy in enumerate(ordered):
            self.properties[proxy.cid] = {PARTITION_ID: number, NUM_PARTITIONS: len(ordered)}
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

    def admit(self, answers: list[tuple[ClientProxy, dict[str, Scalar]]]) -> None:
        """Keep the nodes' answers; number the nodes without a partition after the highest number in use."""
        unnumbered = []
        for proxy, answer in answers:
            if int(answer.get(PARTITION_ID, -1)) >= 0:
                self.properties[proxy.cid] = answer
            else:
                unnumbered.append((proxy, answer))
        taken = [int(a[PARTITION_ID]) for a in self.properties.values()]
        following = max(taken, default=-1) + 1
        for number, (proxy, answer) in enumerate(sorted(unnumbered, key=lambda pa: (str(pa[1].get(DATA_DIR, "")),
                                                                                    pa[0].cid))):  # fmt: skip
            self.properties[proxy.cid] = {**answer, PARTITION_ID: following + number}

    def connected(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """Partition -> a connected node serving it; a node not seen before is asked its partition first.

        A node that cannot answer is left out (and asked again next time); one whose
        own data is at fault is left out for the run. Where two nodes claim one
        partition, the one with the smaller node id serves it.
        """
        proxies = self._not_excluded(client_manager)
        if not proxies:
            log(WARNING, "no node is connected; waiting up to %d s for one", WAIT_S)
            client_manager.wait_for(1, timeout=WAIT_S)
            proxies = self._not_excluded(client_manager)
        new = [proxy for cid, proxy in proxies.items() if cid not in self.properties]
        usable = []
        answers = [self.screen_code(a) for a in _ask(new, {}, reply_seconds(self.reply_s, len(new)))]
        stale = [(p, a) for p, a in zip(new, answers, strict=True) if is_stale_run(a)]
        if stale:  # without a preflight, round 1 is where a run that mixes two stamens is found: it stops here
            raise preflight_error(stale, len(new), MixedCodeError)
        for proxy, answer in zip(new, answers, strict=True):
            problem = problem_of(answer)
            if problem is None:
                usable.append((proxy, answer))
            elif scope_of(answer) == "node":
                self.excluded[proxy.cid] = problem
                log(WARNING, "%s is left out of the run: %s", _who(proxy, answer), problem)
            else:
                log(WARNING, "node %s did not report its partition: %s", proxy.cid, problem)
        self.admit(usable)
        by_partition: dict[int, ClientProxy] = {}
        for cid, proxy in sorted(proxies.items()):
            if cid in self.properties:
                by_partition.setdefault(int(self.properties[cid][PARTITION_ID]), proxy)
        return by_partition

    def _not_excluded(self, client_manager: ClientManager) -> dict[str, ClientProxy]:
        return {cid: proxy for cid, proxy in client_manager.all().items() if cid not in self.excluded}

    def partition_of(self, node: str) -> int:
        """The partition ``node`` reported (or was given)."""
        return int(self.properties[node][PARTITION_ID])

    def label(self, node: str) -> str:
        """``node`` for a log line: its partition and its own data-dir where known, with its node id."""
        answer = self.properties.get(node)
        if answer is None:
            return f"node {node}"
        where = f", data-dir {answer[DATA_DIR]}" if answer.get(DATA_DIR) else ""
        return f"partition {answer[PARTITION_ID]} (node {node}{where})"

    def data_report(self, class_names: tuple[str, ...] = ()) -> list[dict[str, object]]:
        """Every admitted node's data, by partition: its data-dir, examples per split, examples per class.

        Classes are named by ``class_names`` where given (a user's own data), else by index.
        """
        report = []
        for answer in sorted(self._reported(), key=lambda a: int(a[PARTITION_ID])):
            entry: dict[str, object] = {"partition": int(answer[PARTITION_ID])}
            if answer.get(DATA_DIR):
                entry[DATA_DIR] = str(answer[DATA_DIR])
            entry.update({NUM_TRAIN: int(answer.get(NUM_TRAIN, 0)), NUM_TEST: int(answer.get(NUM_TEST, 0))})
            if answer.get(DATA_FINGERPRINT):
                entry[DATA_FINGERPRINT] = str(answer[DATA_FINGERPRINT])
            for key in (TRAIN_CLASSES, TEST_CLASSES):
                if key in answer:
                    entry[key] = named_counts(str(answer[key]), class_names)
            if answer.get(RAY_NODE):
                entry[RAY_NODE] = str(answer[RAY_NODE])
            report.append(entry)
        return report

    def ray_nodes(self) -> dict[str, int]:
        """Admitted clients per Ray node they answered the preflight on (empty outside Ray), most first."""
        counts = Counter(str(a[RAY_NODE]) for a in self._reported() if a.get(RAY_NODE))
        return dict(counts.most_common())

    def _reported(self) -> list[dict[str, Scalar]]:
        """The answers nodes gave: a sampled preflight's sample, else every admitted node's."""
        return self.sampled or list(self.properties.values())


def warn_of_batch(config: dict[str, Scalar], answers: list[dict[str, Scalar] | Exception], *,
                  sampled: bool = False) -> None:  # fmt: skip
    """Warn when ``batch-size`` exceeds the training set of every client that answered.

    Such a run works (a local step uses a client's whole set), but not as its batch size
    says; with a sampled preflight only the sample's sets are known.
    """
    largest = max((int(a.get(NUM_TRAIN, 0)) for a in answers if isinstance(a, dict)), default=0)
    batch = config.get("batch-size")
    if isinstance(batch, int | float) and largest and batch > largest:
        whose = f"the {len(answers)} clients asked" if sampled else "every client"
        log(WARNING, "run config key 'batch-size': %s exceeds the training set of %s (the largest holds %d "
            "examples); every local step uses a client's whole set", batch, whose, largest)  # fmt: skip


def named_counts(text: str, class_names: tuple[str, ...] = ()) -> dict[str, int]:
    """``"0:12 3:40"`` -> ``{"0": 12, "3": 40}``, or by name (``{"cat": 12, ...}``) where ``class_names`` are given."""
    counts = {}
    for item in text.split():
        index, count = item.split(":")
        name = class_names[int(index)] if int(index) < len(class_names) else index
        counts[name] = int(count)
    return counts


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
        where = f" ({entry[DATA_DIR]})" if DATA_DIR in entry else ""
        classes = entry.get(TRAIN_CLASSES)
        held = f"; train classes {', '.join(f'{k} {v}' for k, v in classes.items())}" if classes else ""
        lines.append(f"partition {entry['partition']}{where}: {entry[NUM_TRAIN]} train, {entry[NUM_TEST]} test"
                     f"{held}")  # fmt: skip
    return lines


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
    """Why a node's answer means it cannot start (one line), or ``None`` if it can."""
    if isinstance(answer, Exception):
        # Flower's error carries the client's traceback; its last line names the exception
        lines = [line.strip() for line in str(answer).splitlines() if line.strip()]
        return lines[-1] if lines else type(answer).__name__
    error = answer.get(PREFLIGHT_ERROR)
    return str(error) if error else None


def scope_of(answer: dict[str, Scalar] | Exception) -> str:
    """``node`` when a node's answer blames its own data, else ``run``."""
    return "run" if isinstance(answer, Exception) else str(answer.get(PREFLIGHT_SCOPE, "run"))


def _who(proxy: ClientProxy, answer: dict[str, Scalar] | Exception) -> int | str:
    """A node's partition when it has one, else its data-dir, else its (random) node id."""
    if isinstance(answer, Exception):
        return f"node {proxy.cid}"
    partition = int(answer.get(PARTITION_ID, -1))
    if partition >= 0:
        return partition
    return f"data-dir {answer[DATA_DIR]}" if answer.get(DATA_DIR) else f"node {proxy.cid}"


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
