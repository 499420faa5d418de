"""The paces on the round engine, in-process: every method in every pace, late replies, departures, determinism."""

from __future__ import annotations

import json

import pytest

from app.config import ConfigError
from app.local.inprocess import served_run
from app.registry import METHODS

WALL_KEYS = ("seconds", "-unix")  # what the machine's clock decides; virtual-seconds is the fleet model's


def _run(tmp_path, name="run", num_clients=6, **config):
    config = {"num-server-rounds": 2, "eval-every": 2, "fraction-fit": 0.5, "local-steps": 2,
              "results-dir": str(tmp_path), "run-name": name, **config}  # fmt: skip
    strategy, grid = served_run(config, num_clients=num_clients)
    strategy.start(grid=grid)
    return strategy.method.history, json.loads((tmp_path / name / "summary.json").read_text())


def _trace(tmp_path, rows: dict[int, tuple[float, str]]) -> str:
    path = tmp_path / "fleet.csv"
    path.write_text("partition,step-seconds,bandwidth,windows\n"
                    + "".join(f"{p},{step},1e12,{windows}\n" for p, (step, windows) in rows.items()))  # fmt: skip
    return str(path)


@pytest.mark.parametrize("pace", ["deadline", "buffered"])
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_runs_two_updates_in_each_pace_or_refuses_it_by_name(name, pace, tmp_path):
    config = {**METHODS[name].contract.example, "strategy": name, "pace": pace}
    refuses = pace == "buffered" and not METHODS[name].contract.asynchronous
    if refuses:
        with pytest.raises(ConfigError, match=f"'buffered' is refused for strategy '{name}'"):
            _run(tmp_path, **config)
        return
    history, summary = _run(tmp_path, **config)
    assert summary["status"] == "completed" and [r["round"] for r in history] == [1, 2]
    assert all(r["clients-succeeded"] >= 1 and r["virtual-seconds"] > 0 for r in history)
    if pace == "buffered":
        assert all("staleness-mean" in r for r in history)
        assert (tmp_path / "run" / "participation.json").is_file()


def test_the_buffered_pace_is_refused_under_a_tuner():
    with pytest.raises(ConfigError, match="tune = 'fathom'"):
        served_run({"strategy": "fedavg", "tune": "fathom", "pace": "buffered"}, num_clients=2)


def test_one_seed_gives_one_run_on_the_virtual_clock(tmp_path):
    config = {"strategy": "fedavg", "pace": "buffered", "num-server-rounds": 6, "concurrency": 4, "buffer-size": 2,
              "fleet-on-seconds": 2.0, "fleet-off-seconds": 1.0, "seed": 3}  # fmt: skip

    def kept(history):
        return [{k: v for k, v in r.items() if k == "virtual-seconds" or not any(w in k for w in WALL_KEYS)}
                for r in history]  # fmt: skip

    first, _ = _run(tmp_path, "a", num_clients=10, **config)
    second, _ = _run(tmp_path, "b", num_clients=10, **config)
    other, _ = _run(tmp_path, "c", num_clients=10, **{**config, "seed": 4})
    assert kept(first) == kept(second) and kept(first) != kept(other)
    times = [r["virtual-seconds"] for r in first]
    assert times == sorted(times)


def test_a_late_reply_in_a_deadline_round_is_discarded_and_counted(tmp_path):
    # partitions 0-2 take 0.1 s a step, partition 3 takes 10 s: with a 5 s deadline it is always late
    trace = _trace(tmp_path, {0: (0.1, ""), 1: (0.1, ""), 2: (0.1, ""), 3: (10.0, "")})
    history, summary = _run(tmp_path, num_clients=4, strategy="fedavg", pace="deadline", deadline=5.0,
                            **{"fraction-fit": 1.0, "fleet": "trace", "fleet-trace": trace})  # fmt: skip
    for record in history:
        assert record["fit-partitions"] == [0, 1, 2, 3]  # over-selection cannot go past the four devices
        assert record["clients-late"] == 1 and record["clients-succeeded"] == 3 and record["clients-failed"] == 0
    # the round closes at its deadline, not when the slow device would have answered (20 s)
    assert history[0]["virtual-seconds"] == pytest.approx(5.0, abs=1e-3)


@pytest.mark.parametrize("pace", ["lockstep", "deadline", "buffered"])
def test_a_device_that_leaves_mid_run_costs_at_most_the_deadline(pace, tmp_path):
    # partition 3 is on for the first 0.15 s only: its first job (0.2 s) is cut short, and it never comes back
    trace = _trace(tmp_path, {0: (0.1, ""), 1: (0.1, ""), 2: (0.1, ""), 3: (0.1, "0-0.15")})
    history, summary = _run(tmp_path, num_clients=4, strategy="fedavg", pace=pace, deadline=3.0,
                            **{"num-server-rounds": 3, "concurrency": 4, "buffer-size": 3,
                               "fraction-fit": 0.75 if pace == "deadline" else 1.0,  # deadline: 3 and 1 more
                               "fleet": "trace", "fleet-trace": trace})  # fmt: skip
    assert summary["status"] == "completed" and len(history) == 3
    assert sum(r["clients-left"] for r in history) == 1
    first = history[0]["virtual-seconds"]
    if pace == "lockstep":
        assert first == pytest.approx(3.0, abs=1e-3)  # the round waited the deadline for the device that left
    else:
        assert first == pytest.approx(0.2, abs=1e-3)  # the others' replies close it; the departure costs nothing
    assert all(3 not in r["fit-partitions"] for r in history[1:])  # an off device is not sampled again


