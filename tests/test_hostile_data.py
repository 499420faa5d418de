"""A device's bad files leave out that device alone: each is a LocalDataError naming the file, never a crash."""

from __future__ import annotations

import os
import stat
import struct
import zipfile
import zlib

import numpy as np
import pytest
from conftest import settings
from flwr.common import Context, RecordDict
from PIL import Image

import datasets.local as local
from app.client_app import client_fn
from clients.fedavg import FedAvgClient
from clients.models import build_model
from datasets import ClientData, LocalDataError
from datasets.local import load_user_data

CLASSES = ("a", "b")
FEATURES = (4,)
GREY = (1, 4, 4)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STAMEN_CACHE_DIR", str(tmp_path / "cache"))
    local._cached_images.cache_clear()
    local._cached_npz.cache_clear()


# ------------------------------------------------------------------------ .npz


def arrays(**changed):
    good = {"x_train": np.ones((4, 4), np.float32), "y_train": np.array([0, 1, 0, 1]),
            "x_test": np.ones((2, 4), np.float32), "y_test": np.array([0, 1])}  # fmt: skip
    return {**good, **changed}


def saved(**changed):
    def write(path):
        np.savez(path, **arrays(**changed))

    return write


def zero_bytes(path):
    path.write_bytes(b"")


def truncated(path):
    np.savez(path, **arrays())
    path.write_bytes(path.read_bytes()[:100])


def one_npy(path):
    with path.open("wb") as file:
        np.save(file, np.ones((4, 4)))


def text(path):
    path.write_text("x,y\n1,0\n")


def damaged_member(path):
    np.savez_compressed(path, **arrays(x_train=np.random.default_rng(0).random((4, 4))))
    data = bytearray(path.read_bytes())
    data[80:90] = bytes(b ^ 0xFF for b in data[80:90])  # inside x_train's compressed bytes; the end record intact
    path.write_bytes(bytes(data))


def raw_members(path):
    with zipfile.ZipFile(path, "w") as archive:  # named like numpy's members, without the .npy that makes them arrays
        for key in arrays():
            archive.writestr(key, b"1,2,3")


# what follows "npz file <path>" in the message
NPZ_CASES = {
    "zero-byte": (zero_bytes, " is not an .npz (zip) archive: it is empty (0 bytes)"),
    "truncated": (truncated, " is not an .npz (zip) archive: it is a zip archive cut short or damaged"),
    "an-npy": (one_npy, " is not an .npz (zip) archive: it is a single .npy array"),
    "text": (text, " is not an .npz (zip) archive: it starts with b'x,y"),
    "damaged-member": (damaged_member, " cannot be read (BadZipFile: Bad CRC-32 for file 'x_train.npy')"),
    "raw-members": (raw_members, ": x_train is not a numpy array"),
    "string-x": (saved(x_train=np.full((4, 4), "a")), ": x_train holds <U1 values; it must hold integers or floats"),
    "0-d-x": (saved(x_train=np.array(3.0)), ": x_train has shape (); it must hold one example per row (N, 4)"),
    "bool-x": (saved(x_train=np.ones((4, 4), bool)), ": x_train holds bool values"),
    "complex-x": (saved(x_test=np.ones((2, 4), complex)), ": x_test holds complex128 values"),
    "nan-x": (saved(x_train=np.full((4, 4), np.nan)), ": x_train holds 16 non-finite values of 16"),
    "one-inf": (saved(x_test=np.array([[0, 1, 2, np.inf], [0, 0, 0, 0]])), ": x_test holds 1 non-finite values of 8"),
    "beyond-float32": (saved(x_train=np.full((4, 4), 1e300)), ": x_train holds 16 non-finite values of 16"),
    "2-d-y": (saved(y_train=np.zeros((4, 2), np.int64)), ": y_train has shape (4, 2); it must hold one label per"),
    "0-d-y": (saved(y_test=np.array(1)), ": y_test has shape (); it must hold one label per example"),
}


@pytest.mark.parametrize(("write", "message"), NPZ_CASES.values(), ids=NPZ_CASES.keys())
def test_a_bad_npz_is_refused_naming_the_file_and_what_is_wrong(tmp_path, write, message):
    path = tmp_path / "device" / "data.npz"
    path.parent.mkdir()
    write(path)
    with pytest.raises(LocalDataError) as caught:
        load_user_data("npz", path.parent, CLASSES, FEATURES)
    assert f"npz file {path}{message}" in str(caught.value)


# ---------------------------------------------------------------- image folders


def image_folder(root, value=7, dtype=np.uint8):
    for split in ("train", "test"):
        (root / split / "a").mkdir(parents=True)
        Image.fromarray(np.full((4, 4), value, dtype)).save(root / split / "a" / "one.png")
    return root


