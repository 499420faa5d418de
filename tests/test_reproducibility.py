"""Seeded runs through Flower's engine: the same config twice gives the same records, a resumed run too.

Flower's own client sampling draws from Python's unseeded ``random``; stamen samples
from (seed, round, the connected partitions), combines replies in partition order and
seeds every client's batches, so two runs of one config on one machine write the same
``metrics.jsonl`` apart from the timings, and a run stopped and resumed from its
checkpoint writes what the uninterrupted one did. ``tests/state_app`` checks that a
client's ``Context.state`` survives from one round to the next. That a preflight over a
sample of the nodes gives the run of one over every node is checked for every method in
process (``tests/test_preflight_sample.py``).
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from app.local.simulation import LocalSimulation
from strategies.records import TIMING_KEYS

pytestmark = pytest.mark.e2e
CLIENTS = 10
# the default job (Per-FedAvg HF on the embedded data), shortened: 3 of 10 clients a round, everyone evaluated
CONFIG = {"num-server-rounds": 4, "eval-every": 2, "fraction-fit": 0.3}


def lines_without_timings(run_dir) -> list[str]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [json.dumps({k: v for k, v in r.items() if k not in TIMING_KEYS}) for r in records]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_simulation):
    results = tmp_path_factory.mktemp("results")
    common = {**CONFIG, "results-dir": str(results)}
    independent = {name: {**common, "run-name": name} for name in ("first", "second")}
    independent["cut"] = {**common, "num-server-rounds": 2, "checkpoint-every": 2, "run-name": "cut"}
    # every run but the resumed one submitted at once (each in its own simulation process, seeded alike), and the
    # state app beside them on a SuperLink of its own: run one after another, the module took 157 s
    sim = local_simulation
    with LocalSimulation(app_dir=REPO / "tests" / "state_app", pythonpath=[REPO]) as state_sim:
        state = state_sim.submit(run_config={"results-dir": str(results), "run-name": "state"}, num_supernodes=4)
        done = sim.run_many(independent, num_supernodes=CLIENTS, ahead=len(independent), timeout_s=300)
        resumed = {**common, "resume-from": str(results / "cut")}
        done["resumed"] = sim.run(run_config=resumed, num_supernodes=CLIENTS, timeout_s=300)
        kept = state_sim.wait(state, timeout_s=300)
    outcomes = [done[name] for name in ("first", "second", "cut", "resumed")]
    return outcomes, kept, results


def test_the_same_config_twice_writes_the_same_records(runs):
    outcomes, _, results = runs
    for outcome in outcomes:
        assert outcome.ok, outcome.log_tail
    first, second = lines_without_timings(results / "first"), lines_without_timings(results / "second")
    assert len(first) == 4 and first == second
    sampled = [json.loads(line)["fit-partitions"] for line in first]
    assert all(len(p) == 3 for p in sampled) and len({tuple(p) for p in sampled}) > 1  # a new draw every round


def test_a_resumed_run_samples_and_records_what_the_uninterrupted_one_did(runs):
    _, _, results = runs
    assert lines_without_timings(results / "cut") == lines_without_timings(results / "first")


def test_client_state_survives_from_round_to_round(runs):
    _, kept, results = runs
    assert kept.ok, kept.log_tail
    records = [json.loads(line) for line in (results / "state" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2, 3]
    assert all(r["clients-succeeded"] == 4 and r["clients-failed"] == 0 for r in records), [
        r.get("fit-failures") for r in records
    ]
