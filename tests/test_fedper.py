"""FedPer: a joint step of body and kept head against an independent computation; only the body travels."""

from __future__ import annotations

import numpy as np
import torch
from conftest import settings
from helpers import BODY, HEAD, aggregate_fit, answers, blobs, configure_fit, fleet_of, sgd_on

from app.local.inprocess import InProcessRun
from clients.base import PERSONAL_LAYERS
from clients.fedper import FedPerClient
from clients.models import build_model
from strategies.contracts.payload import from_bytes


def test_two_joint_steps_from_the_received_body_and_the_kept_head_match_an_independent_computation():
    data, lr = blobs(), 0.3
    model = build_model("mlp", input_shape=(2,), num_classes=2, seed=0)
    client = FedPerClient(model=model, data=data, partition_id=0,
                          settings=settings(strategy="fedper", model="mlp", lr=lr, local_steps=2, batch_size=40,
                                            device="cpu"))  # fmt: skip
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    kept = [start[k] + 0.1 for k in HEAD]  # a head of the client's own, from an earlier round
    client.state.set_arrays(PERSONAL_LAYERS, [h.numpy() for h in kept])
    received = {k: start[k] - 0.05 for k in BODY}  # the server's body
    reply, _, metrics = client.fit([received[k].numpy() for k in BODY], {"server-round": 1, "payload": "model:4"})
    x, y = torch.as_tensor(data.train_x), torch.as_tensor(data.train_y)
    expected = {**received, **dict(zip(HEAD, kept, strict=True))}
    for _ in range(2):
        expected = sgd_on(expected, BODY + HEAD, x, y, lr)
    assert len(reply) == 4 and metrics["payload"] == "model:4" and metrics["local-steps"] == 2
    for name, got in zip(BODY, reply, strict=True):
        np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-5, atol=1e-6)
    for name, got in zip(HEAD, client.state.arrays(PERSONAL_LAYERS), strict=True):
        np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-5, atol=1e-6)


def test_only_the_body_travels_and_the_servers_head_never_moves():
    run = InProcessRun(run_config={"strategy": "fedper", "fraction-fit": 1.0, "min-available-clients": 4},
                       num_clients=4)  # fmt: skip
    strategy, fleet = run.strategy, fleet_of(run)
    initial_head = [a.copy() for a in strategy.global_model[4:]]
    body_shapes = [a.shape for a in strategy.global_model[:4]]
    for server_round in (1, 2):
        instructions = configure_fit(strategy, server_round, fleet)
        results, failures = answers(fleet, instructions)
        assert failures == []
        for message in [*instructions, *results]:
            assert [from_bytes(t).shape for t in message.tensors] == body_shapes
        aggregate_fit(strategy, server_round, results)
    for got, want in zip(strategy.global_model[4:], initial_head, strict=True):
        np.testing.assert_array_equal(got, want)
    for client in run.clients:  # every client trained and kept a head of its own
        assert not np.array_equal(client.state.arrays(PERSONAL_LAYERS)[0], initial_head[0])
