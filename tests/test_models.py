"""The model registry: every model's card, builder and split; traits read by the checks; a model added at run time."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from conftest import REPO, FakeFleet, FakeNode, settings
from helpers import aggregate_fit, configure_fit, received, replied_arrays

from app.config import ConfigError, main, parse_settings
from app.local.simulation import LocalSimulation
from app.registry import METHODS
from clients.models import MODELS, Model, build_model, has_representation, head_names, layout_of, parameter_count
from clients.models.registry import register_model
from datasets import ClientData
from strategies.contracts.models import BATCH_NORM, GROUP_NORM, ModelCard
from strategies.contracts.payload import LAYOUT

SHAPES = {"image": (3, 32, 32), "flat": (1, 28, 28)}


def built(name: str, seed: int = 0) -> torch.nn.Module:
    card = MODELS[name].card
    shape = (10,) if card.task == "regression" else SHAPES[card.inputs]
    return build_model(name, input_shape=shape, num_classes=0 if card.task == "regression" else 10, seed=seed)


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, value in model.state_dict().items():
        h.update(name.encode())
        h.update(value.numpy().tobytes())
    return h.hexdigest()[:16]


def test_the_five_original_models_build_the_same_weights_as_before_the_registry():
    # digests of the seed-3 weights from the if-chain build_model at 38ae469 (the commit before the registry)
    before = {"mlp": ((1, 28, 28), 10, "2bb5c611e6c13d62"), "cnn": ((1, 28, 28), 62, "eb4f0bd4f6fa5bc5"),
              "cnn-small": ((1, 28, 28), 62, "40390c6569765d9a"), "logreg": ((1, 28, 28), 10, "0e640f1aed29d25a"),
              "linear": ((10,), 0, "b640014b828d9d20")}  # fmt: skip
    for name, (shape, classes, expected) in before.items():
        assert digest(build_model(name, input_shape=shape, num_classes=classes, seed=3)) == expected, name


def test_the_field_networks_have_their_published_sizes():
    assert parameter_count(build_model("fedavg-cnn", input_shape=(3, 32, 32), num_classes=10)) == (
        3 * 32 * 25 + 32 + 32 * 64 * 25 + 64 + 1600 * 512 + 512 + 512 * 10 + 10)  # PFLlib's FedAvgCNN, dim=1600
    assert parameter_count(build_model("fedavg-cnn", input_shape=(1, 28, 28), num_classes=10)) == (
        1 * 32 * 25 + 32 + 32 * 64 * 25 + 64 + 1024 * 512 + 512 + 512 * 10 + 10)  # dim=1024 on MNIST
    assert parameter_count(built("resnet18")) == 11_173_962  # the CIFAR ResNet-18 on 10 classes
    assert parameter_count(built("resnet18-gn")) == 11_173_962  # GroupNorm has BatchNorm's affine parameters
    with pytest.raises(ValueError, match="needs images"):
        build_model("fedavg-cnn", input_shape=(60,), num_classes=10)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_is_its_head_on_its_representation(name):
    model = built(name, seed=1).eval()
    card = MODELS[name].card
    x = torch.randn(4, *((10,) if card.task == "regression" else SHAPES[card.inputs]))
    with torch.no_grad():
        output, features = model(x, with_features=True)
        assert has_representation(model) and features.shape[0] == 4 and features.dim() == 2
        torch.testing.assert_close(model.classify(model.features(x)), model(x), rtol=0, atol=0)
        torch.testing.assert_close(output, model(x), rtol=0, atol=0)
    head = head_names(model)
    assert head and set(head) == {f"{model.head_prefix}.{n}" for n, _ in dict(model.named_modules())[
        model.head_prefix].state_dict().items()}  # fmt: skip
    # the head is what classify uses: its parameters take the gradient of classify(z) alone
    z = features.detach().requires_grad_(True)
    model.classify(z).sum().backward()
    moved = {n for n, p in model.named_parameters() if p.grad is not None}
    assert moved == {n for n in head if n in dict(model.named_parameters())}


def test_the_layout_names_the_norm_layers_the_counters_and_the_head():
    layout = layout_of(built("fedavg-cnn-bn"))
    assert layout.of_kind(BATCH_NORM) == tuple(f"layers.{i}.{a}" for i in (1, 5, 10) for a in (
        "weight", "bias", "running_mean", "running_var", "num_batches_tracked"))  # fmt: skip
    assert layout.non_float() == ("layers.1.num_batches_tracked", "layers.5.num_batches_tracked",
                                  "layers.10.num_batches_tracked")  # fmt: skip
    assert layout.head == ("layers.12.weight", "layers.12.bias")
    gn = layout_of(built("resnet18-gn"))
    assert not gn.of_kind(BATCH_NORM) and "bn1.weight" in gn.of_kind(GROUP_NORM) and not gn.non_float()


def test_the_model_key_takes_the_registered_models_and_suggests_a_near_one():
    with pytest.raises(ConfigError, match=r"'model': 'resnet-18' is not a registered model \(did you mean "
                                          r"'resnet18'"):  # fmt: skip
        parse_settings({"model": "resnet-18"})
    assert parse_settings({"model": "fedavg-cnn"}).model_card is MODELS["fedavg-cnn"].card
    with pytest.raises(ConfigError, match="'model': 'fedavg-cnn' needs images; dataset 'synthetic'"):
        parse_settings({"model": "fedavg-cnn", "dataset": "synthetic", "partitioner": "natural"})


@pytest.mark.parametrize("config, key", [
    ("model='resnet18' batch-size=1", "'batch-size': 1 is below 2"),
    ("model='fedavg-cnn-bn' adapt-batch-size=1", "'adapt-batch-size': 1 is below 2"),
    ("model='fedavg-cnn-bn' strategy='perfedavg' perfedavg-outer-batch-size=1", "'perfedavg-outer-batch-size'"),
    ("model='fedavg-cnn-bn' tune='fathom' strategy='fedavg' local-epochs=1.0", "'fathom-batch-min': 1 is below 2"),
])  # fmt: skip
def test_a_batchnorm_model_with_batches_of_one_is_refused_naming_the_key(config, key, capsys):
    assert main([config]) == 1
    assert key in capsys.readouterr().out
    assert main(["model='resnet18-gn' batch-size=1"]) == 0  # GroupNorm normalises each example alone


def test_the_preflight_refuses_a_client_whose_data_cuts_a_batchnorm_batch_to_one():
    run = settings(strategy="fedavg", model="fedavg-cnn-bn", device="cpu")
    x = np.zeros((1, 1, 28, 28), np.float32)
    one = ClientData(x, np.zeros(1, np.int64), x, np.zeros(1, np.int64), num_classes=10)
    client = METHODS["fedavg"].client(model=build_model("fedavg-cnn-bn", input_shape=(1, 28, 28), num_classes=10),
                                      data=one, settings=run, partition_id=0)  # fmt: skip
    properties = client.get_properties({})
    assert "batch-size 10: this client's batches would hold 1 example(s)" in properties["preflight-error"]


def test_fedavg_never_averages_batchnorms_step_counter_into_zero():
    run = settings(strategy="fedavg", model="fedavg-cnn-bn", device="cpu", fraction_fit=1.0, preflight=False,
                   local_steps=3, batch_size=4)  # fmt: skip
    model = build_model("fedavg-cnn-bn", input_shape=(1, 28, 28), num_classes=10)
    start = [v.numpy().copy() for v in model.state_dict().values()]
    strategy = METHODS["fedavg"].build(settings=run, initial_model=start, layout=layout_of(model))
    rng = np.random.default_rng(0)
    replies = []
    for partition in (0, 1):  # real clients' fit replies, 3 steps each
        x = rng.random((12, 1, 28, 28), dtype=np.float32)
        data = ClientData(x, rng.integers(0, 10, 12), x, rng.integers(0, 10, 12), num_classes=10)
        client = METHODS["fedavg"].client(model=build_model("fedavg-cnn-bn", input_shape=(1, 28, 28), num_classes=10),
                                          data=data, settings=run, partition_id=partition)  # fmt: skip
        arrays, examples, metrics = client.fit(start, {"server-round": 1, LAYOUT: f"model:{len(start)}"})
        replies.append(received(str(partition), arrays, examples, metrics))
    strategy.nodes.properties = {str(p): {"partition-id": p} for p in (0, 1)}
    configure_fit(strategy, 1, FakeFleet(*(FakeNode(str(p)) for p in (0, 1))))
    combined, _ = aggregate_fit(strategy, 1, replies)
    merged = dict(zip(layout_of(model).names, combined, strict=True))
    for layer in (1, 5, 10):
        counter = merged[f"layers.{layer}.num_batches_tracked"]
        assert counter.dtype == np.int64 and int(counter) == 3  # 3 batches on each client; averaging gave 0
    sent = [replied_arrays(r) for r in replies]
    names = layout_of(model).names
    mean = (sent[0][names.index("layers.1.running_mean")] + sent[1][names.index("layers.1.running_mean")]) / 2
    np.testing.assert_allclose(merged["layers.1.running_mean"], mean, rtol=1e-6)  # the float buffers are averaged


def test_a_model_registered_at_run_time_is_checked_and_built_like_the_others():
    card = ModelCard(name="toy-gn", summary="a test's network", inputs="image", smooth=False, norm="group")
    model = Model(card, lambda shape, classes: MODELS["resnet18-gn"].build(shape, classes))
    register_model(model)
    try:
        with pytest.raises(ValueError, match="registered already"):
            register_model(model)
        assert parse_settings({"model": "toy-gn", "batch-size": 1}).model_card is card
        assert parameter_count(build_model("toy-gn", input_shape=(3, 32, 32), num_classes=10)) == 11_173_962
    finally:
        del MODELS["toy-gn"]


@pytest.mark.e2e
def test_a_throwaway_model_file_runs_a_two_round_simulation(tmp_path):
    # tests/model_app: stamen's apps, and one file that defines a model and registers it (tiny/model.py)
    with LocalSimulation(app_dir=REPO / "tests" / "model_app", pythonpath=[REPO, REPO / "tests" / "model_app"]) as sim:
        outcome = sim.run(run_config={"results-dir": str(tmp_path), "run-name": "tiny"}, num_supernodes=4,
                          timeout_s=300)  # fmt: skip
    assert outcome.ok, outcome.log_tail
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text())
    assert summary["settings"]["model"] == "tiny-net" and summary["rounds"] == 2
    assert summary["final"]["accuracy"] > 0


@pytest.mark.parametrize("name", [n for n in METHODS if n != "diffusion"])  # diffusion's example is least squares
def test_every_method_runs_two_in_process_rounds_on_the_batchnorm_cnn(name):
    # BatchNorm's buffers and int64 counters through every method's messages, maths and state (no NaN, no reject)
    from app.local.inprocess import InProcessRun

    config = {**METHODS[name].contract.example, "model": "fedavg-cnn-bn", "fraction-fit": 1.0, "local-steps": 2,
              "batch-size": 4, "adapt-batch-size": 4, "min-available-clients": 4, "perfedavg-outer-batch-size": 4,
              "perfedavg-hessian-batch-size": 4, "eval-every": 1}  # fmt: skip
    if name == "fathom":
        config.update({"local-epochs": 0.1, "fathom-batch-min": 2.0})
    run = InProcessRun(run_config=config, num_clients=4)
    strategy = run.strategy
    for _ in (1, 2):
        run.step()  # the round's fit, through Flower's messages (wire-encoded both ways)
        assert strategy.record["clients-succeeded"] == 4 and strategy.record["clients-rejected"] == 0
        run.evaluate()
        assert strategy.record["eval-clients"] == 4 and 0 <= strategy.record["accuracy"] <= 1
    assert all(np.all(np.isfinite(a)) for a in strategy.global_model)
