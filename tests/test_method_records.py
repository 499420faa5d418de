"""Every method writes the records and final model kept in ``bench/results/method_records.json``.

Those records were written by ``python -m bench.method_records --write`` at the commit before
the round engine became one class on the Message API (issue 69); a change to the engine
that moves any figure of any method fails here (``bench/method_records.py`` runs the same
comparison through ``flwr run`` too).
"""

from __future__ import annotations

import json

import pytest

from app.registry import METHODS
from bench.method_records import RECORDS, differences, in_process

KEPT = json.loads(RECORDS.read_text())


@pytest.mark.parametrize("name", list(METHODS))
def test_the_method_writes_the_records_kept_before_the_engine_changed(name, tmp_path):
    problems = differences(KEPT["in-process"][name], in_process(name, tmp_path), name)
    assert not problems, problems[:5]


def test_a_moved_figure_is_found():
    kept = KEPT["in-process"]["fedavg"]
    moved = json.loads(json.dumps(kept))
    moved["records"][-1]["train-loss"] *= 1 + 1e-4
    moved["model"][0]["sum"] += 1e-3
    assert len(differences(kept, moved, "fedavg")) == 2
    assert differences(kept, json.loads(json.dumps(kept)), "fedavg") == []
