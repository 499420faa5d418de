"""Asynchronous diffusion on Flower: the server holds every agent's model and combines them."""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
from flwr.common.logger import log

from strategies.aggregation.rules import flatten, unflatten
from strategies.base import FederatedStrategy
from strategies.contracts.client_reports import NUM_PARTITIONS
from strategies.contracts.diffusion import CONTRACT
from strategies.contracts.payload import Scalar
from strategies.methods.combinations import combine, disagreement
from strategies.methods.topology import Network, build_network
from strategies.rounds.checkpoint import CheckpointError
from strategies.screening.replies import Reply


class DiffusionServer(FederatedStrategy):
    """Asynchronous diffusion with random participation and neighbour subsampling (ALGORITHMS.md section 3).

    The server plays the network: it holds one model per agent (agent = partition,
    float32, ``4 x parameters`` bytes each, twice that while combining) and every round

    1. draws who takes part (agent k with probability ``q_k``) and sends each
       participant its own model with ``diffusion-mu`` and ``local-steps`` (T);
    2. receives ``psi_k`` from each participant (a failed or rejected reply counts
       as non-participation);
    3. draws the round's combination matrix (``diffusion-mode = "diffusion"``: seed
       eq. 9; ``fedavg`` / ``fedsgd``: eq. 15 / 14) and sets ``w_k = sum_l a_lk psi_l``.

    Flower's "global model" is the network mean. Evaluation rounds test every agent's
    own model on its own test split, un-adapted. Each record carries the agents drawn
    and heard from and the network disagreement (mean squared distance to the mean).
    The network is built once the preflight has told the number of agents (the
    clients' ``num-partitions``).
    """

    contract = CONTRACT

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rng = np.random.default_rng([self.settings.run.seed, 1])  # participation and neighbour draws
        self.network: Network | None = None
        self.agents = np.zeros((0, 0), dtype=np.float32)  # row k: agent k's model, flattened
        self.snapshots: list[tuple[int, np.ndarray]] = []
        self.drawn: dict[str, Scalar] = {}  # the last fit round's draw, for its record

    def start(self) -> None:
        """Build the network for the clients' number of partitions; every agent starts at w_0."""
        counts = {int(p.get(NUM_PARTITIONS, 0)) for p in self.nodes.properties.values()}
        if counts == {0}:  # devices with their own data, numbered 0 to K-1 by the server: one agent each
            counts = {len(self.nodes.properties)}
        if len(counts) != 1 or min(counts) < 1:
            raise RuntimeError(f"diffusion needs every node to report the same num-partitions; got {sorted(counts)}")
        num_agents = counts.pop()
        self.network = build_network(self.method, num_agents, seed=self.settings.run.seed)
        self.agents = np.tile(flatten(self.global_model), (num_agents, 1))
        self.recorder.save_arrays("topology", self.network.arrays())
        outside = sorted({p for p in map(self.nodes.partition_of, self.nodes.properties) if p >= num_agents})
        if outside:
            log(WARNING, "nodes report partition-ids %s, outside the %d agents; they take no part", outside,
                num_agents)  # fmt: skip
        weights = self.network.weights
        log(INFO, "diffusion: %d agents, mode %s, graph %s, %s; %d bytes per agent model; objective weights "
            "p_k q_k from %.4f to %.4f", num_agents, self.network.mode, self.method.graph, self.method.combination,
            self.agents[0].nbytes, weights.min(), weights.max())  # fmt: skip

    def sample_fit(self, server_round: int, partitions: list[int]) -> list[int]:
        """Agent k takes part with probability q_k, if a node serving it is connected."""
        drawn = self.rng.random(self.network.num_agents) < self.network.participation
        connected = set(partitions)
        chosen = [int(k) for k in np.flatnonzero(drawn) if k in connected]
        self.drawn = {"agents-drawn": int(drawn.sum()), "agents-offline": int(drawn.sum()) - len(chosen)}
        return chosen

    def begin_round(self, server_round: int, partitions: list[int], purpose: str) -> dict[str, Scalar]:
        """For the record: how many agents the round drew, and how many of them had no node connected."""
        return self.drawn if purpose == "fit" else {}

    def sample_evaluate(self, server_round: int, partitions: list[int]) -> list[int]:
        """Every connected agent tests its own model."""
        return [p for p in partitions if p < self.network.num_agents]

    def parameters_for(self, partition: int, purpose: str) -> list[np.ndarray]:
        """Agent ``partition``'s own model, to train from or to test (its update is measured from it)."""
        return unflatten(self.agents[partition], self.shapes)

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        psi = self.agents  # updated in place: an agent without an accepted reply keeps psi_k = w_k
        took_part = np.zeros(self.network.num_agents, dtype=bool)
        for reply in replies:
            psi[reply.partition] = flatten(reply.arrays)
            reply.arrays.clear()  # copied into the agent's row: free the decoded reply before combining
            took_part[reply.partition] = True
        self.agents = combine(self.network.draw(took_part, self.rng), psi)
        every = self.method.snapshot_every
        if every and (server_round % every == 0 or server_round == self.num_rounds):
            self.snapshots.append((server_round, self.agents.copy()))
        mean = self.agents.mean(axis=0, dtype=np.float64).astype(np.float32)
        return unflatten(mean, self.shapes), {"agents-participated": int(took_part.sum()),
                                              "disagreement": disagreement(self.agents)}  # fmt: skip

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Every agent's model, the participation RNG and the snapshots taken so far."""
        arrays = {"diffusion/agents": self.agents.copy()}  # combining updates the agents in place
        if self.snapshots:
            rounds, models = zip(*self.snapshots, strict=True)
            arrays.update({"diffusion/snapshot-rounds": np.array(rounds), "diffusion/snapshots": np.stack(models)})
        return arrays, {"rng": self.rng.bit_generator.state, "num-agents": self.network.num_agents}

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        agents = arrays.get("diffusion/agents")
        if agents is None or agents.shape != self.agents.shape:
            raise CheckpointError(
                f"checkpoint holds agents of shape {None if agents is None else agents.shape}; this run's network "
                f"has {self.agents.shape} (agents x parameters)"
            )
        self.agents = agents.astype(np.float32)
        self.rng.bit_generator.state = state["rng"]
        if "diffusion/snapshots" in arrays:
            self.snapshots = list(zip(arrays["diffusion/snapshot-rounds"].tolist(), arrays["diffusion/snapshots"],
                                      strict=True))  # fmt: skip

    def finish(self) -> None:
        if self.snapshots:
            rounds, models = zip(*self.snapshots, strict=True)
            self.recorder.save_arrays("agents", {"rounds": np.array(rounds), "models": np.stack(models)})
