"""``split_at``: an app's plain ``nn.Module`` split into features and a head by naming the head.

The representation must be the head's input, computed independently here by running the
network's layers by hand; MOON and FedProto then run on such a network in the server
``flwr run`` builds for an app's own model and data (their Flower run from the example
app is tests/test_own_app.py's).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F  # noqa: N812

from app.client_app import AppData
from app.config import ConfigError, check_on_server
from app.local.inprocess import served_run
from app.own_parts import OwnParts
from app.server_run import run_method
from clients.models import SplitModel, card_of, head_names, layout_of, split_at


class Net(nn.Module):
    """Flower's quickstart CNN, shrunk to 1x12x12 inputs and 3 classes: its own forward, no stamen base class."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(4 * 5 * 5, 16)
        self.fc3 = nn.Linear(16, 3)
        self.scale = 1.0  # a plain attribute its forward reads: it must survive the split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x))).flatten(1)
        return self.fc3(F.relu(self.fc1(x)) * self.scale)


class LogSoftmaxNet(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(super().forward(x), dim=1)  # the head's output changed after it


class TwiceNet(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.relu(self.fc1(self.pool(F.relu(self.conv1(x))).flatten(1)))
        return self.fc3(z) + 0 * self.fc3(z)


def head_input_by_hand(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.relu(net.fc1(net.pool(F.relu(net.conv1(x))).flatten(1))) * net.scale


def test_the_split_network_is_the_same_network_and_its_representation_is_the_heads_input():
    torch.manual_seed(0)
    plain = Net()
    names, before = list(plain.state_dict()), {k: v.clone() for k, v in plain.state_dict().items()}
    x = torch.randn(5, 1, 12, 12)
    expected_out = plain(x)
    net = split_at(plain, head="fc3")
    assert net is plain and isinstance(net, SplitModel) and isinstance(net, Net) and type(net).__name__ == "Net"
    assert list(net.state_dict()) == names and all(torch.equal(net.state_dict()[k], before[k]) for k in names)
    net.scale = 0.5  # its own attributes still drive its own forward
    out, z = net(x, with_features=True)
    torch.testing.assert_close(z, head_input_by_hand(net, x))
    torch.testing.assert_close(net.features(x), z)
    torch.testing.assert_close(net.classify(z), out)
    net.scale = 1.0
    torch.testing.assert_close(net(x), expected_out)
    assert head_names(net) == ("fc3.weight", "fc3.bias")
    assert layout_of(net).head == ("fc3.weight", "fc3.bias")
    assert not card_of(net, name="Net").smooth  # F.relu in forward: torch.fx still traces the network's own forward


def test_the_split_survives_a_copy_and_a_functional_call_at_other_parameters():
    torch.manual_seed(1)
    net = split_at(Net(), head="fc3")
    twin = copy.deepcopy(net)
    assert isinstance(twin, SplitModel) and twin.head_prefix == "fc3" and twin.fc3 is not net.fc3
    x = torch.randn(3, 1, 12, 12)
    moved = {k: v + 0.1 for k, v in net.state_dict().items()}
    out, z = functional_call(net, moved, (x,), {"with_features": True})  # as clients.training calls it
    twin.load_state_dict(moved)
    torch.testing.assert_close(z, head_input_by_hand(twin, x))
    torch.testing.assert_close(out, twin(x))


def test_a_head_that_is_not_the_last_layer_applied_once_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"no submodule 'fc2'; its layers: \['conv1', 'pool', 'fc1', 'fc3'\]"):
        split_at(Net(), head="fc2")
    with pytest.raises(ValueError, match="Net.pool has no arrays"):
        split_at(Net(), head="pool")
    with pytest.raises(ValueError, match="split already"):
        split_at(split_at(Net(), head="fc3"), head="fc3")
    x = torch.randn(2, 1, 12, 12)
    with pytest.raises(RuntimeError, match="called 1 times, and its output was changed after"):
        split_at(LogSoftmaxNet(), head="fc3")(x, with_features=True)
    with pytest.raises(RuntimeError, match="called 2 times"):
        split_at(TwiceNet(), head="fc3")(x, with_features=True)


def blobs(partition_id: int, num_partitions: int, run_config: dict) -> tuple:
    """Three classes of 1x12x12 images, each a bright quarter of its own, different per partition."""
    generator = torch.Generator().manual_seed(partition_id)
    y = torch.arange(36) % 3
    x = 0.3 * torch.randn(36, 1, 12, 12, generator=generator)
    for label in range(3):
        x[y == label, 0, 6 * (label // 2):6 * (label // 2) + 6, 6 * (label % 2):6 * (label % 2) + 6] += 1.5
    return (x[:24], y[:24]), (x[24:], y[24:])


def run_on_the_plain_network(tmp_path, strategy: str, **change: object) -> tuple[dict, list[dict]]:
    """Three in-process rounds of the server ``flwr run`` gets for an app whose model is ``split_at(Net(), ...)``."""
    parts = OwnParts(model=lambda config: split_at(Net(), head="fc3"), data_name="blobs")
    name = "-".join([strategy, *map(str, change.values())])
    config = {"strategy": strategy, "num-server-rounds": 3, "fraction-fit": 1.0, "eval-every": 3, "lr": 0.05,
              "local-steps": 8, "results-dir": str(tmp_path), "run-name": name, **change}  # fmt: skip
    strategy, grid = served_run(config, num_clients=3, parts=parts,
                                app_data=AppData(data=blobs, keys=None, size=4))  # fmt: skip
    strategy.start(grid=grid)
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    return summary, [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("strategy", ["moon", "fedproto"])
def test_moon_and_fedproto_run_on_a_plain_network_named_at_its_head(tmp_path, strategy):
    plain = OwnParts(model=lambda config: Net(), data_name="blobs")
    settings, network = plain.settings({"strategy": strategy}, own_data=True)
    with pytest.raises(ConfigError, match=r"not split into features and a head; name its head: split_at"):
        check_on_server(settings, layout=layout_of(network))
    summary, records = run_on_the_plain_network(tmp_path, strategy)
    assert summary["status"] == "completed" and summary["settings"]["model"] == "Net"
    assert [r["clients-succeeded"] for r in records] == [3, 3, 3]
    assert records[-1]["eval-clients"] == 3 and records[-1]["accuracy"] > 0.6  # chance is 1/3
    if strategy == "moon":  # its contrastive term, on the representation the hook read, changed the training
        _, without = run_on_the_plain_network(tmp_path, strategy, **{"moon-mu": 0.0})
        assert [r["train-loss"] for r in records[1:]] != pytest.approx([r["train-loss"] for r in without[1:]])


def test_perfedavg_advice_names_the_plain_networks_relu(tmp_path):
    # the warning Per-FedAvg logs before round 1 (the example app's run logged it when it ran Per-FedAvg)
    parts = OwnParts(model=lambda config: split_at(Net(), head="fc3"), data_name="blobs")
    method, _, _ = run_method({"strategy": "perfedavg", "results-dir": str(tmp_path), "run-name": "advice"},
                              parts)  # fmt: skip
    assert method.hf_on_relu().startswith("perfedavg-variant 'hf' on model 'Net' (ReLU)")
