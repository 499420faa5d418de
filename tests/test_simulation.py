"""Real simulations through Flower's engine (`flwr run`), checked by the run's status and result files.

`flwr run --stream` exits 0 even when the run fails, so the launcher submits with
`--format json`, polls `flwr ls --run-id` for the status, and the results files are
read back. The transport methods (``selection.TRANSPORT_METHODS``: fedavg, scaffold and
fedproto, one per kind of message) run their contract's example; every registered method's
records are checked in-process by tests/test_methods.py. A client whose data cannot serve
the run answers the preflight with the reason (tests/test_failures.py), and such answers
end a ``flwr run`` as failed before round 1 (tests/test_failures_e2e.py). The private
SuperLink is stopped at the end, whatever happened.
"""

from __future__ import annotations

import json
import subprocess
from importlib import metadata

import pytest
from conftest import REPO
from helpers import PACKAGES, check_method_record
from selection import TRANSPORT_METHODS, selected_runs

from app.local.simulation import LocalSimulation
from app.registry import METHODS
from bench import method_records
from strategies.contracts.code import code_fingerprint

pytestmark = pytest.mark.e2e
ROUNDS, CLIENTS = 2, 4
KEPT = "kept"  # the run made with bench/method_records.py's config, compared with the records kept there
AHEAD = 3  # runs submitted ahead on the one SuperLink (LocalSimulation.run_many)
# the runs each test reads besides the methods' own (``-k fedbn`` makes FedBN's run alone)
BUFFERED = "fedavg-buffered"  # the buffered pace on the virtual clock, devices coming and going
BUFFERED_CONFIG = {"strategy": "fedavg", "pace": "buffered", "concurrency": 3, "buffer-size": 2,
                   "num-server-rounds": 4, "fleet-on-seconds": 2.0, "fleet-off-seconds": 1.0,
                   "eval-every": 2}  # fmt: skip
RUNS_READ = {"test_the_results_say_which_code_data_and_versions_made_them": ["fedavg"],
             "test_a_buffered_run_through_ray_is_the_in_process_run_of_its_seed": [BUFFERED]}  # fmt: skip


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory, request):
    results = tmp_path_factory.mktemp("results")
    config = {"num-server-rounds": ROUNDS, "eval-every": 1, "fraction-fit": 0.5, "results-dir": str(results)}
    configs = {name: {**config, **METHODS[name].contract.example, "run-name": name} for name in TRANSPORT_METHODS}
    configs[BUFFERED] = {**config, **BUFFERED_CONFIG, "run-name": BUFFERED}
    wanted = selected_runs(request, "name", RUNS_READ)
    configs = {name: config for name, config in configs.items() if name in wanted}
    # each also as bench/method_records.py runs it: its records and model must be those kept before issue 69
    configs |= {f"{name}-{KEPT}": method_records.run_config(name, results, f"{name}-{KEPT}")
                for name in list(configs) if name in METHODS}  # fmt: skip
    with LocalSimulation(app_dir=REPO, workdir=REPO) as sim:  # a SuperLink started in the checkout, as by `flwr run .`
        outcomes = sim.run_many(configs, num_supernodes=CLIENTS, ahead=AHEAD, timeout_s=300)
        marker = str(sim.home)
    runs = {name: (outcome, results / name) for name, outcome in outcomes.items()}
    yield runs, marker


@pytest.mark.parametrize("name", TRANSPORT_METHODS)
def test_every_method_runs_its_example_and_records_every_round(finished_runs, name):
    outcome, run_dir = finished_runs[0][name]
    assert outcome.ok, f"status {outcome.status}\n{outcome.log_tail}"
    rounds = records(run_dir)
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    contract = METHODS[name].contract
    for record in rounds:
        assert record["strategy"] == name and record["clients-failed"] == 0
        assert record["clients-succeeded"] == record["clients-sampled"] >= 1
        assert record["eval-clients"] == CLIENTS
        check_method_record(record, contract)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS and summary["settings"]["strategy"] == name
    assert (run_dir / "accuracy.png").stat().st_size > 1000


@pytest.mark.parametrize("name", TRANSPORT_METHODS)
def test_flwr_run_writes_the_records_and_model_kept_before_the_engine_changed(finished_runs, name):
    outcome, run_dir = finished_runs[0][f"{name}-{KEPT}"]
    assert outcome.ok, f"{outcome.status}\n{outcome.log_tail}"
    kept = json.loads(method_records.RECORDS.read_text())["flwr-run"][name]
    problems = method_records.differences(kept, method_records.kept(run_dir), name)
    assert not problems, problems[:5]


def test_run_leaves_no_process(finished_runs):
    assert subprocess.run(["pgrep", "-f", finished_runs[1]], capture_output=True).stdout == b""


def test_the_results_say_which_code_data_and_versions_made_them(finished_runs):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit:
        pytest.skip(f"{REPO} is not a git checkout")
    run_dir = finished_runs[0]["fedavg"][1]
    run = json.loads((run_dir / "run.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    provenance = summary["provenance"]
    assert run["provenance"] == {k: v for k, v in provenance.items() if k != "data"}
    code = provenance["code"]
    assert code["git-checkout"] == str(REPO) and code["git-commit"] == commit
    assert code["git-dirty"] == bool(git("status", "--porcelain", "--", *PACKAGES, "pyproject.toml"))
    assert code["fingerprint"] == code_fingerprint(REPO) and code["from-fab"]
    assert set(provenance["versions"]) == {"stamen", "python", "flwr", "torch", "numpy", "ray"}
    assert provenance["versions"]["flwr"] == metadata.version("flwr")
    assert provenance["machine"]["cpus"] >= 1 and provenance["machine"]["device"] == summary["settings"]["device"]
    data = provenance["data"]
    assert data["clients"] == CLIENTS == len({node["data-fingerprint"] for node in summary["nodes"]})
    assert data["train-examples"] == sum(node["num-train"] for node in summary["nodes"])


def test_a_buffered_run_through_ray_is_the_in_process_run_of_its_seed(finished_runs, tmp_path):
    # Ray hands the replies back in whatever order its workers finish; the virtual clock orders them, so the run
    # through Flower's simulation engine is the run in this process, record for record (wall times apart): the
    # same partitions and departures exactly, floats to the last digits (a Ray worker's sums may
    # round differently: CI once saw update-norm-median 0.6119664542866219 there, ...221 here)
    from app.local.inprocess import served_run

    outcome, run_dir = finished_runs[0][BUFFERED]
    assert outcome.ok, f"status {outcome.status}\n{outcome.log_tail}"
    config = {"num-server-rounds": ROUNDS, "eval-every": 1, "fraction-fit": 0.5, **BUFFERED_CONFIG,
              "results-dir": str(tmp_path), "run-name": "here"}  # fmt: skip
    strategy, grid = served_run(config, num_clients=CLIENTS)
    strategy.start(grid=grid)

    def kept(rows):
        return [{k: v for k, v in r.items() if k == "virtual-seconds" or not k.endswith(("seconds", "-unix"))}
                for r in rows]  # fmt: skip

    ray, here = kept(records(run_dir)), kept(records(tmp_path / "here"))
    assert [r["fit-partitions"] for r in ray] == [r["fit-partitions"] for r in here]
    assert [r["clients-left"] for r in ray] == [r["clients-left"] for r in here]
    problems = method_records.differences(here, ray, BUFFERED)
    assert not problems, problems[:5]
