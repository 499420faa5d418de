"""Seeded runs through Flower's engine: the same config twice gives the same records, a resumed run too.

Flower's own client sampling draws from Python's unseeded ``random``; stamen samples
from (seed, round, the connected partitions), combines replies in partition order and
seeds every client's batches, so two runs of one config on one machine write the same
``metrics.jsonl`` apart from the timings (here a 4-round run and one cut after round 2),
and a run stopped and resumed from its checkpoint writes what the uninterrupted one did.
``tests/state_app`` checks that a client's ``Context.state`` survives from one round to
the next. That a preflight over a
sample of the nodes gives the run of one over every node is checked for every method in
process (``tests/test_preflight_sample.py``).
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from app.local.simulation import LocalSimulation
from strategies.rounds.records import TIMING_KEYS

pytestmark = pytest.mark.e2e
CLIENTS = 10
# the default job (Per-FedAvg HF on the embedded data), shortened: 3 of 10 clients a round, everyone evaluated
CONFIG = {"num-server-rounds": 4, "eval-every": 2, "fraction-fit": 0.3}


def lines_without_timings(run_dir) -> list[str]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [json.dumps({k: v for k, v in r.items() if k not in TIMING_KEYS}) for r in records]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_simulation):
    """``first`` (4 rounds) and ``cut`` (its first 2, then a checkpoint) side by side; ``resumed`` from ``cut``'s
    checkpoint as soon as it is written, while ``first`` still runs; the state app on a SuperLink of its own.

    ``cut`` is a second run of the seed, in a simulation process and Ray of its own: its 2 rounds, read before the
    resumed run appends rounds 3 and 4, are the run-twice check (a separate 4-round rerun took a third simulation).
    """
    results = tmp_path_factory.mktemp("results")
    common = {**CONFIG, "results-dir": str(results)}
    sim = local_simulation
    with LocalSimulation(app_dir=REPO / "tests" / "state_app", pythonpath=[REPO]) as state_sim:
        state = state_sim.submit(run_config={"results-dir": str(results), "run-name": "state"}, num_supernodes=4)
        first = sim.submit(run_config={**common, "run-name": "first"}, num_supernodes=CLIENTS)
        cut_config = {**common, "num-server-rounds": 2, "checkpoint-every": 2, "run-name": "cut"}
        cut = sim.wait(sim.submit(run_config=cut_config, num_supernodes=CLIENTS), timeout_s=300)
        cut_records = lines_without_timings(results / "cut") if cut.ok else []
        resumed = sim.submit(run_config={**common, "resume-from": str(results / "cut")}, num_supernodes=CLIENTS)
        outcomes = {"first": sim.wait(first, timeout_s=300), "cut": cut, "resumed": sim.wait(resumed, timeout_s=300)}
        kept = state_sim.wait(state, timeout_s=300)
    return outcomes, cut_records, kept, results


def test_two_runs_of_one_config_write_the_same_records(runs):
    outcomes, cut_records, _, results = runs
    for outcome in outcomes.values():
        assert outcome.ok, outcome.log_tail
    first = lines_without_timings(results / "first")
    assert len(first) == 4 and len(cut_records) == 2
    assert cut_records == first[:2]  # another simulation process, another Ray, the same seed
    sampled = [json.loads(line)["fit-partitions"] for line in first]
    assert all(len(p) == 3 for p in sampled) and len({tuple(p) for p in sampled}) > 1  # a new draw every round


def test_a_resumed_run_samples_and_records_what_the_uninterrupted_one_did(runs):
    _, _, _, results = runs
    assert lines_without_timings(results / "cut") == lines_without_timings(results / "first")


def test_client_state_survives_from_round_to_round(runs):
    _, _, kept, results = runs
    assert kept.ok, kept.log_tail
    records = [json.loads(line) for line in (results / "state" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2, 3]
    assert all(r["clients-succeeded"] == 4 and r["clients-failed"] == 0 for r in records), [
        r.get("fit-failures") for r in records
    ]
