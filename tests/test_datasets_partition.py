import numpy as np
import pytest

from datasets import ArraySource, NotEnoughDataError, PartitionSpec, partition
from datasets.partition import paper_counts


def labelled_source(per_class_train: int, per_class_test: int, num_classes: int = 10) -> ArraySource:
    train_y = np.repeat(np.arange(num_classes), per_class_train)
    test_y = np.repeat(np.arange(num_classes), per_class_test)
    rng = np.random.default_rng(123)
    train_y, test_y = rng.permutation(train_y), rng.permutation(test_y)
    return ArraySource(
        name="toy",
        train_x=np.zeros((len(train_y), 3), np.float32),
        train_y=train_y,
        test_x=np.zeros((len(test_y), 3), np.float32),
        test_y=test_y,
        num_classes=num_classes,
    )


def class_counts(labels, idx, num_classes=10):
    return np.bincount(labels[idx], minlength=num_classes)


@pytest.mark.parametrize("variant", ["standard", "diff-hetero"])
def test_perfedavg_paper_split_matches_b1_exactly(variant):
    # B1: n = 50, a = 34; users 0..24 hold a of each class 0-4; user 25 + j holds
    # a/2 of class j % 5 (none under diff-hetero) and a of class 5 + (j // 5) % 5.
    n, a = 50, 34
    source = labelled_source(1000, 1000)
    splits = partition(source, PartitionSpec("perfedavg-paper", n, seed=3, images_per_class=a, paper_variant=variant))
    assert len(splits) == n
    for k, split in enumerate(splits):
        expected = np.zeros(10, dtype=int)
        if k < n // 2:
            expected[:5] = a
        else:
            j = k - n // 2
            if variant == "standard":
                expected[j % 5] = a // 2
            expected[5 + (j // 5) % 5] = a
        np.testing.assert_array_equal(class_counts(source.train_y, split.train), expected)
        np.testing.assert_array_equal(class_counts(source.test_y, split.test), expected)
        assert not split.test_from_train


def test_perfedavg_paper_consumes_each_shuffled_pool_in_user_order():
    source = labelled_source(200, 200)
    spec = PartitionSpec("perfedavg-paper", 10, seed=11, images_per_class=4)
    splits = partition(source, spec)
    rng = np.random.default_rng(11)
    pools = [rng.permutation(np.flatnonzero(source.train_y == c)) for c in range(10)]
    counts = paper_counts(10, 4, "standard")
    for c in range(10):
        if counts[:, c].sum() == 0:  # with n = 10 only class 5 of 5-9 is used
            assert all(np.intersect1d(s.train, pools[c]).size == 0 for s in splits)
            continue
        taken = np.concatenate([np.intersect1d(s.train, pools[c]) for s in splits])
        np.testing.assert_array_equal(np.sort(taken), np.sort(pools[c][: counts[:, c].sum()]))
        first_user = np.flatnonzero(counts[:, c])[0]
        np.testing.assert_array_equal(
            np.sort(np.intersect1d(splits[first_user].train, pools[c])), np.sort(pools[c][: counts[first_user, c]])
        )


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "perfedavg-paper"])
def test_partitions_are_disjoint_and_reproducible(name):
    source = labelled_source(100, 40)
    spec = PartitionSpec(name, 10, seed=5, images_per_class=4, concentration=0.3, classes_per_client=2)
    first, again = partition(source, spec), partition(source, spec)
    for pool in ("train", "test"):
        everything = np.concatenate([getattr(s, pool) for s in first])
        assert len(everything) == len(np.unique(everything)), f"{pool} indices overlap"
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(getattr(a, pool), getattr(b, pool))
    other = partition(source, PartitionSpec(**{**spec.__dict__, "seed": 6}))
    assert any(not np.array_equal(a.train, b.train) for a, b in zip(first, other, strict=True))


def test_iid_uses_all_data_evenly():
    source = labelled_source(100, 40)
    splits = partition(source, PartitionSpec("iid", 10))
    assert sum(len(s.train) for s in splits) == 1000
    assert {len(s.train) for s in splits} == {100}
    for s in splits:
        np.testing.assert_array_equal(class_counts(source.train_y, s.train), np.full(10, 10))


def test_shards_give_each_client_exactly_k_classes_in_train_and_test():
    source = labelled_source(100, 40)
    splits = partition(source, PartitionSpec("shards", 10, classes_per_client=3, seed=2))
    for s in splits:
        train_classes = set(np.unique(source.train_y[s.train]))
        assert len(train_classes) == 3
        assert set(np.unique(source.test_y[s.test])) == train_classes


def test_dirichlet_test_split_follows_the_client_class_mix():
    source = labelled_source(300, 300)
    splits = partition(source, PartitionSpec("dirichlet", 5, concentration=0.2, seed=9))
    for s in splits:  # equal pools, same shares: the same counts up to rounding
        diff = class_counts(source.train_y, s.train) - class_counts(source.test_y, s.test)
        assert np.abs(diff).max() <= 1


def test_hold_out_when_source_has_no_test_set():
    source = labelled_source(50, 0)
    splits = partition(source, PartitionSpec("iid", 5, test_fraction=0.2))
    for s in splits:
        assert s.test_from_train
        assert len(np.intersect1d(s.train, s.test)) == 0
        assert len(s.test) == 20 and len(s.train) == 80


def test_running_out_of_images_says_how_many_exist():
    source = labelled_source(20, 20)
    with pytest.raises(NotEnoughDataError, match=r"holds 20 images of class 0 but the split needs 25"):
        partition(source, PartitionSpec("perfedavg-paper", 4, images_per_class=10))


def test_more_clients_than_examples_or_users_is_an_error():
    source = labelled_source(1, 1)
    with pytest.raises(NotEnoughDataError, match="asked for 11 clients but the data holds 10"):
        partition(source, PartitionSpec("iid", 11))
    grouped = ArraySource(
        "g", np.zeros((4, 1)), np.zeros(4, int), np.zeros((0, 1)), np.zeros(0, int), 2,
        train_groups=(np.arange(2), np.arange(2, 4)),
    )  # fmt: skip
    with pytest.raises(NotEnoughDataError, match="asked for 3 clients but the data holds 2 users"):
        partition(grouped, PartitionSpec("natural", 3))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (PartitionSpec("perfedavg-paper", 5), "even number of clients"),
        (PartitionSpec("perfedavg-paper", 4, images_per_class=3), "must be even"),
        (PartitionSpec("nope", 4), "is not one of"),
        (PartitionSpec("natural", 4), "needs a dataset with users"),
        (PartitionSpec("shards", 4, classes_per_client=11), r"classes-per-client must be in \[1, 10\]"),
    ],
)
def test_bad_partition_parameters(spec, message):
    with pytest.raises(ValueError, match=message):
        partition(labelled_source(50, 10), spec)
