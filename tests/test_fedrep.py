"""FedRep: a head step then a body step against an independent computation; the head never leaves the client."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import settings
from helpers import (
    BODY,
    HEAD,
    aggregate_fit,
    answers,
    blobs,
    configure_evaluate,
    configure_fit,
    fleet_of,
    sent_arrays,
    sgd_on,
)

from app.config import ConfigError, check_model, main, parse_settings
from app.local.inprocess import InProcessRun, build_clients
from clients.base import PERSONAL_LAYERS
from clients.fedrep import FedRepClient
from clients.models import build_model
from strategies.contracts.payload import from_bytes


def test_a_head_step_then_a_body_step_match_an_independent_computation():
    data, lr = blobs(), 0.3
    model = build_model("mlp", input_shape=(2,), num_classes=2, seed=0)
    client = FedRepClient(model=model, data=data, partition_id=0,
                          settings=settings(strategy="fedrep", model="mlp", lr=lr, local_steps=1, batch_size=40,
                                            fedrep_head_steps=1, device="cpu"))  # fmt: skip
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    body = [start[k].numpy() for k in BODY]
    reply, _, metrics = client.fit(body, {"server-round": 1, "payload": "model:4"})
    x, y = torch.as_tensor(data.train_x), torch.as_tensor(data.train_y)
    expected = sgd_on(sgd_on(start, HEAD, x, y, lr), BODY, x, y, lr)  # the head first, then the body at the new head
    assert metrics["payload"] == "model:4" and len(reply) == 4
    for name, got in zip(BODY, reply, strict=True):
        np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-5, atol=1e-6)
    for name, got in zip(HEAD, client.state.arrays(PERSONAL_LAYERS), strict=True):
        np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-5, atol=1e-6)
    assert metrics["local-steps"] == 2 and metrics["grad-evals"] == 2 and metrics["fedrep-head-loss"] > 0


def test_head_epochs_are_passes_over_the_data_on_the_head():
    data, lr = blobs(), 0.3
    model = build_model("mlp", input_shape=(2,), num_classes=2, seed=0)
    client = FedRepClient(model=model, data=data, partition_id=0,
                          settings=settings(strategy="fedrep", model="mlp", lr=lr, local_steps=1, batch_size=40,
                                            fedrep_head_steps=9, fedrep_head_epochs=2.0, device="cpu"))  # fmt: skip
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _, _, metrics = client.fit([start[k].numpy() for k in BODY], {"server-round": 1, "payload": "model:4"})
    x, y = torch.as_tensor(data.train_x), torch.as_tensor(data.train_y)
    expected = sgd_on(sgd_on(start, HEAD, x, y, lr), HEAD, x, y, lr)  # a batch of 40 is the whole set
    for name, got in zip(HEAD, client.state.arrays(PERSONAL_LAYERS), strict=True):
        np.testing.assert_allclose(got, expected[name].numpy(), rtol=1e-5, atol=1e-6)
    assert metrics["local-steps"] == 2 + 1


def test_the_head_never_leaves_the_client_and_survives_across_rounds():
    run = InProcessRun(run_config={"strategy": "fedrep", "fraction-fit": 1.0, "min-available-clients": 4,
                                   "fedrep-head-steps": 3, "local-steps": 3}, num_clients=4)  # fmt: skip
    strategy, clients, fleet = run.strategy, run.clients, fleet_of(run)
    initial_head = [a.copy() for a in strategy.global_model[4:]]
    body_shapes = [a.shape for a in strategy.global_model[:4]]
    body_bytes = sum(a.nbytes for a in strategy.global_model[:4])
    heads, sent = [], []
    for server_round in (1, 2):
        instructions = configure_fit(strategy, server_round, fleet)
        results, failures = answers(fleet, instructions)
        assert failures == []
        for message in [*instructions, *results]:  # what the server sent, and what each client sent back
            assert [from_bytes(t).shape for t in message.tensors] == body_shapes
        aggregate_fit(strategy, server_round, results)
        assert strategy.record["fit-bytes-received"] == pytest.approx(4 * body_bytes, rel=0.01)  # + npy headers
        heads.append([[a.copy() for a in c.state.arrays(PERSONAL_LAYERS)] for c in clients])
        sent.append({fleet.nodes[ins.node]: ins for ins in instructions})
    for got, want in zip(strategy.global_model[4:], initial_head, strict=True):
        np.testing.assert_array_equal(got, want)  # the server never saw a head
    # partition 0's round 2, replayed by fresh clients: from its round-1 head it gives the head it kept; from none, not
    node = next(n for n in sent[1] if n.client.partition_id == 0)
    replays = {}
    for kept in (heads[0][0], None):
        replay = build_clients(run.settings, 4)[0]
        if kept is not None:
            replay.state.set_arrays(PERSONAL_LAYERS, kept)
        replay.fit(sent_arrays(sent[1][node]), dict(sent[1][node].config))
        replays[kept is None] = replay.state.arrays(PERSONAL_LAYERS)
    assert not np.array_equal(heads[0][0][0], initial_head[0])
    for got, want in zip(replays[False], heads[1][0], strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(replays[True][0], heads[1][0][0])
    evaluations = configure_evaluate(strategy, 10, fleet)
    assert all(ins.config["adapt-steps"] == 0 for ins in evaluations)
    ins, *_ = evaluations
    _, _, metrics = fleet.nodes[ins.node].evaluate(sent_arrays(ins), dict(ins.config))
    assert 0 <= metrics["accuracy"] <= 1 and "global-accuracy" not in metrics


def test_the_head_is_checked_against_the_model_before_any_folder_exists(capsys):
    assert main(["strategy='fedrep' fedrep-personal-layers=3"]) == 1
    printed = capsys.readouterr().out
    assert "error: run config key 'fedrep-personal-layers': 3 is outside [1, 2] for this model" in printed
    check_model(parse_settings({"strategy": "fedrep", "fedrep-personal-layers": 3, "model": "cnn-small"}))
    with pytest.raises(ConfigError, match="'central-eval': fedrep keeps the model's last 1 layer"):
        parse_settings({"strategy": "fedrep", "central-eval": True})
