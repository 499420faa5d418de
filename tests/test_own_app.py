"""stamen inside an outside Flower app: the public surface, the entry points, the app's own model, data and keys.

The end-to-end test runs ``examples/own-app`` from a copy outside the clone, importing the
installed ``stamen`` (CI installs it with the test extras); the rest runs in-process.
"""

from __future__ import annotations

import ast
import json

import numpy as np
import pytest
import torch
from flwr.common import Context, RecordDict
from helpers import example_copy
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

import app.api
import hatch_build
from app.client_app import READ_APP_DATA, AppData, build_client
from app.config import ConfigError, app_keys, check_on_server, main, parse_settings
from app.local.simulation import LocalSimulation
from app.own_parts import OwnParts
from app.registry import METHODS
from app.server_app import server_main
from app.server_run import run_method
from clients.app_data import AppDataError, client_data_from, read_client_parts
from clients.models import MODELS, build_model, card_of, layout_of
from tests.conftest import REPO, shared_dataset

EXAMPLE = REPO / "examples" / "own-app"


class TanhNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x.flatten(1))))


class ReluNet(TanhNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.body(x.flatten(1))))  # no ReLU module: only tracing finds it


class BatchNormNet(TanhNet):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.norm(self.body(x.flatten(1)))))


def toy_data(partition_id: int, num_partitions: int, run_config: dict) -> tuple:
    generator = torch.Generator().manual_seed(partition_id)
    x = torch.randn(24, 6, generator=generator)
    y = torch.randint(0, 3, (24,), generator=generator)
    return (x[:16], y[:16]), DataLoader(TensorDataset(x[16:], y[16:]), batch_size=5)


# ------------------------------------------------------------------ the public surface


def test_the_public_surface_names_the_methods_the_parser_and_the_two_entry_points():
    names = set(app.api.__all__)
    assert {"METHODS", "method", "parse_settings", "build_server_app", "build_client_app"} <= names
    for name in app.api.__all__:
        value = getattr(app.api, name)
        if callable(value):  # classes and functions carry their own docstring
            assert value.__doc__ and value.__doc__ is not type.__doc__, f"{name} has no docstring"
        else:  # a registry (METHODS) is explained by the module's docstring
            assert f"``{name}``" in app.api.__doc__, f"{name} is not explained in app/api.py's docstring"
    fedprox = app.api.method("fedprox")
    assert (fedprox.class_name, fedprox.server.__name__, fedprox.client.__name__) == ("FedProx", "FederatedStrategy",
                                                                                      "FedProxClient")  # fmt: skip
    assert app.api.FedProx.__name__ == "FedProx" and fedprox.build  # stamen.FedProx: the one class of that name
    assert "fedprox-mu" in fedprox.keys and "local-steps" in fedprox.keys
    with pytest.raises(ConfigError, match="'fedavgg' is not a method; choose one of"):
        app.api.method("fedavgg")


def test_the_installed_package_exports_the_surface_without_importing_it(tmp_path):
    hatch_build.write_import_root(source_root=REPO, target=tmp_path)
    init = (tmp_path / "stamen" / "__init__.py").read_text()
    exported = next(node for node in ast.parse(init).body if isinstance(node, ast.Assign))
    assert ast.literal_eval(exported.value) == app.api.__all__
    assert "import torch" not in init and "from stamen.app import api" in init  # loaded on first use


