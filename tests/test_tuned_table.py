"""B9's budgeted search (``bench/tuned_table.py``): its configurations, its scoring and its divergence stop.

The benchmark's figures come from its runs; here: every configuration it would run is a
valid run config, the search is the same list every time, each method's step sizes stay
tied as B7 ties them, the winner is picked on validation scores only, and a diverging run
stops and scores below every finished one.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.config import parse_settings
from app.registry import METHODS
from bench.harness import RunLog
from bench.personalised_setup import (
    CONFIGS,
    DATASETS,
    LR_RANGE,
    SEARCH_SEED,
    SPACES,
    TUNED_KEY_FIELDS,
    Dim,
    own_keys,
    search_space,
    selftuned_keys,
    tuned_run_config,
)
from bench.tuned_table import best_config, one_run


def test_a_dimension_maps_the_unit_interval_onto_its_range():
    assert Dim("k", "log", 0.01, 1.0).value(0.0) == pytest.approx(0.01)
    assert Dim("k", "log", 0.01, 1.0).value(0.5) == pytest.approx(0.1)  # the geometric middle
    assert Dim("k", "linear", 0.5, 1.0).value(0.5) == pytest.approx(0.75)
    assert [Dim("k", "int", 1, 4).value(u) for u in (0.0, 0.26, 0.51, 0.99)] == [1, 2, 3, 4]
    assert [Dim("k", "choice", choices=("a", "b")).value(u) for u in (0.1, 0.6, 0.999)] == ["a", "b", "b"]


@pytest.mark.parametrize("dataset", ["femnist", "mnist-folder-dirichlet", "mnist-paper"])
@pytest.mark.parametrize("method", sorted(SPACES))
def test_every_configuration_searched_is_a_valid_run_config(method, dataset):
    configs = search_space(method, dataset)
    assert len(configs) == CONFIGS and configs == search_space(method, dataset)  # seeded: the same list each time
    data = DATASETS[dataset]
    assert configs[0] == {"lr": data.lr(), **own_keys(method, data)}  # the first is B7's shared setting
    for keys in configs:
        config = tuned_run_config(dataset, method, keys, seed=0, rounds=2, validation=0.2, folder=Path("/folder"))
        assert parse_settings(config).run.strategy == method
        assert LR_RANGE[0] <= keys["lr"] <= LR_RANGE[1]
        tied = {"perfedavg": "perfedavg-beta", "diffusion": "diffusion-mu", "ditto": "ditto-personal-lr",
                "apfl": "apfl-alpha-lr"}.get(method)  # fmt: skip
        if tied:
            assert keys[tied] == keys["lr"]
        if method == "pfedme":  # past lr * lambda = 1 the local model overshoots theta; B9 caps at 0.5
            assert keys["lr"] * keys["pfedme-lambda"] <= (0.5 + 1e-12 if keys is not configs[0] else 0.99)


def test_the_step_sizes_searched_cover_the_range_one_per_stratum():
    # a scrambled Sobol sequence puts its first 2^k points one in each of 2^k strata; B9 draws 7 after B7's
    steps = [c["lr"] for c in search_space("fedavg", "femnist")[1:]]
    logs = [math.log(lr / LR_RANGE[0]) / math.log(LR_RANGE[1] / LR_RANGE[0]) for lr in steps]
    assert len({int(u * 8) for u in logs}) == 7


def test_the_self_tuned_column_starts_from_b7s_setting_only_for_tunable_methods():
    for method in SPACES:
        keys = selftuned_keys(method, "femnist")
        tunable = METHODS[method].contract.tunable is not None and method != "fathom"
        assert (keys is not None) == tunable
        if keys is not None:
            assert keys == {**search_space(method, "femnist")[0], "tune": "fathom"}


def record(log, method, config, status="completed", accuracy=None):
    log.append({"dataset": "femnist", "method": method, "phase": "search", "config": config, "seed": SEARCH_SEED,
                "rounds": 100, "status": status, "accuracy": accuracy})  # fmt: skip


def test_the_winner_is_the_best_validation_score_and_a_diverged_run_never_wins(tmp_path):
    log = RunLog(path=tmp_path / "runs.jsonl", key_fields=TUNED_KEY_FIELDS)
    record(log, "fedavg", 0, accuracy=0.7)
    assert best_config(log, "femnist", "fedavg", 100, 3) is None  # not until the whole search has run
    record(log, "fedavg", 1, status="diverged")
    record(log, "fedavg", 2, accuracy=0.7)
    assert best_config(log, "femnist", "fedavg", 100, 3) == 0  # a tie goes to the earlier configuration
    record(log, "fedavg", 2, accuracy=0.71)
    assert best_config(log, "femnist", "fedavg", 100, 3) == 2
    record(log, "ditto", 0, status="diverged")
    record(log, "ditto", 1, accuracy=0.0)
    assert best_config(log, "femnist", "ditto", 100, 2) == 1


def test_a_run_whose_train_loss_stays_non_finite_stops_and_says_where():
    config = tuned_run_config("mnist-paper", "fedavg", {"lr": 50.0}, seed=0, rounds=10, validation=0.2, folder=None)
    result = one_run(config, 50, 10)
    assert result["status"] == "diverged" and result["diverged-at"] == 3
    assert "accuracy" not in result


def test_a_gap_past_five_points_gets_the_run_with_every_client_every_round(tmp_path):
    import argparse

    from bench.personalised_setup import keys_of
    from bench.tuned_table import large_gaps

    log = RunLog(path=tmp_path / "runs.jsonl", key_fields=TUNED_KEY_FIELDS)
    args = argparse.Namespace(methods=["fedavg", "ditto", "diffusion"], seeds=[0, 1], configs=1,
                              rounds={"femnist": 100})  # fmt: skip
    for method, accuracies in {"fedavg": (0.75, 0.73), "ditto": (0.70, 0.69), "diffusion": (0.07, 0.06)}.items():
        record(log, method, 0, accuracy=0.5)
        for seed, accuracy in enumerate(accuracies):
            log.append({"dataset": "femnist", "method": method, "phase": "test", "config": 0, "seed": seed,
                        "rounds": 100, "status": "completed", "accuracy": accuracy})  # fmt: skip
    assert large_gaps(log, "femnist", args) == ["diffusion"]  # ditto is 4.5 points under, diffusion 67.5
    keys = keys_of({"dataset": "femnist", "method": "diffusion", "phase": "all-clients", "config": 0})
    assert keys["fraction-fit"] == 1.0 and keys["diffusion-participation"] == 1.0
    assert keys["diffusion-mu"] == search_space("diffusion", "femnist")[0]["diffusion-mu"]


def test_scaffolds_every_client_run_also_goes_at_b7s_setting_when_the_search_chose_another(tmp_path):
    import argparse

    from bench.tuned_table import jobs

    log = RunLog(path=tmp_path / "runs.jsonl", key_fields=TUNED_KEY_FIELDS)
    args = argparse.Namespace(datasets=["femnist"], methods=["fedavg", "scaffold", "diffusion"], seeds=[0], configs=2,
                              rounds={"femnist": 100})  # fmt: skip
    scores = {"fedavg": (0.7, 0.5), "scaffold": (0.1, 0.2), "diffusion": (0.07, 0.06)}  # scaffold chooses config 1
    for method, (first, second) in scores.items():
        record(log, method, 0, accuracy=first)
        record(log, method, 1, accuracy=second)
        best = 0 if first >= second else 1
        log.append({"dataset": "femnist", "method": method, "phase": "test", "config": best, "seed": 0,
                    "rounds": 100, "status": "completed", "accuracy": max(first, second)})  # fmt: skip
    planned = sorted((j["method"], j["config"]) for j in jobs(log, args, "all-clients"))
    assert planned == [("diffusion", 0), ("scaffold", 0), ("scaffold", 1)]  # diffusion's winner is B7's already
