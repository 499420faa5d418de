"""Which partition each connected Flower node serves, asked once per node, and the preflight.

The server sees node ids only (random 64-bit numbers); the partition a node serves
lives in its ``node_config``. Each node is asked for its properties once (with the
first round's fit config in the preflight, so it also checks that config against
its data) and the answer is cached for the run.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from logging import INFO, WARNING

from flwr.common import GetPropertiesIns, Scalar
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.contracts.common import PARTITION_ID, PREFLIGHT_DETAIL, PREFLIGHT_ERROR

WAIT_S = 600  # how long to wait for nodes to connect
REPLY_S = 300  # a node that has not answered by then counts as unable to start
WORKERS = 8


class NodeDirectory:
    """Node id -> the properties it reported (``partition-id``, ``num-partitions``, data sizes)."""

    def __init__(self) -> None:
        self.properties: dict[str, dict[str, Scalar]] = {}

    def wait_for(self, client_manager: ClientManager, count: int) -> None:
        """Wait (up to ``WAIT_S``) until ``count`` nodes are connected; go on with fewer, with a warning."""
        if not client_manager.wait_for(count, timeout=WAIT_S):
            log(WARNING, "only %d of the %d nodes asked for connected within %d s; going on with them",
                client_manager.num_available(), count, WAIT_S)  # fmt: skip

    def preflight(self, client_manager: ClientManager, config: dict[str, Scalar]) -> None:
        """Ask every connected node for its properties with ``config``; stop the run if any cannot start.

        Every node shares the run config, so one that cannot start (too many clients
        for the data, a missing ``data-dir``, a batch larger than its data, no GPU)
        means the run cannot work as asked: it stops now with the nodes' reasons,
        one line per distinct cause, instead of recording every round as failed.

        Raises
        ------
        PreflightError
            With those lines and every node's full report.

        """
        proxies = list(client_manager.all().values())
        answers = _ask(proxies, config)
        problems = [(p, a) for p, a in zip(proxies, answers, strict=True) if problem_of(a) is not None]
        if problems:
            raise PreflightError(condensed(problems, len(proxies)), details(problems))
        self.properties.update({p.cid: a for p, a in zip(proxies, answers, strict=True)})
        log(INFO, "preflight: all %d connected clients accept the config", len(proxies))
        largest = max((int(a.get("num-train", 0)) for a in answers), default=0)
        batch = config.get("batch-size")
        if isinstance(batch, int | float) and largest and batch > largest:
            log(WARNING, "run config key 'batch-size': %s exceeds every client's training set (the largest holds "
                "%d examples); every local step uses a client's whole set", batch, largest)  # fmt: skip

    def connected(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """Partition -> a connected node serving it; a node not seen before is asked its partition first.

        A node that cannot answer is left out (and asked again next time); where two
        nodes claim one partition, the one with the smaller node id serves it.
        """
        proxies = client_manager.all()
        if not proxies:
            log(WARNING, "no node is connected; waiting up to %d s for one", WAIT_S)
            client_manager.wait_for(1, timeout=WAIT_S)
            proxies = client_manager.all()
        new = [proxy for cid, proxy in proxies.items() if cid not in self.properties]
        for proxy, answer in zip(new, _ask(new, {}), strict=True):
            problem = problem_of(answer)
            if problem is not None:
                log(WARNING, "node %s did not report its partition: %s", proxy.cid, problem)
            else:
                self.properties[proxy.cid] = answer
        by_partition: dict[int, ClientProxy] = {}
        for cid, proxy in sorted(proxies.items()):
            if cid in self.properties:
                by_partition.setdefault(int(self.properties[cid][PARTITION_ID]), proxy)
        return by_partition

    def partition_of(self, node: str) -> int:
        """The partition ``node`` reported."""
        return int(self.properties[node][PARTITION_ID])


def _ask(proxies: list[ClientProxy], config: dict[str, Scalar]) -> list[dict[str, Scalar] | Exception]:
    """Every proxy's properties, or the exception that came back instead (its reason travels in the message)."""

    def ask(proxy: ClientProxy) -> dict[str, Scalar] | Exception:
        try:
            return dict(proxy.get_properties(GetPropertiesIns(config=config), timeout=REPLY_S, group_id=0).properties)
        except Exception as err:
            return err

    if not proxies:
        return []
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(ask, proxies))


class PreflightError(RuntimeError):
    """Some nodes cannot start: ``lines`` has one line per distinct cause, ``detail`` every node's full report."""

    def __init__(self, lines: list[str], detail: str) -> None:
        super().__init__("stamen preflight: " + "; ".join(lines))
        self.lines = lines
        self.detail = detail


def problem_of(answer: dict[str, Scalar] | Exception) -> str | None:
    """Why a node's answer means it cannot start (one line), or ``None`` if it can."""
    if isinstance(answer, Exception):
        # Flower's error carries the client's traceback; its last line names the exception
        lines = [line.strip() for line in str(answer).splitlines() if line.strip()]
        return lines[-1] if lines else type(answer).__name__
    error = answer.get(PREFLIGHT_ERROR)
    return str(error) if error else None


def _who(proxy: ClientProxy, answer: dict[str, Scalar] | Exception) -> int | str:
    partition = -1 if isinstance(answer, Exception) else int(answer.get(PARTITION_ID, -1))
    return partition if partition >= 0 else f"node {proxy.cid}"


def ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    spans: list[list[int]] = []
    for number in sorted(set(numbers)):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def condensed(problems: list[tuple[ClientProxy, dict[str, Scalar] | Exception]], asked: int) -> list[str]:
    """One line per distinct cause: how many clients, which partitions (or nodes), and the cause."""
    by_cause: dict[str, list[int | str]] = {}
    for proxy, answer in problems:
        by_cause.setdefault(problem_of(answer) or "", []).append(_who(proxy, answer))
    lines = []
    for cause, who in sorted(by_cause.items(), key=lambda item: -len(item[1])):
        partitions = [w for w in who if isinstance(w, int)]
        named = ([f"partitions {ranges(partitions)}"] if partitions else []) + [w for w in who if isinstance(w, str)]
        lines.append(f"{len(who)} of {asked} clients ({', '.join(named[:6])}{', ...' if len(named) > 6 else ''}): "
                     f"{cause}")  # fmt: skip
    return lines


def details(problems: list[tuple[ClientProxy, dict[str, Scalar] | Exception]]) -> str:
    """Every failing node's full report (its traceback), for a log file."""
    parts = []
    for proxy, answer in problems:
        who = _who(proxy, answer)
        label = f"partition {who} (node {proxy.cid})" if isinstance(who, int) else str(who)
        body = str(answer) if isinstance(answer, Exception) else str(answer.get(PREFLIGHT_DETAIL, ""))
        parts.append(f"===== {label}: {problem_of(answer)}\n{body.rstrip()}\n")
    return "\n".join(parts)
