"""FedBN: two local steps against an independent torch computation; every BatchNorm array stays on its client."""

from __future__ import annotations

import numpy as np
import torch
from conftest import settings
from helpers import aggregate_fit, answers, configure_fit, fleet_of, replied_arrays
from torch.nn import functional as F

from app.local.inprocess import InProcessRun
from clients.base import PERSONAL_LAYERS
from clients.fedbn import FedBNClient
from clients.models import build_model, layout_of
from datasets import ClientData
from strategies.contracts.models import BATCH_NORM
from strategies.contracts.payload import from_bytes

MODEL = "fedavg-cnn-bn"




def images(n=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, n)
    return ClientData(x, y, x[:4], y[:4], num_classes=10)


def test_two_steps_from_the_received_weights_and_the_kept_batchnorm_match_plain_torch():
    data, lr = images(), 0.1
    model = build_model(MODEL, input_shape=(1, 28, 28), num_classes=10, seed=0)
    layout = layout_of(model)
    norm = layout.of_kind(BATCH_NORM)
    shared = [n for n in layout.names if n not in norm]
    client = FedBNClient(model=model, data=data, partition_id=0,
                         settings=settings(strategy="fedbn", model=MODEL, lr=lr, local_steps=2, batch_size=8,
                                           device="cpu"))  # fmt: skip
    assert client.personal_names == list(norm) and client.shared_names == shared
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # the BatchNorm layers of the client's own, from earlier rounds: moved weights, statistics and counters
    kept = {k: (v + 7 if v.dtype == torch.int64 else v * 1.5 + 0.1) for k, v in start.items() if k in norm}
    client.state.set_arrays(PERSONAL_LAYERS, [kept[k].numpy() for k in norm])
    received = {k: start[k] - 0.01 for k in shared}  # the server's weights
    reply, _, metrics = client.fit([received[k].numpy() for k in shared],
                                   {"server-round": 1, "payload": f"model:{len(shared)}"})  # fmt: skip
    # the independent computation: the same network, loaded, two full-batch steps with backward()
    reference = build_model(MODEL, input_shape=(1, 28, 28), num_classes=10, seed=5).train()
    reference.load_state_dict({**received, **kept})
    x, y = torch.as_tensor(data.train_x), torch.as_tensor(data.train_y)
    for _ in range(2):
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        with torch.no_grad():
            for p in reference.parameters():
                p -= lr * p.grad
    expected = reference.state_dict()
    assert len(reply) == len(shared) and metrics["local-steps"] == 2
    for name, got in zip(shared, reply, strict=True):
        np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-4, atol=1e-6)
    for name, got in zip(norm, client.state.arrays(PERSONAL_LAYERS), strict=True):
        np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-4, atol=1e-6)
    assert int(client.state.arrays(PERSONAL_LAYERS)[norm.index("layers.1.num_batches_tracked")]) == 7 + 2


def test_no_batchnorm_array_travels_and_the_server_averages_the_rest():
    run = InProcessRun(run_config={"strategy": "fedbn", "model": MODEL, "fraction-fit": 1.0, "local-steps": 2,
                                   "min-available-clients": 4}, num_clients=4)  # fmt: skip
    strategy, fleet = run.strategy, fleet_of(run)
    layout = strategy.layout
    norm = set(layout.of_kind(BATCH_NORM))
    shared_shapes = [s for n, s in zip(layout.names, layout.shapes, strict=True) if n not in norm]
    initial_norm = {n: a.copy() for n, a in zip(layout.names, strategy.global_model, strict=True) if n in norm}
    for server_round in (1, 2):
        instructions = configure_fit(strategy, server_round, fleet)
        results, failures = answers(fleet, instructions)
        assert failures == []
        for message in [*instructions, *results]:  # what was sent either way: the shared arrays alone
            assert [from_bytes(t).shape for t in message.tensors] == shared_shapes
        replies = [replied_arrays(res) for res in results]
        aggregate_fit(strategy, server_round, results)
        mean = [np.mean([r[i] for r in replies], axis=0) for i in range(len(shared_shapes))]
        for got, want in zip(strategy.global_shared, mean, strict=True):  # uniform aggregation: the plain mean
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    for name, array in zip(layout.names, strategy.global_model, strict=True):
        if name in norm:
            np.testing.assert_array_equal(array, initial_norm[name])
    kept = [client.state.arrays(PERSONAL_LAYERS) for client in run.clients]
    assert all(len(k) == len(norm) for k in kept)
    assert not np.array_equal(kept[0][2], kept[1][2])  # each client's own running mean
