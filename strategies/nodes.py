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

from strategies.contracts.common import PARTITION_ID

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
        for the data, a missing ``data-dir``, a batch larger than its data) means the
        run cannot work as asked: it stops now with the nodes' reasons instead of
        recording every round as failed.
        """
        proxies = list(client_manager.all().values())
        answers = _ask(proxies, config)
        problems = [f"client {p.cid}: {a}" for p, a in zip(proxies, answers, strict=True) if isinstance(a, Exception)]
        if problems:
            shown = "\n".join(problems[:3]) + (f"\n(and {len(problems) - 3} more)" if len(problems) > 3 else "")
            raise RuntimeError(f"stamen preflight: {len(problems)} of {len(proxies)} clients cannot start:\n{shown}")
        self.properties.update({p.cid: a for p, a in zip(proxies, answers, strict=True)})
        log(INFO, "preflight: all %d connected clients accept the config", len(proxies))

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
            if isinstance(answer, Exception):
                log(WARNING, "node %s did not report its partition: %s", proxy.cid, answer)
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
