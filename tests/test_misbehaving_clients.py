"""Misbehaving clients in a real Flower simulation: rejected or failed, logged, and the run goes on.

``tests/fault_app`` is a test-only Flower app: stamen's own ServerApp, and stamen's
ClientApp except that partition 0 replies with NaN weights and partition 1 raises.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO

from app.local.simulation import LocalSimulation

pytestmark = pytest.mark.e2e
CLIENTS = 4


def test_nan_and_crashing_clients_cannot_corrupt_or_stop_the_run(tmp_path):
    config = {"results-dir": str(tmp_path), "run-name": "faults"}
    with LocalSimulation(app_dir=REPO / "tests" / "fault_app", pythonpath=[REPO]) as sim:
        outcome = sim.run(run_config=config, num_supernodes=CLIENTS, timeout_s=300)
    assert outcome.ok, outcome.log_tail
    assert "rejected fit reply" in outcome.log and "non-finite" in outcome.log
    assert "this client crashed on purpose" in outcome.log
    rounds = [json.loads(line) for line in (tmp_path / "faults" / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 2
    for record in rounds:
        assert record["clients-sampled"] == CLIENTS
        assert record["clients-succeeded"] == 2 and record["clients-rejected"] == 1
        assert record["clients-failed"] == 2  # the rejected reply and the crash
        assert math.isfinite(record["train-loss"]) and math.isfinite(record["loss"])
        # a NaN in the global model would make every evaluation loss NaN and every eval reply rejected
        assert 0.0 <= record["global-accuracy"] <= 1.0 and record["eval-clients"] == CLIENTS
        assert record["eval-clients-failed"] == 0
    summary = json.loads((tmp_path / "faults" / "summary.json").read_text())
    assert summary["clients-failed"] == 4 and summary["rounds"] == 2
