"""CIFAR-10 as the field runs it: PFLlib's pooled splits, per-channel normalisation, FedBN's feature shift.

The rules are checked against what PFLlib's ``separate_data``/``split_data`` do (class
dealing, the even-share cap, the 75/25 split of each client's pool) on labels made for
the purpose; the real JPEG files are read only where ``../shared/data/cifar10-jpeg`` is.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from app.config import ConfigError, model_layout, parse_settings
from clients.batches import to_tensor
from datasets import ArraySource, DataSpec, NotEnoughDataError, PartitionSpec, load_client_data, partition
from datasets.feature_shift import LUMA, colour_transform, shift_colours
from datasets.partition import PRACTICAL_MIN_EXAMPLES, pathological_counts
from datasets.registry import pooled_take
from tests.conftest import shared_dataset

CIFAR_CLASSES = "airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck"


def pooled_source(per_class_train: int, per_class_test: int, num_classes: int = 10) -> ArraySource:
    """A source whose every example is its own index (train 0.., test after), so a client's arrays name themselves."""
    train_y = np.random.default_rng(1).permutation(np.repeat(np.arange(num_classes), per_class_train))
    test_y = np.random.default_rng(2).permutation(np.repeat(np.arange(num_classes), per_class_test))
    n_train = len(train_y)
    return ArraySource(name="toy", train_x=np.arange(n_train, dtype=np.float32)[:, None], train_y=train_y,
                       test_x=np.arange(n_train, n_train + len(test_y), dtype=np.float32)[:, None], test_y=test_y,
                       num_classes=num_classes)  # fmt: skip


# ------------------------------------------------------------------ PFLlib's pathological rule


