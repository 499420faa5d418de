"""The validation split: a seeded share of each client's training data that evaluations read instead of the test."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from app.client_app import build_client
from app.config import ConfigError, parse_settings
from app.local.inprocess import InProcessRun
from datasets import ClientData, NotEnoughDataError, hold_out_validation, load_client_data


def client_data(count: int) -> ClientData:
    # each training example carries its own index, so where it went can be read back
    train_x = np.arange(count, dtype=np.float32).reshape(count, 1)
    return ClientData(train_x=train_x, train_y=np.arange(count) % 3, test_x=np.full((5, 1), -1.0, np.float32),
                      test_y=np.zeros(5, np.int64), num_classes=3)  # fmt: skip


def rows(x: np.ndarray) -> set[float]:
    return {float(v) for v in x.ravel()}


def test_a_quarter_of_the_training_examples_becomes_the_evaluation_split_and_the_test_split_is_dropped():
    held = hold_out_validation(client_data(10), fraction=0.25, seed=3, partition_id=1)
    assert len(held.test_y) == 3 and len(held.train_y) == 7  # ceil(0.25 * 10)
    assert rows(held.train_x) | rows(held.test_x) == set(range(10)) and not rows(held.train_x) & rows(held.test_x)
    assert -1.0 not in rows(held.test_x)  # nothing of the test split is left
    np.testing.assert_array_equal(held.test_y, held.test_x.ravel().astype(int) % 3)  # labels travel with examples


def test_the_draw_is_fixed_by_seed_and_partition_and_differs_between_them():
    def validation(seed, partition_id):
        return rows(hold_out_validation(client_data(40), fraction=0.25, seed=seed, partition_id=partition_id).test_x)

    assert validation(0, 2) == validation(0, 2)
    assert validation(0, 2) != validation(0, 3) and validation(0, 2) != validation(1, 2)


def test_fraction_zero_is_the_data_itself_and_the_edges_keep_one_example_each_side():
    data = client_data(4)
    assert hold_out_validation(data, fraction=0.0, seed=0, partition_id=0) is data
    tiny = hold_out_validation(client_data(2), fraction=0.01, seed=0, partition_id=0)
    assert len(tiny.test_y) == 1 and len(tiny.train_y) == 1
    most = hold_out_validation(client_data(3), fraction=0.99, seed=0, partition_id=0)
    assert len(most.train_y) == 1 and len(most.test_y) == 2
    with pytest.raises(NotEnoughDataError, match="needs at least 2"):
        hold_out_validation(client_data(1), fraction=0.5, seed=0, partition_id=0)
    with pytest.raises(ValueError, match="validation-fraction must be in"):
        hold_out_validation(data, fraction=1.0, seed=0, partition_id=0)


def test_the_key_is_checked_and_central_eval_which_reads_the_test_set_is_refused():
    with pytest.raises(ConfigError, match="validation-fraction"):
        parse_settings({"validation-fraction": 1.0})
    with pytest.raises(ConfigError, match="run config key 'central-eval'.*validation-fraction = 0.2"):
        parse_settings({"validation-fraction": 0.2, "central-eval": True})
    assert parse_settings({"validation-fraction": 0.2}).data.validation_fraction == 0.2


def test_a_flower_client_and_an_in_process_one_evaluate_on_the_same_held_out_training_examples():
    config = {"strategy": "fedavg", "validation-fraction": 0.25, "num-threads": 1, "seed": 4}
    settings = parse_settings(config)
    whole = load_client_data(settings.data_spec(50), settings.partition_spec(50), 7)
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 7, "num-partitions": 50}, state=RecordDict(),
                      run_config=config)  # fmt: skip
    client = build_client(context)
    flower_side = client.data
    run = InProcessRun(run_config=config, num_clients=50)
    in_process = run.clients[7].data
    # the loader a sampled preflight uses for another partition holds out that partition's share
    np.testing.assert_array_equal(client.reload(9).test_x, run.clients[9].data.test_x)
    for data in (flower_side, in_process):
        assert len(data.train_y) + len(data.test_y) == len(whole.train_y)
        # every validation image is one of the client's training images, none of its test images
        train_images = {image.tobytes() for image in whole.train_x}
        assert all(image.tobytes() in train_images for image in data.test_x)
    np.testing.assert_array_equal(flower_side.test_x, in_process.test_x)
    np.testing.assert_array_equal(flower_side.train_y, in_process.train_y)
