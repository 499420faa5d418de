"""``python -m app.local.deployment``: the helper's run config merged with the user's, checked first.

Flower 1.42 refuses a key given twice in one ``--run-config`` string with an opaque
"invalid format", so a ``results-dir`` of the user's used to make the helper fail after
starting a SuperLink and its SuperNodes. The deployments themselves are tested in
``tests/test_deployment.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from app.config import ConfigError
from app.local.deployment_cli import deployment_run_config


def test_the_users_keys_override_the_helpers_results_dir():
    config = deployment_run_config("results-dir='/some/path' strategy='fedavg'", results_dir=Path("/default"))
    assert config == {"results-dir": "/some/path", "strategy": "fedavg"}
    assert deployment_run_config("", results_dir=Path("/default")) == {"results-dir": "/default"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lrr=0.1", r"unknown run config key\(s\) 'lrr' \(did you mean 'lr'\?\)"),
        ("results-dir=/a b", r"--run-config is not in flwr run's `key=value \.\.\.` syntax"),
        ("local-steps=0", r"'local-steps': 0 is outside \[1, 1000000\]"),
    ],
)
def test_a_bad_run_config_is_refused_by_name(text, message):
    with pytest.raises(ConfigError, match=message):
        deployment_run_config(text, results_dir=Path("/default"))


def test_the_helper_refuses_a_bad_run_config_before_starting_any_process():
    out = subprocess.run([sys.executable, "-m", "app.local.deployment", "--run-config", "lrr=0.1"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2
    assert out.stdout.splitlines() == ["error: unknown run config key(s) 'lrr' (did you mean 'lr'?) "
                                       "(every key: docs/configuration.md)"]  # fmt: skip


@pytest.mark.e2e
def test_the_helper_runs_with_the_users_results_dir(tmp_path):
    """The issue's reproduction: a results-dir of the user's through the helper, to finished:completed.

    Warm devices (``--warm``): a message forks a process with torch imported instead of starting one.
    """
    config = f"results-dir='{tmp_path}' run-name='mine' num-server-rounds=1 strategy='fedavg' eval-every=1"
    out = subprocess.run([sys.executable, "-m", "app.local.deployment", "--nodes", "2", "--warm",
                          "--workdir", str(tmp_path / "deploy"), "--run-config", config, "--timeout", "600"],
                         cwd=REPO, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((tmp_path / "mine" / "summary.json").read_text())["status"] == "completed"
