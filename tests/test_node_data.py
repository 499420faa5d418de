"""A device's own data: image folders and .npz labelled by class name, its errors, and the preflight's use of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, FakeFleet, settings
from flwr.common import Context, RecordDict
from helpers import LocalNode
from PIL import Image

import datasets.local as local
from app.client_app import client_fn
from app.config import ConfigError
from datasets import LocalDataError, load_client_data, load_node_data
from datasets.embedded import load_mnist_5k
from datasets.tools.device_folders import CLASSES, DIGITS, INPUT_SHAPE, make_device_folders
from strategies.nodes.data import data_lines
from strategies.nodes.directory import NodeDirectory
from strategies.nodes.preflight import PreflightError, connected, preflight

RUN = {"dataset": "imagefolder", "classes": CLASSES, "input-shape": INPUT_SHAPE, "strategy": "perfedavg",
       "device": "cpu", "model": "mlp"}  # fmt: skip


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STAMEN_CACHE_DIR", str(tmp_path / "cache"))
    local._cached_images.cache_clear()


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("devices")
    return make_device_folders(out, devices=3, train_per_class=4, test_per_class=2, drop={2: ("seven", "nine")})


def spec():
    return settings(**{k.replace("-", "_"): v for k, v in RUN.items()}).data_spec()


def test_folders_are_labelled_by_class_name_not_by_their_order(devices):
    # every image is found in the embedded sample by its pixels: its label there must be the one loaded
    source = load_mnist_5k()
    label_of = {x.tobytes(): int(y) for x, y in zip(source.train_x, source.train_y, strict=True)}
    label_of |= {x.tobytes(): int(y) for x, y in zip(source.test_x, source.test_y, strict=True)}
    for device, folder in enumerate(devices):
        data = load_node_data(spec(), str(folder))
        for x, y in ((data.train_x, data.train_y), (data.test_x, data.test_y)):
            assert [label_of[image.tobytes()] for image in x] == y.tolist()
        held = set(data.train_y.tolist())
        assert held == (set(range(10)) - {7, 9} if device == 2 else set(range(10)))
        assert data.train_x.shape == (4 * len(held), 1, 28, 28) and data.train_x.dtype == np.uint8
    # the sorted folder order (eight, five, four, ...) is not the label order: a sorted numbering would be wrong
    assert sorted(DIGITS) != list(DIGITS)


def damaged(tmp_path, devices, damage):
    folder = tmp_path / "device"
    shutil.copytree(devices[0], folder)
    return folder, damage(folder)


def unknown_class(folder):
    (folder / "train" / "ten").mkdir()
    return folder / "train" / "ten"


def unreadable(folder):
    (folder / "train" / "one" / "bad.png").write_bytes(b"not a png")
    return folder / "train" / "one" / "bad.png"


def wrong_size(folder):
    Image.new("L", (20, 24)).save(folder / "test" / "two" / "small.png")
    return folder / "test" / "two" / "small.png"


def empty_split(folder):
    for path in (folder / "test").rglob("*.png"):
        path.unlink()
    return folder / "test"


def no_split(folder):
    shutil.rmtree(folder / "test")
    return folder


@pytest.mark.parametrize(
    ("damage", "message"),
    [(unknown_class, "class folder {} is not among"), (unreadable, "image {} cannot be read"),
     (wrong_size, "image {} is 20x24 pixels"), (empty_split, "image folder {} holds no images"),
     (no_split, "image folder {} has no test/ folder")],
    ids=["unknown-class", "unreadable", "wrong-size", "empty-split", "no-split"],
)  # fmt: skip
def test_bad_device_data_is_refused_naming_the_folder_or_file(tmp_path, devices, damage, message):
    folder, culprit = damaged(tmp_path, devices, damage)
    with pytest.raises(LocalDataError) as caught:
        load_node_data(spec(), str(folder))
    assert message.format(culprit.resolve()) in str(caught.value)


def test_npz_data_takes_indices_or_names_and_names_the_file_when_wrong(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (6, 28, 28), dtype=np.uint8)  # (N, H, W) is taken for 1xHxW
    path = tmp_path / "data.npz"
    np.savez(path, x_train=x, y_train=np.array(["one", "zero", "nine", "one", "one", "two"]), x_test=x[:2],
             y_test=np.array([3, 9]))  # fmt: skip
    npz = settings(**{"dataset": "npz", "classes": CLASSES, "input_shape": INPUT_SHAPE}).data_spec()
    data = load_node_data(npz, str(tmp_path))  # the folder holding one .npz, or the file itself
    assert data.train_y.tolist() == [1, 0, 9, 1, 1, 2] and data.test_y.tolist() == [3, 9]
    assert data.train_x.shape == (6, 1, 28, 28)
    np.savez(path, x_train=x, y_train=np.array(["one"] * 5 + ["ten"]), x_test=x[:2], y_test=np.array([3, 9]))
    local._cached_npz.cache_clear()
    with pytest.raises(LocalDataError, match=rf"npz file {path}: y_train holds labels \['ten'\]"):
        load_node_data(npz, str(path))
    np.savez(path, x_train=x, y_train=np.zeros(6, np.int64))
    with pytest.raises(LocalDataError, match=rf"npz file {path} lacks \['x_test', 'y_test'\]"):
        load_node_data(npz, str(path))


def test_decoded_images_are_cached_on_disk_and_a_changed_file_is_decoded_again(tmp_path, devices, monkeypatch):
    load_node_data(spec(), str(devices[1]))
    assert len(list((tmp_path / "cache").glob("imagefolder-*.npz"))) == 1
    local._cached_images.cache_clear()

    def no_decoding(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(local, "_decode_split", no_decoding)
    assert len(load_node_data(spec(), str(devices[1])).train_y) == 40  # read back from the disk cache
    local._cached_images.cache_clear()
    Image.new("L", (28, 28)).save(devices[1] / "train" / "one" / "new.png")  # a changed folder: a new key
    try:
        with pytest.raises(AssertionError, match="decoded again"):
            load_node_data(spec(), str(devices[1]))
    finally:
        (devices[1] / "train" / "one" / "new.png").unlink()


def test_user_data_keys_are_checked_before_any_work():
    with pytest.raises(ConfigError, match="run config key 'classes' must be set for dataset 'imagefolder'"):
        settings(dataset="imagefolder", input_shape="1x28x28")
    with pytest.raises(ConfigError, match="run config key 'input-shape': '28-28' is not CxHxW"):
        settings(dataset="imagefolder", classes="3", input_shape="28-28")
    with pytest.raises(ConfigError, match=r"run config key 'classes': 'a,b,a' names \['a'\] more than once"):
        settings(dataset="npz", classes="a,b,a", input_shape="4")
    assert settings(dataset="npz", classes="3", input_shape="4").data_spec().classes == ("0", "1", "2")
    with pytest.raises(ConfigError, match="run config key 'central-eval': the server tests on the run config's"):
        settings(dataset="imagefolder", classes="3", input_shape="1x8x8", central_eval=True)


def test_one_folder_is_split_over_simulated_clients(devices):
    run = settings(**{k.replace("-", "_"): v for k, v in RUN.items()}, data_dir=str(devices[0]), partitioner="iid")
    parts = [load_client_data(run.data_spec(2), run.partition_spec(2), p) for p in range(2)]
    assert [len(p.train_y) for p in parts] == [20, 20] and [len(p.test_y) for p in parts] == [10, 10]
    assert all(np.bincount(p.train_y).tolist() == [2] * 10 for p in parts)  # iid: each class split evenly


# ---------------------------------------------------------------- the ClientApp and the preflight


def node_client(folder, run=None):
    context = Context(run_id=1, node_id=5, node_config={"data-dir": str(folder)}, state=RecordDict(),
                      run_config={**RUN, **(run or {})})  # fmt: skip
    return client_fn(context)


def test_a_node_reports_its_own_data_and_its_faults_with_its_folder(tmp_path, devices):
    properties = node_client(devices[2]).get_properties({})
    assert properties["data-dir"] == str(devices[2]) and properties["partition-id"] == -1
    assert properties["num-train"] == 32 and "7:" not in properties["train-classes"]
    folder, culprit = damaged(tmp_path, devices, wrong_size)
    answer = node_client(folder).get_properties({})
    assert str(culprit.resolve()) in answer["preflight-error"] and answer["preflight-scope"] == "node"
    strict = node_client(devices[0], {"strict-batches": True, "batch-size": 50})
    answer = strict.get_properties({"batch-size": 50})
    assert answer["preflight-error"].startswith(f"batch-size 50 must be in [1, 40] (this client's training examples "
                                                f"in {devices[0]}")  # fmt: skip
    assert answer["preflight-scope"] == "node"


def test_the_preflight_numbers_devices_leaves_out_a_bad_one_and_reports_every_node(tmp_path, devices):
    bad, _ = damaged(tmp_path, devices, unknown_class)
    fleet = FakeFleet()
    # node ids are random; numbers follow the data-dirs' order
    for cid, folder in (("77", devices[2]), ("12", devices[0]), ("50", bad), ("31", devices[1])):
        fleet.register(LocalNode(cid, node_client(folder)))
    nodes = NodeDirectory()
    left_out = preflight(nodes, fleet, {"batch-size": 10})
    assert isinstance(left_out, PreflightError)
    assert left_out.lines == [f"1 of 4 clients (data-dir {bad}): class folder {bad.resolve()}/train/ten is not "
                              f"among the run config's classes {list(DIGITS)} (key 'classes'); rename or remove it"]
    assert nodes.excluded == {"50": left_out.lines[0].split(": ", 1)[1]}
    assert {cid: nodes.partition_of(cid) for cid in ("12", "31", "77")} == {"12": 0, "31": 1, "77": 2}
    assert set(connected(nodes, fleet)) == {0, 1, 2}  # the bad node stays out
    report = nodes.data_report(tuple(DIGITS))
    assert [entry["data-dir"] for entry in report] == [str(d) for d in devices]
    assert report[2]["train-classes"] == {d: 4 for d in DIGITS if d not in ("seven", "nine")}
    assert report[0]["num-test"] == 20 and len(data_lines(report)) == 3
    assert data_lines(report)[2].startswith(f"partition 2 ({devices[2]}): 32 train, 16 test; train classes zero 4")


def test_a_fault_of_the_run_still_stops_the_preflight(devices):
    fleet = FakeFleet(LocalNode("1", node_client(devices[0])),
                      LocalNode("2", node_client(devices[1], {"dataset": "mnist-5k"})))  # fmt: skip
    with pytest.raises(PreflightError, match=r"1 of 2 clients \(data-dir .*device-1\): a node's own data-dir needs"):
        preflight(NodeDirectory(), fleet, {})


def test_no_node_left_stops_the_preflight(tmp_path, devices):
    bad, _ = damaged(tmp_path, devices, unknown_class)
    with pytest.raises(PreflightError, match="no node is left to train"):
        preflight(NodeDirectory(), FakeFleet(LocalNode("1", node_client(bad))), {})


def test_properties_reply_is_ok(devices):
    from flwr.app import ConfigRecord, Message, MessageType

    from app.client_app import app as client_app
    from app.local.message_grid import NODE_BASE, InProcessGrid
    from strategies.flower.codec import CONFIG_RECORD
    from strategies.flower.fleet import PROPERTIES

    # the device's query message answered by stamen's own ClientApp, through Flower's wire encoding
    grid = InProcessGrid(run_config=RUN, num_clients=1, client_app=client_app)
    grid.contexts[NODE_BASE] = Context(run_id=1, node_id=NODE_BASE, node_config={"data-dir": str(devices[0])},
                                       state=RecordDict(), run_config=RUN)  # fmt: skip
    query = Message(RecordDict({CONFIG_RECORD: ConfigRecord({})}), dst_node_id=NODE_BASE,
                    message_type=MessageType.QUERY)  # fmt: skip
    [reply] = grid.send_and_receive([query])
    assert not reply.has_error(), reply.error.reason
    assert dict(reply.content.config_records[PROPERTIES])["data-dir"] == str(devices[0])


def test_a_cached_folder_loads_without_importing_torchvision(devices, tmp_path):
    # a deployed device pays every import in every message (a fresh process each): the cache hit must stay cheap
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert set(local.IMAGE_EXTENSIONS) == set(IMG_EXTENSIONS)
    load_node_data(spec(), str(devices[0]))  # decodes, and writes the cache entry
    code = ("import sys; from datasets import load_node_data; from test_node_data import spec; "
            f"load_node_data(spec(), {str(devices[0])!r}); print('torchvision' in sys.modules)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