def png_header(width, height):
    """A PNG whose header claims ``width`` x ``height`` pixels, with no pixels behind it."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grey
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def broken_link(folder):
    (folder / "gone.png").symlink_to(folder / "deleted.png")
    return folder / "gone.png", f"is a broken link (to {folder / 'deleted.png'})"


def bomb(folder):
    (folder / "huge.png").write_bytes(png_header(20_000, 20_000))
    return folder / "huge.png", "cannot be read (DecompressionBombError: Image size (400000000 pixels) exceeds limit"


def wide_integers(folder):
    Image.fromarray(np.full((4, 4), 70_000, np.int32)).save(folder / "wide.tif")  # PIL mode "I": 32-bit
    return folder / "wide.tif", "holds I values from 70000 to 70000; a grey image must hold 8- or 16-bit values"


@pytest.mark.parametrize("damage", [broken_link, bomb, wide_integers], ids=["broken-link", "bomb", "32-bit"])
def test_a_bad_image_is_refused_naming_the_file_and_what_is_wrong(tmp_path, damage):
    root = image_folder(tmp_path / "device")
    culprit, message = damage(root / "train" / "a")
    with pytest.raises(LocalDataError) as caught:
        load_user_data("imagefolder", root, CLASSES, GREY)
    assert f"image {culprit} {message}" in str(caught.value)


@pytest.mark.parametrize("channels", [1, 3])
def test_16_bit_images_are_scaled_to_8_bits_not_clipped(tmp_path, channels):
    shape = (channels, 4, 4)
    white = load_user_data("imagefolder", image_folder(tmp_path / "white", 65535, np.uint16), CLASSES, shape)
    grey = load_user_data("imagefolder", image_folder(tmp_path / "grey", 32896, np.uint16), CLASSES, shape)
    assert Image.open(tmp_path / "grey" / "train" / "a" / "one.png").mode == "I;16"
    assert white.train_x.dtype == np.uint8 and (white.train_x == 255).all() and (white.test_x == 255).all()
    assert (grey.train_x == 128).all() and (grey.test_x == 128).all()


def test_the_cache_of_a_private_folder_is_private(tmp_path):
    root = image_folder(tmp_path / "device")
    root.chmod(0o700)
    umask = os.umask(0o022)  # the usual umask: without care the entry would be 0644
    try:
        load_user_data("imagefolder", root, CLASSES, GREY)
    finally:
        os.umask(umask)
    (entry,) = (tmp_path / "cache").iterdir()
    assert entry.name.startswith("imagefolder-") and entry.suffix == ".npz"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700


def test_a_damaged_cache_entry_is_decoded_again(tmp_path):
    root = image_folder(tmp_path / "device")
    first = load_user_data("imagefolder", root, CLASSES, GREY)
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_bytes(entry.read_bytes()[:50])  # a process killed mid-copy, a full disk
    local._cached_images.cache_clear()
    again = load_user_data("imagefolder", root, CLASSES, GREY)
    np.testing.assert_array_equal(again.train_x, first.train_x)


# ---------------------------------------------------------------- the node and its client

RUN = {"classes": ",".join(CLASSES), "strategy": "fedavg", "device": "cpu", "model": "mlp"}


def zero_byte_npz(folder):
    folder.mkdir()
    (folder / "data.npz").write_bytes(b"")
    return folder / "data.npz", {"dataset": "npz", "input-shape": "4"}


def bomb_folder(folder):
    culprit, _ = bomb(image_folder(folder) / "train" / "a")
    return culprit, {"dataset": "imagefolder", "input-shape": "1x4x4"}


@pytest.mark.parametrize("bad", [zero_byte_npz, bomb_folder], ids=["npz", "imagefolder"])
def test_a_node_with_bad_files_is_left_out_alone(tmp_path, bad):
    culprit, run = bad(tmp_path / "device")
    context = Context(run_id=1, node_id=5, node_config={"data-dir": str(tmp_path / "device")}, state=RecordDict(),
                      run_config={**RUN, **run})  # fmt: skip
    answer = client_fn(context).get_properties({})  # the node's answer to the preflight's query
    assert str(culprit) in answer["preflight-error"]
    assert answer["preflight-scope"] == "node"  # the server leaves out this node; the others train


def labelled_client(labels, data_dir):
    x = np.zeros((len(labels), 2), np.float32)
    data = ClientData(x, np.asarray(labels, np.int64), x, np.asarray(labels, np.int64), num_classes=2)
    return FedAvgClient(model=build_model("logreg", input_shape=(2,), num_classes=2, seed=0), data=data,
                        settings=settings(strategy="fedavg", model="logreg", device="cpu"), partition_id=3,
                        data_dir=data_dir)  # fmt: skip


@pytest.mark.parametrize(("data_dir", "scope"), [("/data/device", "node"), ("", "run")])
def test_data_the_properties_cannot_summarise_is_reported_not_raised(data_dir, scope):
    answer = labelled_client([0, 1, -1], data_dir).get_properties({})
    assert answer["preflight-error"].startswith(f"the data of {data_dir or 'partition 3'} cannot be summarised")
    assert answer["preflight-scope"] == scope and answer["num-train"] == 3
    assert "preflight-error" not in labelled_client([0, 1, 1], data_dir).get_properties({})