def test_stamens_own_app_is_built_by_the_entry_points():
    for module in ("server_app", "client_app"):
        tree = ast.parse((REPO / "app" / f"{module}.py").read_text())
        assigned = [node.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", "") == "app" for t in node.targets)]  # fmt: skip
        assert len(assigned) == 1 and assigned[0].func.id == f"build_{module}", module


# ------------------------------------------------------------------ the app's own keys


def test_an_apps_own_keys_pass_and_a_misspelt_stamen_key_is_refused_naming_the_key_meant():
    config = {"strategy": "perfedavg", "dirichlet-alpha": 0.3, "max-per-class": 5, "fraction-train": 0.5}
    settings = parse_settings(config, allow_app_keys=True)
    assert settings.run.strategy == "perfedavg"
    assert app_keys(config) == {"dirichlet-alpha": 0.3, "max-per-class": 5, "fraction-train": 0.5}
    with pytest.raises(ConfigError, match="unknown run config key"):
        parse_settings(config)  # stamen's own app keeps refusing every key it does not declare
    for typo, meant in (("perfedavg-alhpa", "perfedavg-alpha"), ("num-server-round", "num-server-rounds"),
                        ("local-epoch", "local-epochs")):  # fmt: skip
        with pytest.raises(ConfigError, match=f"'{typo}' \\(did you mean '{meant}'"):
            parse_settings({**config, typo: 1}, allow_app_keys=True)


def test_the_checker_names_the_key_flower_would_refuse_with_code_15(capsys):
    assert main(["--app", str(EXAMPLE), "num-server-round=3"]) == 1
    assert "'num-server-round' is not declared" in capsys.readouterr().out
    assert main(["--app", str(EXAMPLE), "perfedavg-alhpa=0.1"]) == 1
    assert "stamen's key 'perfedavg-alpha' can be set once the app declares it" in capsys.readouterr().out
    assert main(["dataset='app'"]) == 1  # stamen's own app has no data function: refused, not a traceback
    assert "error: run config key 'dataset': dataset 'app' is an app's own data" in capsys.readouterr().out
    assert main(["--app", str(EXAMPLE), "strategy='ditto' dirichlet-alpha=0.1"]) == 0
    assert "the app's own keys ['data-dir'" not in capsys.readouterr().out  # data-dir is stamen's key too


# ------------------------------------------------------------------ the app's own model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_traits_read_from_a_network_agree_with_every_registered_card(name):
    shape = (3, 32, 32) if name.startswith(("fedavg", "resnet")) else (1, 28, 28)
    if name == "linear":
        shape = (60,)
    registered = MODELS[name].card
    read = card_of(build_model(name, input_shape=shape, num_classes=1 if name == "linear" else 10), name=name)
    assert (read.smooth, read.norm, read.inputs) == (registered.smooth, registered.norm, registered.inputs)


def test_traits_come_from_the_forward_pass_too():
    assert card_of(TanhNet(), name="t").smooth
    assert not card_of(ReluNet(), name="r").smooth  # F.relu in forward, no module
    assert card_of(BatchNormNet(), name="b").min_batch == 2


def test_the_apps_model_drives_stamens_checks_and_advice():
    parts = OwnParts(model=lambda config: BatchNormNet())
    settings, network = parts.settings({"strategy": "fedavg"}, own_data=True)
    assert isinstance(network, BatchNormNet)
    assert (settings.training.model, settings.data.dataset, settings.model_card.norm) == ("BatchNormNet", "app",
                                                                                           "batch")  # fmt: skip
    with pytest.raises(ConfigError, match="'batch-size': 1 is below 2"):
        parts.settings({"batch-size": 1}, own_data=True)
    relu = OwnParts(model=lambda config: ReluNet(), model_name="my-relu-net")
    settings, _ = relu.settings({"strategy": "perfedavg", "perfedavg-variant": "so"}, own_data=True)
    assert settings.method.curvature_bound_on(settings.model_card.smooth) == 0.3  # so on ReLU: bounded by default
    with pytest.raises(ConfigError, match="'dataset': 'app' is an app's own data"):
        OwnParts().settings({"dataset": "app"}, own_data=False)


def test_the_apps_model_is_built_from_the_runs_seed_on_both_sides():
    parts = OwnParts(model=lambda config: TanhNet())
    first = parts.settings({"seed": 4}, own_data=True)[1].state_dict()
    again = parts.settings({"seed": 4}, own_data=True)[1].state_dict()
    other = parts.settings({"seed": 5}, own_data=True)[1].state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["body.weight"], other["body.weight"])


# ------------------------------------------------------------------ the app's own data


def test_every_accepted_form_of_data_reads_to_the_same_arrays():
    x, y = torch.randn(12, 3, 4, 4), torch.arange(12) % 3
    pairs = TensorDataset(x, y)

    class DictRows(torch.utils.data.Dataset):  # what a flwr-datasets partition with a tensor transform gives
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int) -> dict:
            return {"img": x[i], "label": y[i], "id": f"row-{i}"}

    for train in ((x, y), (x.numpy(), y.numpy()), DataLoader(pairs, batch_size=5), pairs, DictRows(),
                  DataLoader(DictRows(), batch_size=7)):  # fmt: skip
        train_x, train_y, _, _ = read_client_parts(train, (x[:2], y[:2]))
        np.testing.assert_array_equal(train_x, x.numpy())
        np.testing.assert_array_equal(train_y, y.numpy())


def test_data_that_cannot_be_read_is_refused_saying_what_was_found():
    x, y = torch.randn(4, 2), torch.arange(4)
    with pytest.raises(AppDataError, match="cannot tell the inputs from the labels"):
        read_client_parts([{"a": x, "b": x, "label": y}], (x, y))
    with pytest.raises(AppDataError, match="not tensors: give the dataset a transform"):
        read_client_parts([{"img": ["a picture"] * 4, "label": y}], (x, y))
    with pytest.raises(AppDataError, match="labels are float32"):
        read_client_parts((x, y.float()), (x, y))
    with pytest.raises(AppDataError, match="label is outside 0..2"):
        client_data_from(read_client_parts((x, y), (x, y)), num_classes=3)


