"""The diffusion server's memory: bytes held per agent, and the peak while combining, per model.

For each model, builds the ``DiffusionServer`` strategy for K agents (ring, Metropolis),
feeds it one round of replies from every agent (in process, no Flower engine: the
strategy's own arrays are what is measured), and reports the bytes of the agents'
models it holds and how far combining the replies raises the peak of traced allocations
(``tracemalloc``) above what was held before it (agents' models and the replies).
Writes ``bench/results/diffusion_memory.json`` and prints a table.

    python -m bench.diffusion_memory            # K = 200
"""

from __future__ import annotations

import tracemalloc

from app.config import parse_settings
from app.local.node_fleet import NodeFleet
from bench.harness import arguments, machine, write_report
from clients.models import build_model, parameter_count
from strategies.contracts.code import code_identity
from strategies.contracts.payload import to_bytes
from strategies.methods.diffusion import DiffusionServer
from strategies.screening.replies import Received

MODELS = (("linear", (10,), 0), ("logreg", (1, 28, 28), 10), ("mlp", (1, 28, 28), 10),
          ("cnn-small", (1, 28, 28), 62), ("cnn", (1, 28, 28), 62))  # fmt: skip


class Agent:
    """A node that only says which agent it is."""

    def __init__(self, cid: str, agent: int, num_agents: int) -> None:
        self.cid = cid
        self.properties = {"partition-id": agent, "num-partitions": num_agents, **code_identity()}

    def get_properties(self, config):
        return self.properties


def measure(name: str, shape: tuple[int, ...], classes: int, agents: int) -> dict:
    model = build_model(name, input_shape=shape, num_classes=classes)
    arrays = [v.detach().numpy() for v in model.state_dict().values()]
    fleet = NodeFleet(*(Agent(f"n{k}", k, agents) for k in range(agents)))
    settings = parse_settings({"strategy": "diffusion", "diffusion-mu": 0.1, "local-steps": 1, "batch-size": 1,
                               "num-server-rounds": 1, "min-available-clients": agents})  # fmt: skip
    strategy = DiffusionServer(settings=settings, initial_model=arrays)
    tracemalloc.start()
    strategy.phases.start_run(fleet)
    instructions = strategy.phases.fit_instructions(1, fleet)
    tensors = [to_bytes(a) for a in arrays]
    replies = [Received(ins.node, tensors, 1, {}) for ins in instructions]
    before = tracemalloc.get_traced_memory()[0]  # the agents' models, the replies and everything else so far
    tracemalloc.reset_peak()
    strategy.phases.take_fit(1, replies, [])
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()

    params = parameter_count(model)
    return {
        "model": name,
        "parameters": params,
        "bytes-per-agent": int(strategy.agents[0].nbytes),
        "agents": agents,
        "held-bytes": int(strategy.agents.nbytes),
        "aggregation-peak-extra-bytes": int(peak),
        "peak-per-agent": peak / agents,
    }


def main() -> None:
    parser = arguments(__doc__, out="diffusion_memory.json")
    parser.add_argument("--agents", type=int, default=200)
    args = parser.parse_args()
    rows = [measure(name, shape, classes, args.agents) for name, shape, classes in MODELS]
    write_report(args.out, {"machine": machine(), "rows": rows}, stamped=False, indent=1)
    print(f"| model | parameters | bytes per agent | held for {args.agents} agents | extra peak while combining |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| `{r['model']}` | {r['parameters']:,} | {r['bytes-per-agent']:,} | {r['held-bytes'] / 2**20:,.1f} MiB "
            f"| {r['aggregation-peak-extra-bytes'] / 2**20:,.1f} MiB |"
        )


if __name__ == "__main__":
    main()
