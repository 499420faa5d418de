"""Checkpoints: atomic files, clear errors for bad ones, and strategies that continue exactly where they stopped."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import K, diffusion_strategy, federation, play_round, settings_for, start_run

from app.config import ConfigError, parse_settings
from app.local.message_grid import InProcessGrid
from app.results.writer import ResultWriter
from app.server_run import build_strategy, checkpoint_to_resume
from strategies.flower.rounds import Rounds
from strategies.rounds.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from strategies.rounds.recorder import NullRecorder


def sample_checkpoint(round_=3):
    arrays = {"global/0": np.arange(6, dtype=np.float32).reshape(2, 3), "global/1": np.ones(3)}
    return Checkpoint(round=round_, arrays=arrays, state={"strategy": "fedavg", "history": [{"round": 1}]})


def test_round_trip_keeps_arrays_and_state_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, sample_checkpoint())
    save_checkpoint(path, sample_checkpoint(4))  # replaces the previous one
    loaded = load_checkpoint(tmp_path)  # the run folder works too
    assert loaded.round == 4 and loaded.state["history"] == [{"round": 1}]
    np.testing.assert_array_equal(loaded.arrays["global/0"], np.arange(6).reshape(2, 3))
    assert loaded.arrays["global/0"].dtype == np.float32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz"]


def test_corrupted_missing_and_foreign_files_fail_clearly(tmp_path):
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, sample_checkpoint())
    path.write_bytes(path.read_bytes()[:200])  # a crash mid-copy, a full disk
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(CheckpointError, match="not a stamen checkpoint"):
        load_checkpoint(tmp_path / "other.npz")


def write_run(tmp_path, config, rounds_written):
    """A run folder as a checkpointing run leaves it: metrics.jsonl and checkpoint.npz."""
    settings = parse_settings(config)
    writer = ResultWriter(run_dir=tmp_path / "run", settings=settings.as_run_config())
    for r in range(1, rounds_written + 1):
        writer.record_round({"round": r})
    writer.save_checkpoint(sample_checkpoint(round_=2))
    return tmp_path / "run"


def test_resume_refuses_other_settings_and_a_finished_count(tmp_path):
    config = {"strategy": "fedavg", "lr": 0.1, "num-server-rounds": 2}
    run = write_run(tmp_path, config, 2)
    ok = parse_settings({**config, "num-server-rounds": 5, "resume-from": str(run)})
    assert checkpoint_to_resume(ok).round == 2
    other = parse_settings({**config, "lr": 0.2, "num-server-rounds": 5, "resume-from": str(run)})
    with pytest.raises(ConfigError, match=r"other settings \(lr = 0.1 there, 0.2 here\)"):
        checkpoint_to_resume(other)
    done = parse_settings({**config, "resume-from": str(run)})
    with pytest.raises(ConfigError, match="'num-server-rounds': 2 is not above the checkpoint's round 2"):
        checkpoint_to_resume(done)
    (run / "checkpoint.npz").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="'resume-from': checkpoint .* is unreadable"):
        checkpoint_to_resume(ok)


def test_resumed_writer_drops_records_after_the_checkpoint(tmp_path):
    config = {"strategy": "fedavg", "num-server-rounds": 2}
    run = write_run(tmp_path, config, 3)  # round 3 was recorded, then the run died before its checkpoint
    writer = ResultWriter(run_dir=run, settings={}, resume_after=2)
    writer.record_round({"round": 3})
    rounds = [json.loads(line)["round"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2, 3]


def play(strategy, fleet, rounds, *, after=0):
    """Drive ``strategy`` through fit and evaluation rounds ``after + 1`` .. ``after + rounds``, as the engine does."""
    for server_round in range(after + 1, after + rounds + 1):
        play_round(strategy, server_round, fleet)
    return strategy.global_model


def test_diffusion_resumed_from_a_checkpoint_matches_the_uninterrupted_run():
    settings = settings_for(mode="diffusion", graph="ring", participation=0.5, neighbour_probability=0.7, rounds=5,
                            checkpoint_every=2)  # fmt: skip
    fleet, _ = federation(settings)
    whole, _, whole_recorder = diffusion_strategy(settings)
    start_run(whole, fleet)
    final = play(whole, fleet, 5)
    assert [c.round for c in whole_recorder.checkpoints] == [2, 4, 5]
    at_two = whole_recorder.checkpoints[0]
    assert at_two.arrays["diffusion/agents"].shape == (K, 10)

    fleet, _ = federation(settings)  # a fresh federation: new processes, same partitions
    again, _, recorder = diffusion_strategy(settings)
    assert Rounds(method=again, checkpoint=at_two).num_rounds == 3  # the engine plays the rounds left
    start_run(again, fleet)  # the preflight and the method's start, then the checkpoint, as the engine does
    again.resume(at_two)
    resumed_final = play(again, fleet, 3, after=2)
    # same participation and neighbour draws (the RNG state), same agents, same records after round 2
    np.testing.assert_array_equal(again.agents, whole.agents)
    np.testing.assert_array_equal(resumed_final[0], final[0])
    assert [r["round"] for r in again.history] == [1, 2, 3, 4, 5]
    for mine, theirs in zip(again.history[2:], whole.history[2:], strict=True):
        assert mine["agents-drawn"] == theirs["agents-drawn"] and mine["disagreement"] == theirs["disagreement"]
    assert recorder.summary["rounds"] == 5


def fathom_run(settings, num_clients, checkpoint=None):
    """FATHOM's run (records in memory) played by the round engine on ``num_clients`` fresh in-process nodes.

    The method, its engine (continuing after ``checkpoint``, if given) and its recorder; the run is played.
    """
    recorder = NullRecorder()
    strategy = build_strategy(settings, recorder=recorder)
    rounds = Rounds(method=strategy, checkpoint=checkpoint, overlap_rounds=False)
    rounds.start(grid=InProcessGrid(run_config=settings.as_run_config(), num_clients=num_clients))
    return strategy, rounds, recorder


def test_fathom_stopped_after_its_checkpoint_resumes_without_loss_or_duplication():
    """The run cut after its round-2 checkpoint and continued by fresh processes gives the uninterrupted run."""
    settings = parse_settings({"strategy": "fathom", "num-server-rounds": 4, "fraction-fit": 1.0,
                               "min-fit-clients": 4, "local-epochs": 1.0, "batch-size": 8, "eval-every": 2,
                               "checkpoint-every": 2})  # fmt: skip
    whole, _, whole_recorder = fathom_run(settings, 4)
    final = whole.global_model
    assert [c.round for c in whole_recorder.checkpoints] == [2, 4]
    at_two = whole_recorder.checkpoints[0]
    assert at_two.state["tuner"]["round"] == 2 and whole_recorder.checkpoints[1].state["tuner"]["round"] == 4

    again, continued, recorder = fathom_run(settings, 4, at_two)  # new clients and server: nothing kept in memory
    assert continued.num_rounds == 2
    resumed_final = again.global_model
    assert [r["round"] for r in again.history] == [1, 2, 3, 4]
    # the hyperparameters in force in rounds 3 and 4 are FATHOM's state after round 2, restored from the checkpoint
    for mine, theirs in zip(again.history, whole.history, strict=True):
        for key in ("hp-lr", "hp-local-epochs", "hp-batch-size", "train-loss"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6), (mine["round"], key)
    assert whole.history[2]["hp-lr"] != whole.history[0]["hp-lr"]  # the state had moved by then
    for mine, theirs in zip(resumed_final, final, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)
    assert [c.round for c in recorder.checkpoints] == [4] and recorder.checkpoints[0].state["tuner"]["round"] == 4
