"""Asynchronous diffusion's contract: the network (server side) and the agents' step size (ALGORITHMS.md 3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.keys import ConfigError, key

if TYPE_CHECKING:
    from strategies.contracts.settings import Settings

GRAPHS = ("ring", "grid", "star", "full", "erdos-renyi", "file")
COMBINATIONS = ("metropolis", "uniform", "file")
MODES = ("diffusion", "fedavg", "fedsgd")


def parse_probabilities(text: str) -> np.ndarray:
    """Per-agent probabilities from ``"0.3,0.5,..."`` or from a file of numbers; each in (0, 1]."""
    path = Path(text).expanduser()
    body = path.read_text() if path.is_file() else text
    try:
        values = np.array([float(v) for v in body.replace(",", " ").split()])
    except ValueError as err:
        raise ValueError(f"{text!r} is neither a file nor comma-separated numbers") from err
    if values.size == 0 or np.any((values <= 0) | (values > 1)):
        raise ValueError(f"needs one or more numbers in (0, 1], got {values.tolist()}")
    return values


@dataclass(frozen=True, kw_only=True)
class DiffusionSettings(MethodSettings):
    """Asynchronous diffusion with agent subsampling and local updates (T = ``local-steps``).

    Every partition is an agent. The server reads the network keys; agents get
    ``diffusion-mu``, ``local-steps`` and ``batch-size``.
    """

    prefix: ClassVar[str] = "diffusion"

    mode: str = key("diffusion", "diffusion (seed eq. 9), fedavg (eq. 15) or fedsgd (eq. 14: everyone, every round)",
                    choices=MODES, server_only=True)  # fmt: skip
    mu: float = key(0.05, "local SGD step size of a participating agent", above=0)
    graph: str = key("ring", "the agents' graph", choices=GRAPHS, server_only=True)
    edge_probability: float = key(0.3, "erdos-renyi: probability of each edge (redrawn until connected)", above=0,
                                  at_most=1, server_only=True)  # fmt: skip
    graph_file: str = key("", "graph = file: edge list, one 'l k' pair of 0-based agents per line", server_only=True)
    combination: str = key("metropolis", "metropolis (doubly stochastic), uniform (a_lk = 1/|N_k|) or file",
                           choices=COMBINATIONS, server_only=True)  # fmt: skip
    combination_file: str = key("", "combination = file: K x K left-stochastic matrix, whitespace-separated",
                                server_only=True)  # fmt: skip
    participation: float = key(1.0, "q_k, the same for every agent", above=0, at_most=1, server_only=True)
    participation_per_agent: str = key("", "per-agent q_k: '0.3,0.5,...' or a file of K numbers (overrides "
                                       "participation)", server_only=True)  # fmt: skip
    neighbour_probability: float = key(1.0, "q_lk: chance a participant keeps each neighbour", at_least=0, at_most=1,
                                       server_only=True)  # fmt: skip
    snapshot_every: int = key(0, "write every agent's model to agents.npz every k rounds (0 = never)", at_least=0,
                              server_only=True)  # fmt: skip

    def check(self) -> None:
        for name, value in (("graph_file", self.graph_file), ("combination_file", self.combination_file)):
            owner = name.removesuffix("_file")
            if (getattr(self, owner) == "file") != bool(value):
                raise ConfigError(f"run config key 'diffusion-{owner}-file' is set exactly when 'diffusion-{owner}' "
                                  f"is 'file'; got {getattr(self, owner)!r} and {value!r}")  # fmt: skip
        if self.mode == "fedsgd" and (self.participation != 1 or self.participation_per_agent
                                      or self.neighbour_probability != 1):  # fmt: skip
            raise ConfigError("run config key 'diffusion-mode': 'fedsgd' has every agent take part every round; it "
                              "needs diffusion-participation = 1, diffusion-neighbour-probability = 1 and no "
                              "diffusion-participation-per-agent")  # fmt: skip

    def check_in(self, settings: Settings) -> None:
        if not settings.run.preflight:
            raise ConfigError("run config key 'preflight': diffusion needs it (it maps every node to its agent)")

    def check_on_server(self) -> None:
        for name, value in (("graph-file", self.graph_file), ("combination-file", self.combination_file)):
            if value and not Path(value).expanduser().is_file():
                raise ConfigError(f"run config key 'diffusion-{name}': {value!r} is not a file")
        if self.participation_per_agent:
            try:
                parse_probabilities(self.participation_per_agent)
            except ValueError as err:
                raise ConfigError(f"run config key 'diffusion-participation-per-agent': {err}") from err
        # Imported here: topology builds on this contract, so a module-level import would be circular.
        from strategies.methods.topology import check_network_files

        try:
            check_network_files(self)
        except ValueError as err:
            raise ConfigError(str(err)) from err


CONTRACT = Contract(
    asynchronous="own",  # an agent's own model changes only with its own replies (docs/fleets.md)
    robust_aggregation=False,  # the diffusion combines neighbours by its combination matrix
    name="diffusion",
    adapts_at_test=False,
    summary="asynchronous diffusion: agents on a graph, random participation, T local steps, sampled combination",
    settings=DiffusionSettings,
    uses=("local-steps", "batch-size"),
    step_sizes=("diffusion-mu",),
    metrics=(),
    example={"strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
             "diffusion-mu": 0.1, "local-steps": 1, "batch-size": 20},
)
