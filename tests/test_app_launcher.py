from app.local.flower_text import run_config_text
from app.local.flwr_cli import FINISHED_OK, RunOutcome


def test_run_config_text_is_toml_for_flwr_run():
    text = run_config_text({"lr": 0.1, "dataset": "mnist", "download": True, "local-steps": 4, "data-dir": "/a b"})
    assert text == "lr=0.1 dataset='mnist' download=true local-steps=4 data-dir='/a b'"


def test_outcome_is_ok_only_when_completed():
    assert RunOutcome("1", FINISHED_OK, 1.0, "").ok
    assert not RunOutcome("1", "finished:failed", 1.0, "x" * 5000).ok
    assert len(RunOutcome("1", "finished:failed", 1.0, "x" * 5000).log_tail) == 4000