def test_a_client_of_the_apps_own_data_and_model_is_built_and_its_data_read_once_per_process():
    calls = []

    def counted(partition_id, num_partitions, run_config):
        calls.append(partition_id)
        return toy_data(partition_id, num_partitions, run_config)

    READ_APP_DATA.clear()
    parts = OwnParts(model=lambda config: TanhNet())
    load = AppData(data=counted, keys=None, size=4)
    for _ in range(2):
        context = Context(run_id=1, node_id=3, node_config={"partition-id": 1, "num-partitions": 4},
                          state=RecordDict(), run_config={"strategy": "ditto", "dirichlet-alpha": 0.2})  # fmt: skip
        client = build_client(context, parts, load)
    assert calls == [1]
    assert (len(client.data.train_y), len(client.data.test_y), client.data.num_classes) == (16, 8, 3)
    np.testing.assert_array_equal(client.data.train_x, toy_data(1, 4, {})[0][0].numpy())


# ------------------------------------------------------------------ the server side


def test_the_run_records_the_apps_model_data_and_keys(tmp_path):
    parts = OwnParts(model=lambda config: TanhNet(), data_name="toy-data")
    config = {"strategy": "fedprox", "results-dir": str(tmp_path), "run-name": "own", "dirichlet-alpha": 0.2}
    run_method(config, parts)
    recorded = json.loads((tmp_path / "own" / "run.json").read_text())["settings"]
    assert (recorded["model"], recorded["dataset"]) == ("TanhNet", "app")
    assert recorded["app"] == {"model": "TanhNet", "model-card": {"smooth": True, "norm": "none", "inputs": "flat"},
                               "data": "toy-data", "keys": {"dirichlet-alpha": 0.2}}  # fmt: skip


def test_a_refused_run_logs_one_line_first_and_its_summary_says_failed(tmp_path, caplog):
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"lr": -1.0, "results-dir": str(tmp_path), "run-name": "bad"})  # fmt: skip
    with pytest.raises(ConfigError):
        server_main(OwnParts(allow_app_keys=False))(None, context)
    assert "stamen: the run is refused: run config key 'lr': -1.0 is outside (0, inf)" in caplog.text
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert (summary["status"], summary["refused"]) == ("failed", True) and "'lr'" in summary["reason"]
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == ["summary.json"]


def test_every_method_runs_from_the_registry_it_is_documented_by():
    assert set(METHODS) == {m.name for m in METHODS.values()}


# ------------------------------------------------------------------ the example, end to end


@pytest.mark.e2e
def test_the_example_app_runs_moon_and_fedproto_on_its_plain_network_from_a_copy_outside_the_clone(tmp_path):
    # its Net is Flower's quickstart CNN, an nn.Module with its own forward; the apps name its head with split_at
    data_dir = shared_dataset("cifar10-jpeg")
    copy = example_copy("own-app", tmp_path, public_name="build_server_app")
    runs = {name: {"strategy": name, "num-server-rounds": 2, "data-dir": str(data_dir), "max-per-class": 40,
                   "dirichlet-alpha": 0.5, "results-dir": str(tmp_path / "results"), "run-name": name}
            for name in ("moon", "fedproto")}  # fmt: skip
    with LocalSimulation(app_dir=copy, workdir=tmp_path) as sim:
        outcomes = sim.run_many(runs, num_supernodes=4, ahead=2, timeout_s=600)  # side by side: waits overlap
    for name, outcome in outcomes.items():
        assert outcome.ok, outcome.log_tail
        assert "[round 1/2]" in outcome.log and "[round 2/2]" in outcome.log, outcome.log_tail
        summary = json.loads((tmp_path / "results" / name / "summary.json").read_text())
        assert summary["status"] == "completed"
        assert summary["settings"]["model"] == "Net" and summary["settings"]["app"]["data"] == "imagefolder-dirichlet"
        assert summary["settings"]["app"]["keys"] == {"dirichlet-alpha": 0.5, "max-per-class": 40}
        final = summary["final"]
        assert 0 <= final["accuracy"] <= 1 and final["eval-clients"] == 4  # the personalised evaluation ran
        data = summary["provenance"]["data"]
        assert data["train-examples"] + data["test-examples"] == 10 * 40  # the app's own key reached its data


@pytest.mark.parametrize("strategy", ["moon", "fedproto"])
def test_a_method_on_the_representation_refuses_a_network_without_the_split(strategy):
    settings, network = OwnParts(model=lambda config: TanhNet()).settings({"strategy": strategy}, own_data=True)
    with pytest.raises(ConfigError, match=f"{strategy} trains on the model's representation.*SplitModel"):
        check_on_server(settings, layout=layout_of(network))
    settings, network = OwnParts(model=lambda config: TanhNet()).settings({"strategy": "fedrep"}, own_data=True)
    check_on_server(settings, layout=layout_of(network))  # a head by its last layers needs no split
