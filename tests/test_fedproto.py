"""FedProto: the client's step and prototypes against an independent computation; the server's weighted mean; only
prototypes travel."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import settings
from helpers import (
    aggregate_fit,
    answers,
    blobs,
    configure_evaluate,
    configure_fit,
    fleet_of,
    replied_arrays,
    sent_arrays,
)
from torch.nn import functional as F

from app.config import ConfigError, check_model, parse_settings
from app.local.inprocess import InProcessRun
from clients.base import PERSONAL_LAYERS
from clients.fedproto import FedProtoClient
from clients.models import build_model, layout_of
from strategies.contracts.fedproto import prototype_shape
from strategies.contracts.models import ModelLayout
from strategies.methods.fedproto import global_prototypes


def test_the_server_averages_each_classes_prototypes_by_its_example_counts():
    prototypes = np.array([[[1.0, 0.0], [0.0, 0.0], [2.0, 2.0]],
                           [[3.0, 4.0], [0.0, 0.0], [0.0, 0.0]]])  # fmt: skip
    counts = np.array([[1.0, 0.0, 5.0], [3.0, 0.0, 0.0]])
    merged, total = global_prototypes(prototypes, counts)
    np.testing.assert_allclose(merged, [[(1 + 9) / 4, 12 / 4], [0, 0], [2, 2]], rtol=1e-6)
    np.testing.assert_array_equal(total, [4, 0, 5])


def test_two_steps_and_the_prototypes_sent_match_an_independent_computation():
    data, lr, lam = blobs(), 0.5, 3.0
    model = build_model("mlp", input_shape=(2,), num_classes=2, seed=0)
    client = FedProtoClient(model=model, data=data, partition_id=0,
                            settings=settings(strategy="fedproto", model="mlp", lr=lr, local_steps=2, batch_size=40,
                                              fedproto_lambda=lam, device="cpu"))  # fmt: skip
    kept = [v.detach().numpy() + 0.01 for v in model.state_dict().values()]  # the client's own model
    client.state.set_arrays(PERSONAL_LAYERS, kept)
    protos = np.random.default_rng(1).normal(size=(2, 60)).astype(np.float32)
    counts = np.array([7.0, 0.0], np.float32)  # class 1 has no global prototype yet
    arrays, _, metrics = client.fit([protos, counts], {"server-round": 3, "payload": "model:0 prototypes:1 "
                                                       "prototype-counts:1"})  # fmt: skip
    assert metrics["payload"] == "model:0 prototypes:1 prototype-counts:1" and len(arrays) == 2
    reference = build_model("mlp", input_shape=(2,), num_classes=2, seed=4)
    reference.load_state_dict(dict(zip(reference.state_dict(), map(torch.as_tensor, kept), strict=True)))
    x, y = torch.as_tensor(data.train_x), torch.as_tensor(data.train_y)
    target = torch.as_tensor(protos)[0]
    for _ in range(2):
        reference.zero_grad()
        z = reference.features(x)
        pulled = (z[y == 0] - target).pow(2).sum() / z.numel()  # class-1 rows add nothing, but count in the mean
        (F.cross_entropy(reference.classify(z), y) + lam * pulled).backward()
        with torch.no_grad():
            for p in reference.parameters():
                p -= lr * p.grad
    for got, want in zip(client.state.arrays(PERSONAL_LAYERS), reference.state_dict().values(), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)  # the model stays home, trained
    with torch.no_grad():
        z = reference.eval().features(x)
    for label in (0, 1):
        np.testing.assert_allclose(arrays[0][label], z[y == label].mean(0).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(arrays[1], [(data.train_y == 0).sum(), (data.train_y == 1).sum()])


def test_only_prototypes_travel_and_no_update_norm_is_recorded():
    run = InProcessRun(run_config={"strategy": "fedproto", "fraction-fit": 1.0, "min-available-clients": 4,
                                   "local-steps": 2, "eval-every": 2}, num_clients=4)  # fmt: skip
    strategy, fleet = run.strategy, fleet_of(run)
    for server_round in (1, 2):
        instructions = configure_fit(strategy, server_round, fleet)
        for ins in instructions:
            assert ins.config["payload"] == "model:0 prototypes:1 prototype-counts:1"
            assert [a.shape for a in sent_arrays(ins)] == [(10, 60), (10,)]
        results, failures = answers(fleet, instructions)
        assert failures == []
        replied = [replied_arrays(res) for res in results]
        aggregate_fit(strategy, server_round, results)
        merged, total = global_prototypes(np.stack([r[0] for r in replied]), np.stack([r[1] for r in replied]))
        np.testing.assert_allclose(strategy.prototypes, merged, rtol=1e-6)
        np.testing.assert_array_equal(strategy.counts, total)
        assert "update-norm-median" not in strategy.record
        assert strategy.record["fedproto-classes"] == int((total > 0).sum()) >= 2
    evaluation = configure_evaluate(strategy, 2, fleet)
    assert len(evaluation) == 4  # round 2 evaluates (eval-every 2): every client is checked
    for ins in evaluation:
        assert sent_arrays(ins) == [] and ins.config["adapt-steps"] == 0
    assert all(len(c.state.arrays(PERSONAL_LAYERS)) == 6 for c in run.clients)  # each keeps its whole MLP


def test_the_prototypes_shape_comes_from_the_models_head_and_server_model_keys_are_refused():
    assert prototype_shape(layout_of(build_model("fedavg-cnn", input_shape=(3, 32, 32), num_classes=10))) == (10, 512)
    with pytest.raises(ConfigError, match="needs a model whose head is a linear classifier"):
        prototype_shape(ModelLayout.of_names(["w", "b"]))
    with pytest.raises(ConfigError, match="'checkpoint-every'"):
        parse_settings({"strategy": "fedproto", "checkpoint-every": 2})
    check_model(parse_settings({"strategy": "fedproto", "model": "fedavg-cnn"}))