def test_a_node_emulates_a_slower_device_by_its_node_config(tmp_path):
    from flwr.app import Context, RecordDict

    from app.local.message_grid import InProcessGrid
    from app.message_client import slowdown

    assert slowdown({}) == 1.0 and slowdown({"emulated-slowdown": 5}) == 5.0
    for bad in ("5", 0.5, True, 1e9):
        with pytest.raises(ValueError, match="'emulated-slowdown'"):
            slowdown({"emulated-slowdown": bad})
    # the node of partition 1 is 20x slower: its fit replies take twenty times its work
    config = {"strategy": "fedavg", "num-server-rounds": 1, "fraction-fit": 1.0, "eval-every": 100,
              "results-dir": str(tmp_path), "run-name": "slow", "local-steps": 5}  # fmt: skip
    strategy, grid = served_run(config, num_clients=2)
    grid.contexts = {node: Context(run_id=0, node_id=c.node_id, state=RecordDict(), run_config=c.run_config,
                                   node_config={**c.node_config, "emulated-slowdown": 20.0 if i else 1.0})
                     for i, (node, c) in enumerate(grid.contexts.items())}  # fmt: skip
    assert isinstance(grid, InProcessGrid)
    timed = {}
    app = grid.client_app

    def timing(message, context):
        import time

        started = time.perf_counter()
        reply = app(message, context)
        if message.metadata.message_type == "train":
            timed[context.node_config["partition-id"]] = time.perf_counter() - started
        return reply

    grid.client_app = timing
    strategy.start(grid=grid)
    assert timed[1] > 8 * timed[0]


@pytest.mark.parametrize("pace", ["deadline", "buffered"])
def test_robust_aggregation_and_the_reply_screen_work_in_each_pace(pace, tmp_path):
    config = {"strategy": "fedavg", "pace": pace, "aggregation": "median", "num-server-rounds": 3, "eval-every": 3,
              "fraction-fit": 0.5, "concurrency": 6, "buffer-size": 3, "local-steps": 2,
              "results-dir": str(tmp_path), "run-name": "run"}  # fmt: skip
    strategy, grid = served_run(config, num_clients=8)
    answer = grid.client_app

    def broken(message, context):  # partition 0's ClientApp raises on every train message
        if message.metadata.message_type == "train" and context.node_config["partition-id"] == 0:
            raise RuntimeError("a broken device")
        return answer(message, context)

    grid.client_app = broken
    strategy.start(grid=grid)
    history = strategy.method.history
    assert strategy.method.summary("completed")["rounds"] == 3
    assert all("update-norm-median" in r for r in history)  # the update screen measured every update
    assert sum(r["clients-failed"] for r in history) >= 1  # the broken device's error counted, never combined


def test_a_buffered_run_resumes_from_its_checkpoint(tmp_path):
    config = {"strategy": "fedavg", "pace": "buffered", "concurrency": 4, "buffer-size": 2,
              "checkpoint-every": 2}  # fmt: skip
    first, _ = _run(tmp_path, "first", num_clients=8, **{**config, "num-server-rounds": 4})
    resumed, summary = _run(tmp_path, "first", num_clients=8, **{**config, "num-server-rounds": 6,
                                                                  "resume-from": str(tmp_path / "first")})  # fmt: skip
    assert summary["status"] == "completed" and [r["round"] for r in resumed] == list(range(1, 7))
    assert resumed[:4] == first  # the checkpoint's records, kept
    # the virtual clock goes on from the checkpoint's time
    assert resumed[4]["virtual-seconds"] > first[-1]["virtual-seconds"]


def test_a_buffered_run_whose_jobs_are_all_lost_stops_saying_why(tmp_path):
    # every device is on for 0.1 s at a time and a job takes 0.2 s: no reply can ever come
    trace = _trace(tmp_path, {p: (0.1, ";".join(f"{t}-{t + 0.1}" for t in range(0, 400, 2))) for p in range(4)})
    config = {"strategy": "fedavg", "pace": "buffered", "num-server-rounds": 2, "concurrency": 2, "buffer-size": 1,
              "fleet": "trace", "fleet-trace": trace, "results-dir": str(tmp_path), "run-name": "lost"}  # fmt: skip
    strategy, grid = served_run(config, num_clients=4)
    with pytest.raises(RuntimeError, match="the last 8 jobs were all lost"):
        strategy.start(grid=grid)
    summary = json.loads((tmp_path / "lost" / "summary.json").read_text())
    assert summary["status"] == "failed" and "raise deadline" in summary["reason"]


def test_a_buffered_run_starts_from_the_arrays_given_and_returns_its_model(tmp_path):
    import numpy as np
    from flwr.app import Array, ArrayRecord

    config = {"strategy": "fedavg", "pace": "buffered", "num-server-rounds": 1, "concurrency": 2, "buffer-size": 1,
              "local-steps": 1, "lr": 1e-9, "fraction-evaluate": 0.0, "results-dir": str(tmp_path),
              "run-name": "given"}  # fmt: skip
    strategy, grid = served_run(config, num_clients=4)
    zeros = ArrayRecord({k: Array(np.zeros_like(v.numpy())) for k, v in strategy.global_arrays.items()})
    result = strategy.start(grid=grid, initial_arrays=zeros)
    # one update of a step of 1e-9 from zeros stays (all but) zero: the run started from the arrays given
    assert max(float(np.abs(a.numpy()).max()) for a in result.arrays.values()) < 1e-6
