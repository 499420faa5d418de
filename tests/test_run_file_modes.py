"""One file-mode policy for a run's folder: 0700, and every file in it 0600, whatever the umask lets through."""

from __future__ import annotations

import os
import stat

import pytest
from helpers import finished_run

from app.results.writer import run_directory


@pytest.fixture
def permissive_umask():
    umask = os.umask(0o022)  # the usual one: without the policy, folders 0755 and metrics.jsonl 0644
    yield
    os.umask(umask)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_finished_run_is_its_owner_s_alone_checkpoints_and_metrics_included(tmp_path, permissive_umask):
    (tmp_path / "claimed").mkdir(mode=0o755)  # a run-name folder made by hand: closed when a run claims it
    for name in ("fresh", "claimed"):
        run_dir = finished_run(tmp_path, name)
        files = sorted(p for p in run_dir.rglob("*") if p.is_file())
        assert {"metrics.jsonl", "summary.json", "checkpoint.npz", "accuracy.png"} <= {p.name for p in files}
        assert mode(run_dir) == 0o700
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}


def test_a_default_named_run_folder_is_made_closed(tmp_path, permissive_umask):
    folder = run_directory(str(tmp_path), "", "fedavg-mnist")
    assert mode(folder) == 0o700
