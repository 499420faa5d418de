"""MOON: two local steps against an independent computation of its loss; its previous model is kept across rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import settings
from helpers import blobs
from torch.nn import functional as F

from clients.fedavg import FedAvgClient
from clients.models import build_model
from clients.moon import PREVIOUS, MoonClient, model_contrastive_loss


def test_the_contrastive_loss_is_log_two_when_both_references_agree_and_follows_the_cosines():
    z, other = torch.randn(5, 3), torch.randn(5, 3)
    assert float(model_contrastive_loss(z, other, other, 0.5)) == pytest.approx(math.log(2), rel=1e-6)
    # z equal to z_glob and orthogonal to z_prev: -log(e^2 / (e^2 + e^0)) at tau 0.5
    e1, e2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    assert float(model_contrastive_loss(e1, e1, e2, 0.5)) == pytest.approx(-math.log(math.e**2 / (math.e**2 + 1)))


def moon_loss(model, glob, prev, x, y, mu, tau):
    """CE + mu * l_con written out with the three networks' own features(), cosines by hand."""

    def cos(a, b):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))

    z = model.features(x)
    with torch.no_grad():
        z_glob, z_prev = glob.features(x), prev.features(x)
    positive, negative = torch.exp(cos(z, z_glob) / tau), torch.exp(cos(z, z_prev) / tau)
    return F.cross_entropy(model.classify(z), y) + mu * (-torch.log(positive / (positive + negative))).mean()


def test_two_steps_match_sgd_on_the_written_out_moon_loss():
    data, lr, mu, tau = blobs(), 0.5, 2.0, 0.5
    model = build_model("mlp", input_shape=(2,), num_classes=2, seed=0)
    client = MoonClient(model=model, data=data, partition_id=0,
                        settings=settings(strategy="moon", model="mlp", lr=lr, local_steps=2, batch_size=40,
                                          moon_mu=mu, moon_temperature=tau, device="cpu"))  # fmt: skip
    received = [v.detach().numpy() - 0.05 for v in model.state_dict().values()]
    previous = [v.detach().numpy() + 0.2 for v in model.parameters()]  # the client's model after its last round
    client.state.set_arrays(PREVIOUS, previous)
    reply, _, metrics = client.fit(received, {"server-round": 2, "payload": "model:6"})

    def net(values):
        out = build_model("mlp", input_shape=(2,), num_classes=2, seed=9)
        out.load_state_dict(dict(zip(out.state_dict(), map(torch.as_tensor, values), strict=True)))
        return out

    glob, prev, trained = net(received), net(previous), net(received)
    x, y = torch.as_tensor(data.train_x), torch.as_tensor(data.train_y)
    first = None
    for _ in range(2):
        trained.zero_grad()
        loss = moon_loss(trained, glob, prev, x, y, mu, tau)
        first = F.cross_entropy(trained(x), y).item() if first is None else first
        loss.backward()
        with torch.no_grad():
            for p in trained.parameters():
                p -= lr * p.grad
    for got, want in zip(reply, trained.state_dict().values(), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    for got, want in zip(client.state.arrays(PREVIOUS), trained.parameters(), strict=True):  # kept for next round
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert metrics["start-loss"] == pytest.approx(first, rel=1e-5)  # the reported loss is the cross-entropy alone


def test_in_the_first_round_the_term_has_no_gradient_and_the_step_is_fedavgs():
    data, lr = blobs(), 0.5
    run = settings(strategy="moon", model="mlp", lr=lr, local_steps=1, batch_size=40, moon_mu=5.0, device="cpu")
    fedavg = settings(strategy="fedavg", model="mlp", lr=lr, local_steps=1, batch_size=40, device="cpu")
    initial = build_model("mlp", input_shape=(2,), num_classes=2).state_dict()
    start = [v.detach().numpy().copy() for v in initial.values()]
    moon = MoonClient(model=build_model("mlp", input_shape=(2,), num_classes=2), data=data, settings=run,
                      partition_id=0).fit(start, {"server-round": 1, "payload": "model:6"})[0]  # fmt: skip
    plain = FedAvgClient(model=build_model("mlp", input_shape=(2,), num_classes=2), data=data, settings=fedavg,
                         partition_id=0).fit(start, {"server-round": 1, "payload": "model:6"})[0]  # fmt: skip
    for a, b in zip(moon, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
