"""Two checkouts, one local SuperLink: a run uses its own code or is refused, and its results say which code made them.

The SuperLink here is started in a second checkout whose code differs by one function,
as when ``flwr run .`` reuses a SuperLink that an earlier run started elsewhere
(docs/troubleshooting.md#two-checkouts). Ray puts that folder first on its workers'
``sys.path``; stamen moves its simulation process into the FAB before Ray starts
(``app/workdir.py``), and the preflight compares every client's code fingerprint with
the server's, so a run that would still mix the two is refused before round 1.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO
from helpers import change_a_function, copy_of_the_code

from app.local.simulation import LocalSimulation
from app.workdir import KEEP_WORKDIR
from strategies.contracts.code import code_fingerprint

pytestmark = pytest.mark.e2e
CLIENTS = 6
SHORT = {"num-server-rounds": 2, "eval-every": 1, "fraction-fit": 0.5}


@pytest.fixture(scope="module")
def other_checkout(tmp_path_factory):
    root = copy_of_the_code(tmp_path_factory.mktemp("other-checkout"))
    change_a_function(root)
    return root


@pytest.fixture(scope="module")
def outcomes(other_checkout, tmp_path_factory):
    """Both runs side by side, each on its own SuperLink started in the other checkout: their start-ups overlap."""
    results = tmp_path_factory.mktemp("results")
    config = {**SHORT, "results-dir": str(results)}
    # as a SuperLink of an older stamen would: leave Ray's workers importing the other checkout
    with LocalSimulation(app_dir=REPO, workdir=other_checkout, env={KEEP_WORKDIR: "1"}) as mixed, \
            LocalSimulation(app_dir=REPO, workdir=other_checkout) as own:  # fmt: skip
        submitted = {name: (sim, sim.submit(run_config={**config, "run-name": name}, num_supernodes=CLIENTS))
                     for name, sim in (("mixed", mixed), ("own", own))}  # fmt: skip
        return {name: (sim.wait(run_id, timeout_s=600), str(sim.home), results / name)
                for name, (sim, run_id) in submitted.items()}  # fmt: skip


def test_a_run_mixing_two_checkouts_is_refused_before_round_1_naming_both(outcomes, other_checkout):
    outcome, home, run_dir = outcomes["mixed"]
    assert outcome.status == "finished:failed", outcome.log_tail
    refusal = f"the node runs stamen code from {other_checkout} (fingerprint {code_fingerprint(other_checkout)[:12]})"
    assert f"preflight: {CLIENTS} of {CLIENTS} clients (partitions 0-{CLIENTS - 1}): {refusal}" in outcome.log
    assert f"but the server runs {home}/apps/" in outcome.log  # the FAB of this run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and refusal in summary["reason"]
    assert (run_dir / "metrics.jsonl").read_text() == ""  # no round ran


def test_a_run_from_another_checkouts_superlink_uses_its_own_code(outcomes, other_checkout):
    outcome, home, run_dir = outcomes["own"]
    assert outcome.ok, outcome.log_tail
    assert f"simulation workers import this run's app from {home}/apps/" in outcome.log
    assert f"(the SuperLink runs in {other_checkout})" in outcome.log
    code = json.loads((run_dir / "summary.json").read_text())["provenance"]["code"]
    assert code["fingerprint"] == code_fingerprint(REPO) != code_fingerprint(other_checkout)
    assert code["from-fab"] and code["git-commit"] is None and "carries no git data" in code["git-why"]
