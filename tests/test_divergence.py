"""A run that diverges stops early, keeps its last good model and says why (by hand, and in the server app)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import settings
from helpers import aggregate_fit, arrays, configure_fit, fit_res, stand_in_fedavg

from app.local.inprocess import served_run
from strategies.base import RunDivergedError
from strategies.methods.perfedavg import PerFedAvgServer
from strategies.rounds.divergence import DivergenceWatch, round_is_nonfinite
from strategies.rounds.run_watch import RunWreckedError
from strategies.screening.replies import outsized, update_norm


def play_round(strategy, fleet, nodes, server_round, value):
    configure_fit(strategy, server_round, fleet)
    aggregate_fit(strategy, server_round, [fit_res(n, arrays(value), 10) for n in nodes])
    strategy.end_round(server_round)


def test_three_rounds_of_non_finite_replies_stop_the_run_with_the_last_good_model():
    strategy, fleet, nodes, recorder = stand_in_fedavg(num_rounds=10, eval_every=100, clients=3)
    play_round(strategy, fleet, nodes, 1, 1.0)
    play_round(strategy, fleet, nodes, 2, 2.0)  # its model (all 2.0) is what rounds 3-5 are sent
    play_round(strategy, fleet, nodes, 3, np.nan)
    play_round(strategy, fleet, nodes, 4, np.inf)
    assert strategy.divergence.nonfinite_rounds == 2 and recorder.summary is None
    reason = (r"rounds 3-5 every fit reply was non-finite; the step sizes in force were lr = 0.1; most likely the "
              r"cause: lower them; kept the model after round 1")
    with pytest.raises(RunDivergedError, match=reason):
        play_round(strategy, fleet, nodes, 5, np.nan)
    # the model sent in round 2 came back finite: the last good one; the model after round 2 was never tested
    assert all(np.all(a == 1.0) for a in strategy.global_model)
    assert recorder.checkpoints[-1].round == 1
    assert recorder.summary["status"] == "stopped" and recorder.summary["last-good-round"] == 1
    assert [r["clients-nonfinite"] for r in recorder.rounds] == [0, 0, 3, 3, 3]


def test_a_finite_round_resets_the_count_and_zero_never_stops():
    strategy, fleet, nodes, recorder = stand_in_fedavg(num_rounds=6, eval_every=100, clients=2)
    for server_round, value in enumerate((np.nan, np.nan, 1.0, np.nan, np.nan, 1.0), start=1):
        play_round(strategy, fleet, nodes, server_round, value)
    assert recorder.summary["status"] == "completed"
    never, fleet, nodes, recorder = stand_in_fedavg(num_rounds=5, eval_every=100, clients=2, stop_after_nonfinite=0,
                                                    wreck_rounds=0)  # fmt: skip
    for server_round in range(1, 6):
        play_round(never, fleet, nodes, server_round, np.nan)
    assert recorder.summary["status"] == "completed" and never.divergence.nonfinite_rounds == 5


def test_a_diverging_run_of_the_server_app_stops_early_with_its_reason_in_the_summary(tmp_path):
    # FedAvg with a step of 1e4 on the embedded data: the replies are non-finite from the first round or two. The
    # server is the one `flwr run` gets (results folder, summary, checkpoint); its 10 nodes answer in this process
    config = {"strategy": "fedavg", "lr": 1e4, "num-server-rounds": 30, "stop-after-nonfinite": 2,
              "fraction-fit": 0.2, "eval-every": 100, "results-dir": str(tmp_path), "run-name": "diverges"}  # fmt: skip
    strategy, grid = served_run(config, num_clients=10)
    strategy.start(grid=grid)  # returns: a stopped run ends as Flower's Result, not an exception
    summary = json.loads((tmp_path / "diverges" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["rounds"] < 30
    assert "every fit reply was non-finite" in summary["reason"] and "lr = 10000" in summary["reason"]
    assert (tmp_path / "diverges" / "checkpoint.npz").is_file()


def test_update_norm_and_the_outsized_rule():
    sent = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    assert update_norm([np.ones((2, 3), np.float32), np.full(3, 2.0, np.float32)], sent) == pytest.approx(
        np.sqrt(6 + 12))
    assert outsized([1.0, 1.2, 0.9, 50.0], 10.0) == [False, False, False, True]
    assert outsized([1.0, 50.0], 10.0) == [False, False]  # two replies have no majority to measure against
    assert outsized([1.0, 1.2, 0.9, 50.0], 0.0) == [False] * 4  # off


def test_a_finite_but_outsized_reply_is_rejected_and_the_rest_averaged():
    strategy, fleet, nodes, recorder = stand_in_fedavg(num_rounds=2, eval_every=100, clients=4,
                                                           max_update_ratio=10.0)  # fmt: skip
    configure_fit(strategy, 1, fleet)
    values = (1.0, 1.1, 0.9, 1e4)  # the last is finite, and would move the average to 2501
    replies = [fit_res(n, arrays(v), 10) for n, v in zip(nodes, values, strict=True)]
    model, _ = aggregate_fit(strategy, 1, replies)
    for got in model:
        np.testing.assert_allclose(got, 1.0, rtol=1e-6)
    assert strategy.record["clients-outsized"] == 1 and strategy.record["clients-rejected"] == 1
    assert strategy.record["update-norm-max"] == pytest.approx(1e4 * np.sqrt(9))


def test_hf_on_a_relu_model_is_named_as_the_likely_cause():
    from helpers import SHAPES  # noqa: F401  (the shapes the stand-in replies have)


    run = settings(strategy="perfedavg", model="cnn-small", dataset="mnist-5k")
    hint = PerFedAvgServer(settings=run, initial_model=arrays(0.0)).divergence_hint()
    assert hint.startswith("perfedavg-variant 'hf' on model 'cnn-small' (ReLU)") and "use 'so' or 'fo'" in hint
    smooth = settings(strategy="perfedavg", model="mlp")
    assert PerFedAvgServer(settings=smooth, initial_model=arrays(0.0)).divergence_hint() == (
        "most likely the cause: lower them")


def test_the_watch_stops_after_patience_bad_rounds_in_a_row_with_the_model_sent_in_the_last_good_one():
    models = {r: [np.full(2, float(r), np.float32)] for r in range(1, 8)}  # the model sent in round r
    good = {"clients-succeeded": 2, "eval-clients": 2}
    fit_bad = {"clients-succeeded": 0, "clients-nonfinite": 2}
    eval_bad = {"clients-succeeded": 2, "eval-clients": 0, "eval-clients-nonfinite": 2}
    central_bad = {"clients-succeeded": 2, "central-loss": float("nan")}
    rounds = [good, fit_bad, eval_bad, good, fit_bad, eval_bad, central_bad]
    watch = DivergenceWatch(patience=3, initial_model=[np.zeros(2, np.float32)])
    verdicts = [watch.observe(r, record, models[r]) for r, record in enumerate(rounds, start=1)]
    assert verdicts[:6] == [None] * 6 and watch.nonfinite_rounds == 3
    stop = verdicts[6]
    assert (stop.first_round, stop.last_round, stop.good_round) == (5, 7, 3)
    assert stop.good_model is models[4]  # round 4 came back finite: the model it was sent is the last good one
    assert stop.what == "no evaluation loss was finite"
    assert round_is_nonfinite(fit_bad) == (True, "every fit reply was non-finite")
    assert round_is_nonfinite({"clients-succeeded": 0, "clients-failed": 2})[0] is False  # failures are not divergence
    never = DivergenceWatch(patience=0, initial_model=[np.zeros(2, np.float32)])
    assert all(never.observe(r, fit_bad, models[1]) is None for r in range(1, 6)) and never.nonfinite_rounds == 5


def test_a_run_rejecting_every_reply_ends_wrecked_not_completed():
    # the same five rounds of non-finite replies with the divergence stop off: the wreck watch ends the run
    wrecked, fleet, nodes, recorder = stand_in_fedavg(num_rounds=8, eval_every=100, clients=2, stop_after_nonfinite=0)
    with pytest.raises(RunWreckedError, match="wrecked: in rounds 1-5 fewer than half of the sampled replies"):
        for server_round in range(1, 9):
            play_round(wrecked, fleet, nodes, server_round, np.nan)
    assert recorder.summary["status"] == "wrecked" and "robust aggregation" in recorder.summary["reason"]
    assert len(wrecked.history) == 5
