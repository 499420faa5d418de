import numpy as np
import pytest
import torch
from conftest import settings

from clients.batches import batch_indices, steps_for
from clients.fedavg import FedAvgClient
from clients.models import build_model, parameter_count
from datasets import ClientData


def blobs(n, seed, flip=False):
    """Two separable Gaussian blobs in 2-D; ``flip`` swaps the labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(0, 0.3, (n, 2)) + np.where(y[:, None] == 1, 2.0, -2.0)
    return x.astype(np.float32), (1 - y if flip else y).astype(np.int64)


def toy_client(flip=False, **overrides):
    train_x, train_y = blobs(200, 0, flip)
    test_x, test_y = blobs(100, 1, flip)
    data = ClientData(train_x, train_y, test_x, test_y, num_classes=2)
    model = build_model("logreg", input_shape=(2,), num_classes=2, seed=0)
    defaults = {"strategy": "fedavg", "model": "logreg", "lr": 0.5, "local_steps": 20, "batch_size": 32,
                "adapt_steps": 5, "adapt_lr": 1.0, "adapt_batch_size": 0, "device": "cpu"}  # fmt: skip
    return FedAvgClient(model=model, data=data, settings=settings(**{**defaults, **overrides}), partition_id=3)


def test_personalised_evaluation_adapts_a_copy_and_beats_the_unadapted_model():
    trained_on_other_task = toy_client(flip=False)
    global_params, _, _ = trained_on_other_task.fit(trained_on_other_task.get_parameters({}), {"server-round": 1})
    client = toy_client(flip=True)  # same inputs, opposite labels: the global model is wrong here
    loss, n, metrics = client.evaluate(global_params, {"server-round": 1})
    assert n == 100
    assert metrics["global-accuracy"] < 0.1
    assert metrics["accuracy"] > 0.9  # five full-batch steps fix the decision rule
    for before, after in zip(global_params, client.get_parameters({}), strict=True):
        np.testing.assert_array_equal(before, after)  # the client's own model was not touched


def test_the_test_split_is_normalised_when_first_read_and_a_fit_never_reads_it():
    client = toy_client()
    client.normalisation = ((1.0, -1.0), (2.0, 4.0))  # per "channel" (feature) scaling, to see it applied
    client.use_data(client.data)
    client.fit(client.get_parameters({}), {"server-round": 1})
    assert client._test_x is None  # training never touched the test inputs
    expected = (torch.as_tensor(client.data.test_x) - torch.tensor([1.0, -1.0])) / torch.tensor([2.0, 4.0])
    torch.testing.assert_close(client.test_x, expected)
    assert client.test_x is client.test_x  # scaled once


def test_zero_adapt_steps_reports_the_global_model():
    client = toy_client(adapt_steps=0)
    _, _, metrics = client.evaluate(client.get_parameters({}), {})
    assert metrics["accuracy"] == metrics["global-accuracy"]


def test_fit_trains_reports_work_and_obeys_the_config_dict():
    client = toy_client()
    start = client.get_parameters({})
    params, n, metrics = client.fit(start, {"server-round": 2, "local-steps": 7, "batch-size": 16})
    assert n == 200 and metrics["local-steps"] == 7 and metrics["grad-evals"] == 7
    assert metrics["sample-grads"] == 7 * 16 and metrics["partition-id"] == 3
    assert any(not np.allclose(a, b) for a, b in zip(start, params, strict=True))
    again, _, _ = toy_client().fit(start, {"server-round": 2, "local-steps": 7, "batch-size": 16})
    for a, b in zip(params, again, strict=True):
        np.testing.assert_array_equal(a, b)  # same (seed, partition, round): same batches


def test_one_sgd_step_matches_a_hand_computation():
    client = toy_client(lr=0.1, local_steps=1, batch_size=200)  # one full-batch step
    weights = [np.array([[0.3, -0.2], [0.1, 0.4]], np.float32), np.array([0.05, -0.05], np.float32)]
    new, _, _ = client.fit(weights, {})
    x, y = blobs(200, 0)
    logits = x @ weights[0].T + weights[1]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(200), y] -= 1.0
    grad_w, grad_b = p.T @ x / 200, p.mean(0)
    np.testing.assert_allclose(new[0], weights[0] - 0.1 * grad_w, atol=1e-6)
    np.testing.assert_allclose(new[1], weights[1] - 0.1 * grad_b, atol=1e-6)


def test_set_parameters_refuses_a_wrong_count():
    client = toy_client()
    with pytest.raises(ValueError, match="expected 2 arrays, received 1"):
        client.set_parameters(client.get_parameters({})[:1])


def test_batches_cover_the_data_once_per_pass():
    batches = list(batch_indices(10, 4, 5, np.random.default_rng(0)))
    assert all(len(b) == 4 and len(set(b)) == 4 for b in batches)
    assert set(np.concatenate(batches[:2])) <= set(range(10)) and len(set(np.concatenate(batches[:2]))) == 8
    assert [len(b) for b in batch_indices(3, 40, 2, np.random.default_rng(0))] == [3, 3]


def test_steps_for_epochs_or_steps():
    assert steps_for(100, 40, 10, 0.0) == 10
    assert steps_for(100, 40, 10, 1.0) == 3
    assert steps_for(100, 40, 10, 0.5) == 2
    assert steps_for(5, 40, 10, 2.0) == 2


def test_models_have_the_papers_shapes():
    mlp = build_model("mlp", input_shape=(1, 28, 28), num_classes=10)
    assert parameter_count(mlp) == 784 * 80 + 80 + 80 * 60 + 60 + 60 * 10 + 10
    cnn = build_model("cnn", input_shape=(1, 28, 28), num_classes=62)
    assert cnn(torch.zeros(2, 1, 28, 28)).shape == (2, 62)
    conv = 32 * 25 + 32 + 64 * 32 * 25 + 64
    assert parameter_count(cnn) == conv + 64 * 7 * 7 * 512 + 512 + 512 * 62 + 62
    small = build_model("cnn-small", input_shape=(1, 28, 28), num_classes=62)
    conv = 8 * 25 + 8 + 16 * 8 * 25 + 16
    assert parameter_count(small) == conv + 16 * 7 * 7 * 64 + 64 + 64 * 62 + 62
    assert small(torch.zeros(2, 1, 28, 28)).shape == (2, 62)
    with pytest.raises(ValueError, match="needs square images"):
        build_model("cnn", input_shape=(60,), num_classes=10)
    with pytest.raises(ValueError, match="is not one of"):
        build_model("vit", input_shape=(60,), num_classes=10)
    a, b = (
        build_model("mlp", input_shape=(4,), num_classes=2, seed=1),
        build_model("mlp", input_shape=(4,), num_classes=2, seed=1),
    )
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