def test_pathological_counts_deal_classes_in_order_to_the_first_clients_that_lack_them():
    sizes = np.full(10, 6000)
    counts = pathological_counts(sizes, 20, 2, np.random.default_rng(0))
    # ceil(20 / 10 * 2) = 4 holders a class: clients 0-3 take classes 0 and 1, clients 4-7 classes 2 and 3, ...
    for client in range(20):
        held = np.flatnonzero(counts[client]).tolist()
        assert held == [2 * (client // 4), 2 * (client // 4) + 1]
    assert counts.sum(axis=0).tolist() == sizes.tolist()
    share = 6000 / 4
    for c in range(10):
        holders = np.flatnonzero(counts[:, c])
        drawn = counts[holders[:-1], c]  # every holder but the last draws from [share / 10, share)
        assert drawn.min() >= int(share / 10) and drawn.max() < share
        assert counts[holders[-1], c] == 6000 - drawn.sum()


def test_pathological_split_pools_train_and_test_and_holds_out_a_quarter_of_each_client():
    source = pooled_source(300, 60)
    splits = partition(source, PartitionSpec("pfllib-pathological", 20, seed=4, classes_per_client=2,
                                             test_fraction=0.25))  # fmt: skip
    every = np.concatenate([np.concatenate([s.train, s.test]) for s in splits])
    assert sorted(every.tolist()) == list(range(3600))  # the whole pool, each example once
    labels = np.concatenate([source.train_y, source.test_y])
    for split in splits:
        assert split.pooled
        n = len(split.train) + len(split.test)
        assert len(split.test) == math.ceil(0.25 * n)  # sklearn's train_test_split(train_size=0.75)
        assert len(np.unique(labels[np.concatenate([split.train, split.test])])) == 2
    again = partition(source, PartitionSpec("pfllib-pathological", 20, seed=4, test_fraction=0.25))
    other = partition(source, PartitionSpec("pfllib-pathological", 20, seed=5, test_fraction=0.25))
    assert all(np.array_equal(a.train, b.train) for a, b in zip(splits, again, strict=True))
    assert not all(np.array_equal(a.train, b.train) for a, b in zip(splits, other, strict=True))


def test_a_pooled_client_gets_exactly_its_examples_from_train_and_test():
    source = pooled_source(300, 60)
    mine = partition(source, PartitionSpec("pfllib-pathological", 20, seed=0, test_fraction=0.25))[7]
    x, y = pooled_take(source, mine.test)
    assert x[:, 0].astype(int).tolist() == mine.test.tolist()  # each example is its own index
    assert np.array_equal(y, np.concatenate([source.train_y, source.test_y])[mine.test])


# ------------------------------------------------------------------ PFLlib's practical rule


def test_practical_split_caps_clients_at_the_even_share_and_gives_everyone_the_minimum():
    source = pooled_source(600, 100)
    splits = partition(source, PartitionSpec("pfllib-practical", 20, seed=3, concentration=0.1, test_fraction=0.25))
    sizes = np.array([len(s.train) + len(s.test) for s in splits])
    assert sizes.sum() == 7000 and sizes.min() >= PRACTICAL_MIN_EXAMPLES
    labels = np.concatenate([source.train_y, source.test_y])
    mixes = [np.sort(np.bincount(labels[np.concatenate([s.train, s.test])], minlength=10))[::-1] for s in splits]
    # Dirichlet(0.1): most clients hold most of their examples in very few classes
    assert np.median([m[:2].sum() / m.sum() for m in mixes]) > 0.8


def test_practical_split_with_a_flat_dirichlet_is_near_even():
    source = pooled_source(600, 100)
    splits = partition(source, PartitionSpec("pfllib-practical", 10, seed=0, concentration=1e5, test_fraction=0.25))
    sizes = np.array([len(s.train) + len(s.test) for s in splits])
    assert np.all(np.abs(sizes - 700) <= 12)  # each class's 700 split ten ways, floor-rounded


def test_practical_split_says_when_clients_cannot_get_the_minimum():
    with pytest.raises(NotEnoughDataError, match="pfllib-practical left a client under 40 examples"):
        partition(pooled_source(20, 5), PartitionSpec("pfllib-practical", 10, concentration=0.01))


# ------------------------------------------------------------------ FedBN's feature shift


def test_colour_transform_is_the_clients_own_and_fixed_by_the_seed():
    assert colour_transform(3, 5) == colour_transform(3, 5)
    assert colour_transform(3, 5) != colour_transform(3, 6) != colour_transform(4, 6)
    drawn = [colour_transform(0, k) for k in range(400)]
    assert 0.15 < np.mean([t["greyscale"] for t in drawn]) < 0.35


def test_shift_colours_against_a_per_pixel_computation():
    images = np.random.default_rng(0).integers(0, 256, size=(3, 3, 4, 5), dtype=np.uint8)
    for greyscale in (False, True):
        transform = {"greyscale": greyscale, "contrast": 1.3, "brightness": -0.1, "gains": [0.8, 1.0, 1.2]}
        shifted = shift_colours(images, transform)
        for n, c, i, j in [(0, 0, 0, 0), (1, 2, 3, 4), (2, 1, 2, 1)]:
            pixel = images[n, :, i, j].astype(np.float64) / 255
            value = float(LUMA @ pixel) if greyscale else pixel[c]
            expected = min(max(((value - 0.5) * 1.3 + 0.5 - 0.1) * [0.8, 1.0, 1.2][c], 0.0), 1.0)
            assert abs(int(shifted[n, c, i, j]) - round(expected * 255)) <= 1
    with pytest.raises(ValueError, match="feature-shift 'colour' needs uint8 RGB images"):
        shift_colours(np.zeros((2, 1, 4, 4), np.uint8), colour_transform(0, 0))


def test_a_shifted_client_sees_its_own_transform_on_train_and_test(tmp_path):
    root = cifar_subset(tmp_path, train_per_class=8, test_per_class=4)
    data = DataSpec("imagefolder", data_dir=str(root), classes=tuple(CIFAR_CLASSES.split(",")),
                    input_shape=(3, 32, 32))  # fmt: skip
    plain = load_client_data(data, PartitionSpec("iid", 4, seed=2), 1)
    shifted = load_client_data(data, PartitionSpec("iid", 4, seed=2, feature_shift="colour"), 1)
    transform = colour_transform(2, 1)
    assert np.array_equal(shifted.train_x, shift_colours(plain.train_x, transform))
    assert np.array_equal(shifted.test_x, shift_colours(plain.test_x, transform))
    assert np.array_equal(shifted.train_y, plain.train_y)


# ------------------------------------------------------------------ per-channel normalisation


def test_to_tensor_normalises_each_channel_after_scaling():
    images = np.random.default_rng(0).integers(0, 256, size=(5, 3, 2, 2), dtype=np.uint8)
    mean, std = (0.5, 0.4, 0.3), (0.25, 0.2, 0.1)
    tensor = to_tensor(images, torch.device("cpu"), (mean, std))
    expected = (images / 255.0 - np.array(mean)[None, :, None, None]) / np.array(std)[None, :, None, None]
    assert np.allclose(tensor.numpy(), expected, atol=1e-5)
    assert torch.equal(to_tensor(images, torch.device("cpu")), torch.from_numpy(images).float() / 255)
    with pytest.raises(ValueError, match="'input-mean'/'input-std' give 3 channel values"):
        to_tensor(np.zeros((2, 1, 4, 4), np.uint8), torch.device("cpu"), (mean, std))


@pytest.mark.parametrize(("keys", "message"), [
    ({"input-mean": "0.5,0.5,0.5"}, "'input-mean' and 'input-std' must give as many values"),
    ({"input-mean": "0.5,x", "input-std": "1,1"}, "run config key 'input-mean': '0.5,x' is not comma-separated"),
    ({"input-mean": "0.5", "input-std": "0"}, "run config key 'input-std': '0' must be positive"),
    ({"feature-shift": "sepia"}, "feature-shift"),
])  # fmt: skip
def test_bad_normalisation_and_shift_keys_are_named(keys, message):
    with pytest.raises(ConfigError, match=message):
        parse_settings(keys)


@pytest.mark.parametrize(("keys", "message"), [
    ({"feature-shift": "colour"}, "'feature-shift': 'colour' needs RGB images .* shape 1x28x28"),
    ({"input-mean": "0.5,0.5,0.5", "input-std": "1,1,1"}, "'input-mean': 3 values, but dataset 'mnist-5k' has 1"),
])  # fmt: skip
def test_inputs_that_do_not_fit_the_data_are_refused_before_any_work(keys, message):
    with pytest.raises(ConfigError, match=message):
        model_layout(parse_settings(keys))


def test_pfllib_partitioners_take_their_keys():
    settings = parse_settings({"partitioner": "pfllib-practical", "dirichlet-concentration": 0.1,
                               "test-fraction": 0.25})  # fmt: skip
    spec = settings.partition_spec(20)
    assert (spec.name, spec.concentration, spec.test_fraction) == ("pfllib-practical", 0.1, 0.25)
    spec = parse_settings({"partitioner": "pfllib-pathological", "classes-per-client": 3}).partition_spec(20)
    assert spec.classes_per_client == 3


# ------------------------------------------------------------------ the real JPEG files


def cifar_subset(tmp_path, *, train_per_class: int, test_per_class: int):
    """A few of ``../shared/data/cifar10-jpeg``'s files per class, copied into an image folder of the same layout."""
    root = shared_dataset("cifar10-jpeg")
    for split, count in (("train", train_per_class), ("test", test_per_class)):
        for folder in sorted((root / split).iterdir()):
            target = tmp_path / "cifar" / split / folder.name
            target.mkdir(parents=True)
            for image in sorted(folder.glob("*.jpg"))[:count]:
                shutil.copy(image, target / image.name)
    return tmp_path / "cifar"


def test_real_cifar_jpegs_run_a_round_of_the_pathological_split(tmp_path, monkeypatch):
    from app.local.inprocess import InProcessRun

    monkeypatch.setenv("STAMEN_CACHE_DIR", str(tmp_path / "cache"))
    root = cifar_subset(tmp_path, train_per_class=30, test_per_class=10)
    config = {"dataset": "imagefolder", "data-dir": str(root), "classes": CIFAR_CLASSES, "input-shape": "3x32x32",
              "partitioner": "pfllib-pathological", "test-fraction": 0.25, "model": "fedavg-cnn",
              "strategy": "fedavg", "min-available-clients": 5, "fraction-fit": 1.0, "local-steps": 2,
              "input-mean": "0.4913,0.4821,0.4465", "input-std": "0.2452,0.2428,0.2606",
              "num-server-rounds": 1, "eval-every": 1}  # fmt: skip
    run = InProcessRun(run_config=config, num_clients=5)
    pooled = sum(len(c.data.train_y) + len(c.data.test_y) for c in run.clients)
    assert pooled == 400  # 300 training and 100 test images, all of them dealt
    assert all(len(np.unique(c.data.train_y)) == 2 for c in run.clients)
    assert abs(float(run.clients[0].train_x.mean())) < 0.5  # normalised, not [0, 1]
    metrics = run.step()
    assert metrics["client-steps"] == 10 and np.isfinite(metrics["train-loss"])
    assert 0.0 <= run.evaluate()["accuracy-client-mean"] <= 1.0
    assert list((tmp_path / "cache").glob("imagefolder-*.npz"))  # decoded once, kept for the next process
