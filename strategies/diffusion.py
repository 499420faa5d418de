"""Asynchronous diffusion on Flower: the server holds every agent's model and combines them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from logging import INFO, WARNING

import numpy as np
from flwr.common import (
    EvaluateIns,
    FitIns,
    FitRes,
    GetPropertiesIns,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from strategies.checkpoint import CheckpointError
from strategies.fedavg import PREFLIGHT_REPLY_S, PREFLIGHT_WORKERS, PersonalisedFedAvg
from strategies.topology import Network, NetworkSettings, build_network, combine, disagreement
from strategies.vectors import flatten, unflatten

PARTITION_ID, NUM_PARTITIONS = "partition-id", "num-partitions"


class Diffusion(PersonalisedFedAvg):
    """Asynchronous diffusion with random participation and neighbour subsampling (ALGORITHMS.md section 3).

    The server plays the network: it holds one model per agent (agent = partition,
    float32, ``4 x parameters`` bytes each, twice that while combining), maps each Flower node to its agent
    through the node's ``partition-id`` (asked once per new node), and every round

    1. draws who takes part (agent k with probability ``q_k``) and sends each
       participant its own model with ``mu`` and ``local-steps`` (T);
    2. receives ``psi_k`` from each participant (a failed or rejected reply counts
       as non-participation);
    3. draws the round's combination matrix (``mode = "diffusion"``: seed eq. 9;
       ``fedavg`` / ``fedsgd``: eq. 15 / 14) and sets ``w_k = sum_l a_lk psi_l``.

    Flower's "global model" is the network mean. Evaluation rounds test every
    agent's own model on its own test split. Each record carries the agents that
    took part and the network disagreement (mean squared distance to the mean).

    Parameters
    ----------
    network
        Graph, combination rule, probabilities and mode; built once the number of
        agents is known (the clients' ``num-partitions``).
    mu, local_steps, batch_size
        The participants' local SGD.
    snapshot_every
        Keep every agent's model every this many rounds and write them (with the
        network) through the recorder as ``agents.npz`` at the end; 0 = never.
    **kwargs
        Passed to :class:`PersonalisedFedAvg` (the preflight is always on: it
        builds the node map).

    """

    def __init__(
        self,
        *,
        network: NetworkSettings,
        mu: float,
        local_steps: int,
        batch_size: int,
        snapshot_every: int = 0,
        **kwargs,
    ) -> None:
        if not mu > 0:
            raise ValueError(f"mu must be > 0, got {mu}")
        if local_steps < 1:
            raise ValueError(f"local-steps must be >= 1, got {local_steps}")
        kwargs.setdefault("name", "diffusion")
        kwargs["preflight"] = True
        fit_config = {"mu": mu, "local-steps": local_steps, "local-epochs": 0.0, "batch-size": batch_size}
        super().__init__(fit_config=fit_config, **kwargs)
        self.network_settings = network
        self.snapshot_every = snapshot_every
        self.rng = np.random.default_rng([network.seed, 1])  # participation and neighbour draws
        self.network: Network | None = None
        self.agents = np.zeros((0, 0), dtype=np.float32)  # row k: agent k's model, flattened
        self.shapes: list[tuple[int, ...]] = []
        self.node_agent: dict[str, int] = {}
        self.snapshots: list[tuple[int, np.ndarray]] = []

    # -------------------------------------------------------------- start of run

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Preflight, then build the network for the clients' number of partitions; every agent starts at w_0."""
        initial = super().initialize_parameters(client_manager)
        counts = {int(p.get(NUM_PARTITIONS, 0)) for p in self.node_properties.values()}
        if len(counts) != 1 or min(counts) < 1:
            raise RuntimeError(f"diffusion needs every node to report the same num-partitions; got {sorted(counts)}")
        num_agents = counts.pop()
        self.network = build_network(self.network_settings, num_agents)
        arrays = parameters_to_ndarrays(initial)
        self.shapes = [a.shape for a in arrays]
        self.agents = np.tile(flatten(arrays), (num_agents, 1))
        for cid, props in self.node_properties.items():
            self._map_node(cid, int(props[PARTITION_ID]))
        self.recorder.save_arrays("topology", self.network.arrays())
        weights = self.network.weights
        log(INFO, "diffusion: %d agents, mode %s, graph %s, %s; %d bytes per agent model; objective weights "
            "p_k q_k from %.4f to %.4f", num_agents, self.network.mode, self.network_settings.graph,
            self.network_settings.combination, self.agents[0].nbytes, weights.min(), weights.max())  # fmt: skip
        return initial

    def strategy_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Every agent's model, the node map, the participation RNG and the snapshots taken so far."""
        arrays = {"diffusion/agents": self.agents.copy()}  # combining updates the agents in place
        if self.snapshots:
            rounds, models = zip(*self.snapshots, strict=True)
            arrays.update({"diffusion/snapshot-rounds": np.array(rounds), "diffusion/snapshots": np.stack(models)})
        state = {"node-agent": self.node_agent, "rng": self.rng.bit_generator.state,
                 "num-agents": self.network.num_agents}  # fmt: skip
        return arrays, state

    def restore_strategy_state(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        agents = arrays.get("diffusion/agents")
        if agents is None or agents.shape != self.agents.shape:
            raise CheckpointError(
                f"checkpoint holds agents of shape {None if agents is None else agents.shape}; this run's network "
                f"has {self.agents.shape} (agents x parameters)"
            )
        self.agents = agents.astype(np.float32)
        self.rng.bit_generator.state = state["rng"]
        # a node still connected keeps its agent; the preflight's fresh answers win where they differ
        self.node_agent = {**{cid: int(a) for cid, a in state["node-agent"].items()}, **self.node_agent}
        if "diffusion/snapshots" in arrays:
            self.snapshots = list(zip(arrays["diffusion/snapshot-rounds"].tolist(), arrays["diffusion/snapshots"],
                                      strict=True))  # fmt: skip

    def _map_node(self, cid: str, agent: int) -> None:
        if not 0 <= agent < len(self.agents):
            log(WARNING, "node %s reports partition-id %s, outside the %d agents", cid, agent, len(self.agents))
            return
        self.node_agent[cid] = agent

    def agent_proxies(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """Agent -> connected node; a node seen for the first time is asked its partition once."""
        proxies = client_manager.all()
        new = [proxy for cid, proxy in proxies.items() if cid not in self.node_agent]
        if new:
            ins = GetPropertiesIns(config={})
            with ThreadPoolExecutor(max_workers=PREFLIGHT_WORKERS) as pool:
                answers = list(pool.map(lambda p: _partition_of(p, ins), new))
            for proxy, agent in zip(new, answers, strict=True):
                if agent is not None:
                    self._map_node(proxy.cid, agent)
        by_agent: dict[int, ClientProxy] = {}
        for cid, proxy in sorted(proxies.items()):
            agent = self.node_agent.get(cid)
            if agent is not None:
                by_agent.setdefault(agent, proxy)  # two nodes claiming one agent: the first one serves it
        return by_agent

    # ------------------------------------------------------------------ training

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        self.expected_shapes = list(self.shapes)
        self.open_round(server_round)
        proxies = self.agent_proxies(client_manager)
        drawn = self.rng.random(self.network.num_agents) < self.network.participation
        chosen = [k for k in np.flatnonzero(drawn) if k in proxies]
        config = self.fit_config(server_round)
        self.round_record.update(
            {"agents-drawn": int(drawn.sum()), "agents-offline": int(drawn.sum()) - len(chosen),
             "clients-sampled": len(chosen)}
        )  # fmt: skip
        return [(proxies[k], FitIns(self.agent_parameters(k), config)) for k in chosen]

    def agent_parameters(self, agent: int) -> Parameters:
        return ndarrays_to_parameters(unflatten(self.agents[agent], self.shapes))

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        accepted, rejected = self.screen_fit_replies(server_round, results, failures)
        psi = self.agents  # updated in place: an agent without an accepted reply keeps psi_k = w_k
        took_part = np.zeros(self.network.num_agents, dtype=bool)
        for proxy, res in accepted:
            agent = self.node_agent[proxy.cid]
            psi[agent] = flatten(self.reply_arrays(res))
            took_part[agent] = True
        self.agents = combine(self.network.draw(took_part, self.rng), psi)
        mean = self.agents.mean(axis=0, dtype=np.float64).astype(np.float32)
        self.current_parameters = ndarrays_to_parameters(unflatten(mean, self.shapes))
        metrics = self.fit_metrics(accepted)
        metrics.update({"agents-participated": int(took_part.sum()), "disagreement": disagreement(self.agents)})
        self.record_fit(accepted, rejected, failures, metrics)
        if self.snapshot_every and (server_round % self.snapshot_every == 0 or server_round == self.num_rounds):
            self.snapshots.append((server_round, self.agents.copy()))
        return self.current_parameters, metrics

    def close_round(self, server_round: int) -> None:
        super().close_round(server_round)
        if server_round == self.num_rounds and self.snapshots:
            rounds, models = zip(*self.snapshots, strict=True)
            self.recorder.save_arrays("agents", {"rounds": np.array(rounds), "models": np.stack(models)})

    # ---------------------------------------------------------------- evaluation

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.is_evaluation_round(server_round) or self.fraction_evaluate == 0:
            self.close_round(server_round)
            return []
        config = {**self.evaluate_config(server_round), "adapt-steps": 0}  # each agent's own model, as it is
        proxies = self.agent_proxies(client_manager)
        instructions = [(proxy, EvaluateIns(self.agent_parameters(k), config)) for k, proxy in sorted(proxies.items())]
        if not instructions:
            self.close_round(server_round)
        return instructions


def _partition_of(proxy: ClientProxy, ins: GetPropertiesIns) -> int | None:
    try:
        return int(proxy.get_properties(ins, timeout=PREFLIGHT_REPLY_S, group_id=0).properties[PARTITION_ID])
    except Exception as err:  # a node that cannot say which agent it is takes no part
        log(WARNING, "node %s did not report its partition-id: %s", proxy.cid, err)
        return None
