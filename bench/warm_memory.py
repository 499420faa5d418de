"""What a warm device costs in memory: its fork server and one task child, shared pages counted once (PSS).

A local deployment of warm devices (``python -m app.device.console``, the SuperNode beside the warm
SuperExec), each on a partition of the embedded data; while a run trains, every process of
each device is sampled five times a second from ``/proc/<pid>/smaps_rollup`` and sorted by
role: the SuperNode, the SuperExec (``app.device.warm_exec``), its **fork server** (the process
that imported torch and stamen once) and the **task children** it forks, one per message
(``stamen-task``). PSS divides each shared page among the processes mapping it, so a task
child's PSS is what it adds beside its fork server, and the sum over roles is what the
device holds. Writes ``bench/results/warm_memory.{json,md}``.

    python -m bench.warm_memory                 # cnn-small and fedavg-cnn, 2 devices, 3 rounds
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from app.device.fork_server import TASK_NAME
from app.local.deployment import LocalDeployment
from app.local.simulation import FINISHED_OK
from bench.harness import REPO, arguments, write_report
from bench.samplers import MemorySampler, process_memory, process_stat, process_trees

MODELS = ("cnn-small", "fedavg-cnn")
ROLES = ("supernode", "superexec", "fork server", "task child")
SAMPLE_EVERY_S = 0.2


def role_of(pid: int, root: int, tree: set[int]) -> str:
    """The role of ``pid`` in the device whose ``app.device.console`` process is ``root``."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_bytes().strip()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        parent = int(process_stat(pid)[1])
    except (OSError, ValueError, IndexError):
        return ""
    if comm == TASK_NAME:
        return "task child"
    if b"flower-supernode" in command:
        return "supernode"
    if b"warm_exec" in command:
        return "superexec" if parent == root else "fork server"  # the fork server is forked from the SuperExec
    return "" if pid == root else "other"


class RoleSampler(MemorySampler):
    """The largest PSS and RSS (MiB) seen of one process of each role, over every device, and of a whole device."""

    def __init__(self, roots: list[int]) -> None:
        super().__init__(roots)
        self.peak_of_role = {role: {"pss": 0.0, "rss": 0.0} for role in (*ROLES, "other")}
        self.device = {"pss": 0.0, "rss": 0.0}

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            for root, tree in process_trees(self.roots).items():
                total = {"pss": 0.0, "rss": 0.0}
                for pid in tree:
                    role, memory = role_of(pid, root, tree), process_memory(pid)
                    for measure, value in memory.items():
                        total[measure] += value
                        if role:
                            self.peak_of_role[role][measure] = max(self.peak_of_role[role][measure], value)
                for measure, value in total.items():
                    self.device[measure] = max(self.device[measure], value)


def measure(model: str, nodes: int, rounds: int, work: Path) -> dict:
    config = {"strategy": "fedavg", "model": model, "partitioner": "iid", "num-server-rounds": rounds,
              "fraction-fit": 1.0, "eval-every": rounds, "min-fit-clients": nodes, "results-dir": str(work / "results"),
              "run-name": model}  # fmt: skip
    with LocalDeployment(app_dir=REPO, num_nodes=nodes, warm=True, workdir=work / model) as deployment:
        roots = [node.process.pid for node in deployment.nodes.values()]
        with RoleSampler(roots) as sampler:
            outcome = deployment.run(config, timeout_s=900)
    if outcome.status != FINISHED_OK:
        raise RuntimeError(f"{model}: the run ended {outcome.status}:\n{outcome.log[-3000:]}")
    return {"model": model, "roles": sampler.peak_of_role, "device": sampler.device}


def main() -> None:
    parser = arguments(__doc__, out="warm_memory.json")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        rows = [measure(model, args.nodes, args.rounds, Path(work)) for model in MODELS]
    lines = ["| model | fork server PSS MiB (RSS) | one task child PSS (RSS) | SuperExec PSS | SuperNode PSS | "
             "whole device, peak PSS (RSS) |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in rows:
        r = row["roles"]
        lines.append(f"| {row['model']} | {r['fork server']['pss']:.0f} ({r['fork server']['rss']:.0f}) | "
                     f"{r['task child']['pss']:.0f} ({r['task child']['rss']:.0f}) | {r['superexec']['pss']:.0f} | "
                     f"{r['supernode']['pss']:.0f} | {row['device']['pss']:.0f} ({row['device']['rss']:.0f}) |")
    write_report(args.out, {"nodes": args.nodes, "rounds": args.rounds, "rows": rows}, "\n".join(lines) + "\n",
                 stamped=False)  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
