import gzip
import json

import numpy as np
import pytest
from conftest import shared_dataset

from datasets import DataSpec, DataUnavailableError, PartitionSpec, dataset_shape, load_client_data, load_source
from datasets.embedded import TEST_PER_CLASS, load_mnist_5k
from datasets.leaf import load_femnist
from datasets.synthetic import make_synthetic
from datasets.torchvision_sources import load_mnist_family, read_idx


def write_idx(path, array, gz):
    codes = {np.dtype(np.uint8): 0x08}
    header = bytes([0, 0, codes[array.dtype], array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    blob = header + array.tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_family_reads_torchvision_layout_plain_or_gz(tmp_path, gz):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = {p: rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for p, n in (("train", 30), ("t10k", 12))}
    labels = {p: rng.integers(0, 10, len(images[p]), dtype=np.uint8) for p in images}
    for part in images:
        write_idx(raw / f"{part}-images-idx3-ubyte", images[part], gz)
        write_idx(raw / f"{part}-labels-idx1-ubyte", labels[part], gz)
    source = load_mnist_family("fashion-mnist", tmp_path, download=False)
    np.testing.assert_array_equal(source.train_x[:, 0], images["train"])
    np.testing.assert_array_equal(source.test_y, labels["t10k"].astype(np.int64))
    assert source.train_x.shape == (30, 1, 28, 28) and source.num_classes == 10


def test_missing_torchvision_files_name_what_is_expected_where(tmp_path):
    with pytest.raises(DataUnavailableError) as err:
        load_mnist_family("mnist", tmp_path, download=False)
    message = str(err.value)
    assert "train-images-idx3-ubyte" in message and str(tmp_path / "MNIST" / "raw") in message
    assert "download = true" in message


def test_read_idx_rejects_non_idx(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not an idx file"):
        read_idx(bad)


def write_leaf(folder, writers, rng, offset):
    folder.mkdir(parents=True)
    for shard, group in enumerate((writers[:2], writers[2:])):
        blob = {"users": group, "num_samples": [], "user_data": {}}
        for w in group:
            n = 3 + offset + len(w)
            blob["num_samples"].append(n)
            blob["user_data"][w] = {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()}
        (folder / f"all_data_{shard}_niid.json").write_text(json.dumps(blob))


def test_leaf_loader_keeps_each_writer_as_one_natural_group(tmp_path, monkeypatch):
    monkeypatch.setenv("STAMEN_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(1)
    writers = ["f_b", "f_a", "f_ccc", "f_dd"]
    write_leaf(tmp_path / "train", writers, rng, offset=4)
    write_leaf(tmp_path / "test", writers, rng, offset=0)
    source = load_femnist(tmp_path)
    assert source.num_classes == 62 and source.train_x.shape[1:] == (1, 28, 28)
    ordered = sorted(writers)
    assert [len(g) for g in source.train_groups] == [7 + len(w) for w in ordered]
    assert [len(g) for g in source.test_groups] == [3 + len(w) for w in ordered]
    first_train = json.loads((tmp_path / "train" / "all_data_0_niid.json").read_text())["user_data"]["f_a"]
    np.testing.assert_allclose(source.train_x[source.train_groups[0]].reshape(-1, 784), first_train["x"], rtol=1e-6)


def test_leaf_loader_keeps_parsed_arrays_in_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STAMEN_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(2)
    writers = ["f_b", "f_a", "f_c"]
    write_leaf(tmp_path / "data" / "train", writers, rng, offset=4)
    write_leaf(tmp_path / "data" / "test", writers, rng, offset=0)
    parsed = load_femnist(tmp_path / "data")
    assert len(list((tmp_path / "cache").glob("femnist-*.npz"))) == 1
    cached = load_femnist(tmp_path / "data")
    for name in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(cached, name), getattr(parsed, name))
    for a, b in zip(cached.train_groups + cached.test_groups, parsed.train_groups + parsed.test_groups, strict=True):
        np.testing.assert_array_equal(a, b)
    # a changed file is a new entry, not a stale read
    path = tmp_path / "data" / "test" / "all_data_1_niid.json"
    blob = json.loads(path.read_text())
    blob["user_data"]["f_c"]["y"][0] = (blob["user_data"]["f_c"]["y"][0] + 1) % 62
    path.write_text(json.dumps(blob) + " ")
    changed = load_femnist(tmp_path / "data")
    assert changed.test_y[changed.test_groups[2][0]] != parsed.test_y[parsed.test_groups[2][0]]
    assert len(list((tmp_path / "cache").glob("femnist-*.npz"))) == 2


def test_leaf_loader_without_files_says_where(tmp_path):
    with pytest.raises(DataUnavailableError, match=r"no LEAF JSON files in .*train"):
        load_femnist(tmp_path)


def test_embedded_mnist_5k_is_stratified_and_fixed():
    source = load_mnist_5k()
    assert source.train_x.shape == (2500, 1, 28, 28) and source.test_x.shape == (2500, 1, 28, 28)
    np.testing.assert_array_equal(np.bincount(source.test_y), np.full(10, TEST_PER_CLASS))
    np.testing.assert_array_equal(np.bincount(source.train_y), np.full(10, 250))
    assert source.train_x.dtype == np.uint8 and source.train_x.max() == 255
    again = load_mnist_5k()
    np.testing.assert_array_equal(source.test_x, again.test_x)
    # real digits: the mean image of class 1 is a thin vertical stroke, darker at the edges
    ones = source.train_x[source.train_y == 1, 0].mean(axis=0)
    assert ones[:, 13:15].mean() > 4 * ones[:, :5].mean()


def test_synthetic_is_seeded_and_heterogeneous():
    a = make_synthetic(alpha=1.0, beta=1.0, num_users=6, seed=4)
    b = make_synthetic(alpha=1.0, beta=1.0, num_users=6, seed=4)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    assert a.train_x.shape[1] == 60 and len(a.train_groups) == 6 and a.num_classes == 10
    means = np.array([a.train_x[g].mean(axis=0) for g in a.train_groups])
    assert np.std(means[:, 0]) > 0.3  # beta = 1 shifts each device's inputs
    flat = make_synthetic(alpha=0.0, beta=0.0, num_users=6, seed=4)
    flat_means = np.array([flat.train_x[g].mean(axis=0) for g in flat.train_groups])
    assert np.std(flat_means[:, 0]) < np.std(means[:, 0])


def test_dataset_shape_matches_loaded_data():
    for spec in (DataSpec("mnist-5k"), DataSpec("synthetic", num_users=3)):
        shape, classes = dataset_shape(spec)
        source = load_source(spec)
        assert source.input_shape == shape and source.num_classes == classes


def test_load_source_is_cached_per_process():
    assert load_source(DataSpec("mnist-5k")) is load_source(DataSpec("mnist-5k"))


def test_real_mnist_10k_in_torchvision_layout():
    root = shared_dataset("mnist-10k")
    source = load_source(DataSpec("mnist", data_dir=str(root)))
    assert source.train_x.shape == (10000, 1, 28, 28) and source.test_x.shape == (10000, 1, 28, 28)
    assert np.bincount(source.test_y).tolist()[:2] == [980, 1135]  # the official test set
    client = load_client_data(
        DataSpec("mnist", data_dir=str(root)), PartitionSpec("perfedavg-paper", 50, images_per_class=34), 49
    )
    assert np.bincount(client.train_y, minlength=10).tolist() == [0, 0, 0, 0, 17, 0, 0, 0, 0, 34]


def test_real_femnist_leaf():
    root = shared_dataset("femnist-leaf")
    source = load_source(DataSpec("femnist", data_dir=str(root)))
    assert len(source.train_groups) == 105
    assert len(source.train_y) == 14708 and len(source.test_y) == 1685
    client = load_client_data(DataSpec("femnist", data_dir=str(root)), PartitionSpec("natural", 105), 104)
    assert len(client.train_y) == len(source.train_groups[104]) and len(client.test_y) > 0
