"""Shared and personal arrays: a rule over the model's names, only the shared ones travel, the rest stay at home.

A toy method keeps the MLP's last ``toyp-personal-layers`` layers on its clients.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import torch
from conftest import FakeFleet, FakeNode
from helpers import (
    MLP_NAMES,
    TOYP,
    ToyPersonal,
    ToyPersonalSettings,
    aggregate_fit,
    configure_fit,
    mlp,
    received,
    replied_arrays,
    sent_arrays,
    start_run,
    toy_client,
    toy_settings,
)

from app.config import check_model, parse_settings
from app.registry import CONTRACTS
from clients.base import PERSONAL_LAYERS
from clients.models import build_model
from clients.training import train_steps
from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.keys import ConfigError
from strategies.contracts.models import ModelLayout
from strategies.contracts.personal import LastLayers, layers_of


def test_the_rule_picks_the_last_layers_by_name_and_keeps_one_shared():
    assert list(layers_of(MLP_NAMES)) == ["layers.1", "layers.3", "layers.5"]
    rule = LastLayers("toyp-personal-layers")
    layout = ModelLayout.of_names(MLP_NAMES)
    assert rule.select({"toyp-personal-layers": 1}, layout) == ("layers.5.weight", "layers.5.bias")
    assert rule.select({"toyp-personal-layers": 2}, layout) == tuple(MLP_NAMES[2:])
    with pytest.raises(ConfigError, match=r"'toyp-personal-layers': 3 is outside \[1, 2\] for this model, whose "
                                          r"layers are \['layers.1', 'layers.3', 'layers.5'\]"):  # fmt: skip
        rule.select({"toyp-personal-layers": 3}, layout)
    assert list(mlp().state_dict()) == MLP_NAMES


def test_the_settings_are_checked_against_the_model_before_any_folder_exists():
    contracts = {**CONTRACTS, "toyp": TOYP}
    ok = parse_settings({"strategy": "toyp", "toyp-personal-layers": 2}, contracts)
    check_model(ok, contracts)
    too_many = parse_settings({"strategy": "toyp", "toyp-personal-layers": 3}, contracts)
    with pytest.raises(ConfigError, match="'toyp-personal-layers': 3 is outside"):
        check_model(too_many, contracts)
    with pytest.raises(ConfigError, match="'central-eval': toyp keeps the model's last 1 layer"):
        parse_settings({"strategy": "toyp", "central-eval": True}, contracts)


def test_a_method_may_check_its_keys_against_the_models_shapes():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Wide(MethodSettings):
        prefix: ClassVar[str] = "wide"

        def check_model(self, shapes):
            if shapes["layers.1.weight"][0] < 100:
                raise ConfigError(f"run config key 'model': wide needs 100 hidden units, has {shapes}")

    contracts = {**CONTRACTS, "wide": Contract(name="wide", summary="", settings=Wide, uses=())}
    with pytest.raises(ConfigError, match="wide needs 100 hidden units"):
        check_model(parse_settings({"strategy": "wide"}, contracts), contracts)


def test_the_server_sends_and_averages_the_shared_arrays_and_keeps_the_rest():
    start = [v.detach().numpy() for v in mlp().state_dict().values()]
    with pytest.raises(TypeError, match="needs the model's layout to find them"):
        ToyPersonal(settings=toy_settings(), initial_model=start)
    strategy = ToyPersonal(settings=toy_settings(), initial_model=start, layout=MLP_NAMES)
    fleet = FakeFleet(*(FakeNode(str(i)) for i in range(2)))
    start_run(strategy, fleet)
    fits = configure_fit(strategy, 1, fleet)
    results = []
    for ins in fits:
        sent = sent_arrays(ins)
        assert ins.config["payload"] == "model:4" and [a.shape for a in sent] == [a.shape for a in start[:4]]
        arrays, n, metrics = toy_client(partition=fleet.nodes[ins.node].partition).fit(sent, dict(ins.config))
        assert metrics["payload"] == "model:4" and len(arrays) == 4  # the head never leaves the client
        results.append(received(ins.node, arrays, n, metrics))
    replied = [replied_arrays(res) for res in results]
    aggregate_fit(strategy, 1, results)
    for i in range(4):
        np.testing.assert_allclose(strategy.global_model[i], (replied[0][i] + replied[1][i]) / 2, rtol=1e-6)
    for i in (4, 5):  # the server's head is the initial one: nobody sent another
        np.testing.assert_array_equal(strategy.global_model[i], start[i])
    assert len(strategy.checkpoint(1).arrays) == 6


def test_the_client_keeps_its_head_across_messages_and_tests_it_with_the_body_it_receives():
    client = toy_client()
    initial = client.get_parameters({})
    body = initial[:4]
    reply, _, _ = client.fit(body, {"server-round": 1, "payload": "model:4"})
    head = client.state.arrays(PERSONAL_LAYERS)
    assert len(reply) == 4 and len(head) == 2
    assert not np.allclose(head[0], initial[4])  # trained, and kept
    # the next message, in a fresh client object with the same Context.state: the kept head, the new body
    later = toy_client(state=client.state)
    new_body = [a + 0.01 for a in body]
    later.receive(new_body, {"payload": "model:4"}, "evaluate")
    merged = later.get_parameters({})
    for got, want in zip(merged, [*new_body, *head], strict=True):
        np.testing.assert_array_equal(got, want)
    loss, n, metrics = toy_client(state=client.state).evaluate(new_body, {"server-round": 2, "payload": "model:4"})
    assert "global-accuracy" not in metrics and "global-loss" not in metrics and 0 <= metrics["accuracy"] <= 1


def test_training_a_named_subset_moves_it_alone_by_the_gradient_of_the_loss():
    model = build_model("logreg", input_shape=(2,), num_classes=2, seed=0)
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    y = torch.tensor([0, 1])
    weight, bias = (p.detach().clone() for p in model.parameters())
    logits = x @ weight.T + bias
    # d/dW of the mean cross-entropy: (softmax - onehot)^T x / n
    grad = (torch.softmax(logits, dim=1) - torch.nn.functional.one_hot(y, 2).float()).T @ x / 2
    report = train_steps(model, [(x, y)], 0.3, trainable=["layers.1.weight"])
    assert report.steps == 1
    torch.testing.assert_close(model.layers[1].weight.detach(), weight - 0.3 * grad)
    torch.testing.assert_close(model.layers[1].bias.detach(), bias, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"trainable names \['head'\]"):
        train_steps(model, [(x, y)], 0.3, trainable=["head"])


def test_a_contract_whose_model_never_travels_refuses_what_needs_a_server_model():
    from strategies.contracts.personal import WholeModel

    nomodel = Contract(name="toyp", summary="keeps the whole model", settings=ToyPersonalSettings,
                       uses=("lr", "local-steps", "batch-size"), personal=WholeModel())  # fmt: skip
    contracts = {**CONTRACTS, "toyp": nomodel}
    assert nomodel.personal_arrays(ToyPersonalSettings(), MLP_NAMES) == tuple(MLP_NAMES)
    parse_settings({"strategy": "toyp"}, contracts)
    parse_settings({"strategy": "toyp", "max-update-ratio": 3.0}, contracts)  # it screens the sets that travel
    for key_, value in (("checkpoint-every", 5), ("resume-from", "/x"), ("central-eval", True)):
        with pytest.raises(ConfigError, match=f"'{key_}'"):
            parse_settings({"strategy": "toyp", key_: value}, contracts)
