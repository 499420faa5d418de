"""B8 beside PFLlib (bench/pfllib_parity.py): the exported clients read back as PFLlib reads them; the figures."""

import numpy as np
import pytest
import torch

from app.config import parse_settings
from bench.pfllib_parity import ALGORITHMS, pfllib_figures, stamen_config
from bench.pfllib_setup import export, fingerprint


def clients(seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, 3, 4, 4)).astype(np.float32), rng.integers(0, 10, n),
             rng.normal(size=(n // 2, 3, 4, 4)).astype(np.float32), rng.integers(0, 10, n // 2))
            for n in (6, 9)]  # fmt: skip


def read_as_pfllib(folder, index, train):
    """PFLlib's utils/data_utils.read_data and process_image, as its commit has them."""
    with open(folder / ("train" if train else "test") / f"{index}.npz", "rb") as file:
        data = np.load(file, allow_pickle=True)["data"].tolist()
    x, y = torch.Tensor(data["x"]).type(torch.float32), torch.Tensor(data["y"]).type(torch.int64)
    return [(a, b) for a, b in zip(x, y, strict=True)]


def test_the_exported_clients_read_back_through_pfllibs_reader_with_the_same_fingerprint(tmp_path):
    held = clients()
    stamp = export(held, tmp_path)
    back = []
    for index in range(len(held)):
        train, test = read_as_pfllib(tmp_path, index, True), read_as_pfllib(tmp_path, index, False)
        back.append(tuple(torch.stack([pair[k] for pair in part]).numpy() for part in (train, test) for k in (0, 1)))
    assert fingerprint(back) == stamp == fingerprint(held)
    changed = [tuple(a.copy() for a in c) for c in held]
    changed[1][0][0, 0, 0, 0] += 1e-6
    assert fingerprint(changed) != stamp  # one input value in one client moves it
    assert fingerprint(clients(seed=1)) != stamp


def test_pfllibs_counts_become_its_figure_and_the_client_mean_and_round_zero_is_left_out():
    result = {"evaluations": [{"round": 0, "correct": [1.0, 1.0], "examples": [10, 30]},
                              {"round": 2, "correct": [5.0, 30.0], "examples": [10, 30]}]}  # fmt: skip
    (figures,) = pfllib_figures(result)
    assert figures == {"round": 2, "accuracy": pytest.approx(35 / 40), "accuracy-client-mean": pytest.approx(0.75)}


def test_fedproto_compares_each_clients_own_model_and_keeps_pfllibs_prototype_figure_beside_it():
    result = {"evaluations": [{"round": 1, "correct": [2.0, 3.0], "examples": [10, 10],
                               "own-model-correct": [4.0, 8.0]}]}  # fmt: skip
    (figures,) = pfllib_figures(result)
    assert figures["accuracy"] == pytest.approx(0.6) and figures["accuracy-client-mean"] == pytest.approx(0.6)
    assert figures["prototype-accuracy"] == pytest.approx(0.25)


@pytest.mark.parametrize("method", list(ALGORITHMS))
def test_stamens_side_runs_pfllibs_defaults(method):
    config = stamen_config(method, seed=1, rounds=4, every=2)
    settings = parse_settings(config)  # every key is one stamen takes, with a value it accepts
    assert (settings.training.lr, settings.training.batch_size) == (0.005, 10)
    assert settings.run.fraction_fit == 1.0 and settings.run.aggregation == "examples"
    expected = {"perfedavg": 2.0}.get(method, 1.0)  # PFLlib's Per-FedAvg trains its epoch twice a round
    assert settings.training.local_epochs == expected
    assert settings.training.adapt_steps == (1 if method == "perfedavg" else 0)


def test_the_curves_pair_seeds_and_say_nothing_about_noise_from_one_seed(tmp_path):
    from types import SimpleNamespace

    from bench.harness import RunLog
    from bench.pfllib_parity import KEY_FIELDS, curve_rows

    log = RunLog(path=tmp_path / "runs.jsonl", key_fields=KEY_FIELDS)
    figures = {("stamen", 0): 0.50, ("pfllib", 0): 0.40, ("stamen", 1): 0.60, ("pfllib", 1): 0.56, ("stamen", 2): 0.7}
    for (system, seed), accuracy in figures.items():
        log.append({"system": system, "method": "fedavg", "seed": seed, "rounds": 1, "every": 1,
                    "figures": [{"round": 1, "accuracy": accuracy}]})  # fmt: skip
    args = SimpleNamespace(seeds=[0, 1, 2], rounds=1, every=1)
    (row,) = curve_rows(log, args, "fedavg", "accuracy")
    assert row["seeds"] == [0, 1] and row["gap"] == pytest.approx(7.0)  # (10 + 4) / 2, seed 2 has no pair
    assert row["within-noise"] == (abs(row["gap"]) <= row["gap-ci95"])
    (alone,) = curve_rows(log, SimpleNamespace(seeds=[0], rounds=1, every=1), "fedavg", "accuracy")
    assert alone["within-noise"] is None
