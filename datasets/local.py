"""A user's own data: an image folder or an ``.npz`` file, labelled by class *name*.

Two layouts are read:

- ``imagefolder``: ``<root>/train/<class>/*.png|jpg|jpeg`` and ``<root>/test/<class>/...``,
  read with torchvision's ``ImageFolder``;
- ``npz``: one ``.npz`` file (``<root>`` itself, or the only ``*.npz`` in the folder)
  with ``x_train``, ``y_train``, ``x_test``, ``y_test``.

The run config names the classes in order (``classes``) and the input shape
(``input-shape``). A folder's class is found by its name in that list, never by
the order of the folders a device happens to have: a device that lacks a class
would otherwise shift every label after it. Every problem is a
:class:`LocalDataError` that names the folder or file: a device's files are input,
so whatever they make the reading code raise is that device's fault, and the server
leaves out that device alone rather than stopping the run.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from datasets.base import ArraySource, DataUnavailableError
from datasets.cache import cache_dir, fingerprint, load_arrays, store_arrays

if TYPE_CHECKING:
    from PIL import Image

USER_DATASETS = ("imagefolder", "npz")
SPLITS = ("train", "test")
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
CACHE_VERSION = 2  # 2: 16-bit images scaled, not clipped; entries decoded before that are decoded again
# torchvision's IMG_EXTENSIONS, written out: importing torchvision costs a deployed device ~1.1 CPU-seconds per
# message (a fresh process each), so it is imported only to decode, never to find the cache entry
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# PIL's grey modes wider than 8 bits (a 16-bit PNG opens as one of them); convert("L") would clip them at 255
WIDE_GREY_MODES = ("I;16", "I;16B", "I;16L", "I")
SIXTEEN_TO_EIGHT_BITS = 257  # 65535 / 255
NUMBER_KINDS = "iuf"  # numpy dtype kinds an input may hold: signed, unsigned, float (not bool, complex, text)


class LocalDataError(DataUnavailableError):
    """A problem with one device's (or one folder's) own data; the message names the folder or file."""


def parse_classes(text: str) -> tuple[str, ...]:
    """The class names in label order: ``"cat,dog"`` -> ``("cat", "dog")``; a count ``"3"`` -> ``("0", "1", "2")``.

    Raises
    ------
    ValueError
        For an empty list, an empty or repeated name, or a count below 1.

    """
    text = text.strip()
    if text.isdigit():
        if int(text) < 1:
            raise ValueError(f"{text!r} is not a class count of at least 1")
        return tuple(str(i) for i in range(int(text)))
    names = tuple(name.strip() for name in text.split(","))
    if not text or any(not name for name in names):
        raise ValueError(f"{text!r} is not a comma-separated list of class names (or a count)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{text!r} names {repeated} more than once")
    return names


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x28x28"`` -> ``(1, 28, 28)`` (channels, height, width); ``"60"`` -> ``(60,)`` (feature vectors).

    Raises
    ------
    ValueError
        For anything but one or three positive integers joined by ``x``.

    """
    parts = text.strip().lower().split("x")
    if len(parts) not in (1, 3) or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{text!r} is not CxHxW (e.g. 1x28x28 or 3x32x32) or a feature count")
    return tuple(int(p) for p in parts)


def parse_channel_values(text: str) -> tuple[float, ...]:
    """``"0.49,0.48,0.45"`` -> ``(0.49, 0.48, 0.45)``: one number per input channel; ``""`` -> ``()``.

    Raises
    ------
    ValueError
        For anything but comma-separated finite numbers.

    """
    if not text.strip():
        return ()
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError as err:
        raise ValueError(f"{text!r} is not comma-separated numbers, one per channel (e.g. 0.49,0.48,0.45)") from err
    if not all(np.isfinite(values)):
        raise ValueError(f"{text!r} holds a non-finite value")
    return values


def load_user_data(kind: str, root: Path, classes: tuple[str, ...], input_shape: tuple[int, ...]) -> ArraySource:
    """The whole of ``root`` (train and test) as arrays, labels indexed by ``classes``.

    Decoded arrays are kept per process and on disk (:mod:`datasets.cache`), keyed
    by the files' names, sizes and times, the classes and the shape.

    Raises
    ------
    LocalDataError
        Naming the folder or file: a missing layout, an unknown class, an unreadable,
        broken or wrongly sized image, a file that is no ``.npz``, a missing, misshapen,
        non-numeric or non-finite array, labels that are no classes, an empty split; and
        anything else reading the files raised, with its type and message.

    """
    if kind not in USER_DATASETS:
        raise ValueError(f"dataset {kind!r} is not one of {USER_DATASETS}")
    with _faults_named(Path(root)):
        root = Path(root).expanduser().resolve()
        if kind == "imagefolder":
            return _load_image_folder(root, tuple(classes), tuple(input_shape))
        return _load_npz(_npz_file(root), tuple(classes), tuple(input_shape))


def class_counts(labels: np.ndarray, num_classes: int) -> dict[int, int]:
    """``{class index: examples}`` for the classes present in ``labels``."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)
    return {int(c): int(n) for c, n in enumerate(counts) if n}


@contextmanager
def _faults_named(root: Path) -> Iterator[None]:
    """Re-raise any failure reading ``root`` as a :class:`LocalDataError` naming the file it concerns.

    The checks below name what they know is wrong; this catches what they did not
    foresee (a file gone between a listing and a read, a loop of links, a reader's own
    error type), so that the device is left out instead of the run stopping.
    """
    try:
        yield
    except (LocalDataError, AssertionError):  # an assert is stamen's own invariant (or a test's probe), no file's fault
        raise
    except Exception as err:
        culprit = getattr(err, "filename", None) or root
        raise LocalDataError(f"data {culprit} cannot be read ({type(err).__name__}: {err})") from err


# ---------------------------------------------------------------- image folders


def _image_files(root: Path) -> list[Path]:
    return sorted(p for split in SPLITS for p in (root / split).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)


def _load_image_folder(root: Path, classes: tuple[str, ...], shape: tuple[int, ...]) -> ArraySource:
    for split in SPLITS:
        if not (root / split).is_dir():
            raise LocalDataError(f"image folder {root} has no {split}/ folder; expected {root}/train/<class>/*.png "
                                 f"and {root}/test/<class>/*.png")  # fmt: skip
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise LocalDataError(f"image folder {root}: input-shape {'x'.join(map(str, shape))} is not CxHxW with C 1 "
                             "(grey) or 3 (RGB)")  # fmt: skip
    files = _image_files(root)
    broken = next((path for path in files if not path.exists()), None)  # a link to nothing: it cannot be stat'ed
    if broken is not None:
        raise LocalDataError(f"image {broken} is a broken link (to {os.readlink(broken)}); remove it or restore "
                             "its target")  # fmt: skip
    return _cached_images(root, classes, shape, fingerprint(root, files, CACHE_VERSION, classes, shape))


@lru_cache(maxsize=8)
def _cached_images(root: Path, classes: tuple[str, ...], shape: tuple[int, ...], key: str) -> ArraySource:
    path = cache_dir() / f"imagefolder-{key}.npz"
    stored = load_arrays(path)
    if stored is None or set(stored) != set(NPZ_KEYS):
        stored = {}
        for split in SPLITS:
            stored[f"x_{split}"], stored[f"y_{split}"] = _decode_split(root / split, classes, shape)
        store_arrays(path, stored)
    return ArraySource(name="imagefolder", train_x=stored["x_train"], train_y=stored["y_train"],
                       test_x=stored["x_test"], test_y=stored["y_test"], num_classes=len(classes))  # fmt: skip


def _decode_split(folder: Path, classes: tuple[str, ...], shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every image of ``folder/<class>/`` as uint8 ``(N, C, H, W)`` and its class index by name."""
    from torchvision.datasets import ImageFolder

    index = {name: i for i, name in enumerate(classes)}

    class ByName(ImageFolder):
        # ImageFolder numbers the folders present in sorted order; here a folder's number is its
        # class's place in the run config's list, whichever folders this device has
        def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
            present = sorted(entry.name for entry in Path(directory).iterdir() if entry.is_dir())
            unknown = [name for name in present if name not in index]
            if unknown:
                raise LocalDataError(f"class folder {Path(directory) / unknown[0]} is not among the run config's "
                                     f"classes {list(classes)} (key 'classes'); rename or remove it")  # fmt: skip
            return present, {name: index[name] for name in present}

    try:
        folder_set = ByName(str(folder), allow_empty=True)
    except LocalDataError:
        raise
    except FileNotFoundError as err:
        raise LocalDataError(f"image folder {folder}: {err}") from err
    if not folder_set.samples:
        raise LocalDataError(f"image folder {folder} holds no images (expected {folder}/<class>/*.png or *.jpg)")
    channels, height, width = shape
    images = np.empty((len(folder_set.samples), channels, height, width), dtype=np.uint8)
    for i, (path, _) in enumerate(folder_set.samples):
        pixels = _image_pixels(path, "L" if channels == 1 else "RGB", (width, height))
        images[i] = pixels.reshape(height, width, channels).transpose(2, 0, 1)
    return images, np.asarray(folder_set.targets, dtype=np.int64)


def _image_pixels(path: str, mode: str, size: tuple[int, int]) -> np.ndarray:
    """The image at ``path`` as 8-bit ``mode`` pixels, ``(H, W)`` or ``(H, W, 3)``; ``size`` is (width, height)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            if image.size != size:  # read from the header: an image of the wrong size is never decoded
                raise LocalDataError(f"image {path} is {image.size[0]}x{image.size[1]} pixels (width x height); "
                                     f"input-shape asks for {size[0]}x{size[1]}")  # fmt: skip
            return np.asarray(_eight_bit(image, path).convert(mode))
    except LocalDataError:
        raise
    except Exception as err:  # Pillow's errors share no base (its DecompressionBombError is no OSError)
        raise LocalDataError(f"image {path} cannot be read ({type(err).__name__}: {err})") from err


def _eight_bit(image: Image.Image, path: str) -> Image.Image:
    """``image``, with a 16-bit grey image scaled to 0..255 (65535 -> 255, 32896 -> 128), to the nearest value."""
    if image.mode not in WIDE_GREY_MODES:
        return image
    from PIL import Image

    values = np.asarray(image, dtype=np.int64)
    low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
    if low < 0 or high > 65535:  # mode "I" is 32-bit: wider than any grey image stamen can scale
        raise LocalDataError(f"image {path} holds {image.mode} values from {low} to {high}; a grey image must hold "
                             "8- or 16-bit values (0 to 65535)")  # fmt: skip
    return Image.fromarray(((values + SIXTEEN_TO_EIGHT_BITS // 2) // SIXTEEN_TO_EIGHT_BITS).astype(np.uint8))


# ------------------------------------------------------------------------ .npz


def _npz_file(root: Path) -> Path:
    if root.is_file():
        return root
    found = sorted(root.glob("*.npz")) if root.is_dir() else []
    if len(found) != 1:
        what = "does not exist" if not root.exists() else f"holds {len(found)} .npz files, not one"
        raise LocalDataError(f"npz data {root} {what}; give the .npz file itself or a folder holding only it")
    return found[0]


def _load_npz(path: Path, classes: tuple[str, ...], shape: tuple[int, ...]) -> ArraySource:
    return _cached_npz(path, classes, shape, fingerprint(path.parent, [path], CACHE_VERSION))


@lru_cache(maxsize=8)
def _cached_npz(path: Path, classes: tuple[str, ...], shape: tuple[int, ...], key: str) -> ArraySource:
    arrays = _npz_arrays(path)
    split = {name: _npz_split(path, name, arrays[f"x_{name}"], arrays[f"y_{name}"], classes, shape) for name in SPLITS}
    return ArraySource(name="npz", train_x=split["train"][0], train_y=split["train"][1], test_x=split["test"][0],
                       test_y=split["test"][1], num_classes=len(classes))  # fmt: skip


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """The four arrays of the ``.npz`` at ``path``, as they are stored."""
    if not zipfile.is_zipfile(path):  # np.load would take it for a .npy or a pickle, and fail obscurely
        raise LocalDataError(f"npz file {path} is not an .npz (zip) archive: {_what_it_is(path)}")
    try:
        with np.load(path, allow_pickle=False) as stored:
            missing = [k for k in NPZ_KEYS if k not in stored.files]
            if missing:
                raise LocalDataError(f"npz file {path} lacks {missing}; it needs x_train, y_train, x_test, y_test")
            arrays = {k: stored[k] for k in NPZ_KEYS}
    except LocalDataError:
        raise
    except Exception as err:  # a damaged archive raises zipfile's, zlib's or numpy's errors, which share no base
        raise LocalDataError(f"npz file {path} cannot be read ({type(err).__name__}: {err})") from err
    raw = [k for k, v in arrays.items() if not isinstance(v, np.ndarray)]  # a member not saved by numpy: bytes
    if raw:
        raise LocalDataError(f"npz file {path}: {raw[0]} is not a numpy array (write the file with numpy.savez)")
    return arrays


def _what_it_is(path: Path) -> str:
    """What the file at ``path`` seems to be, for the message refusing it as an ``.npz``."""
    with path.open("rb") as file:
        head = file.read(8)
    if not head:
        return "it is empty (0 bytes)"
    if head.startswith(b"\x93NUMPY"):
        return "it is a single .npy array; write the four arrays with numpy.savez"
    if head.startswith(b"PK"):
        return f"it is a zip archive cut short or damaged ({path.stat().st_size} bytes, no end record)"
    return f"it starts with {head!r}"


def _npz_split(
    path: Path, split: str, x: np.ndarray, y: np.ndarray, classes: tuple[str, ...], shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    if y.ndim != 1:
        raise LocalDataError(f"npz file {path}: y_{split} has shape {y.shape}; it must hold one label per example "
                             "(1-D)")  # fmt: skip
    if len(y) == 0:
        raise LocalDataError(f"npz file {path}: y_{split} is empty")
    return _npz_inputs(path, split, x, len(y), shape), _npz_labels(path, split, y, classes)


def _npz_inputs(path: Path, split: str, x: np.ndarray, count: int, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` as ``(N, *shape)``: uint8 kept, other numbers as float32, every value finite."""
    if x.ndim < 2:
        raise LocalDataError(f"npz file {path}: x_{split} has shape {x.shape}; it must hold one example per row "
                             f"(N, {'x'.join(map(str, shape))})")  # fmt: skip
    if x.dtype.kind not in NUMBER_KINDS:
        raise LocalDataError(f"npz file {path}: x_{split} holds {x.dtype} values; it must hold integers or floats")
    if len(x) != count:
        raise LocalDataError(f"npz file {path}: x_{split} has {len(x)} examples, y_{split} {count}")
    example = tuple(x.shape[1:])
    if example != shape and not (len(shape) == 3 and shape[0] == 1 and example == shape[1:]):
        raise LocalDataError(f"npz file {path}: x_{split} examples have shape {example}; input-shape asks for "
                             f"{'x'.join(map(str, shape))}")  # fmt: skip
    x = x.reshape(len(x), *shape)
    if x.dtype == np.uint8:
        return x
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, refused below
        x = x.astype(np.float32)
    bad = x.size - int(np.count_nonzero(np.isfinite(x)))
    if bad:
        raise LocalDataError(f"npz file {path}: x_{split} holds {bad} non-finite values of {x.size} (NaN, infinity, "
                             "or beyond float32's range)")  # fmt: skip
    return x


def _npz_labels(path: Path, split: str, y: np.ndarray, classes: tuple[str, ...]) -> np.ndarray:
    """``y`` as int64 class indices: given as indices below ``len(classes)`` or as class names."""
    if y.dtype.kind in "US":  # labels by name
        index = {name: i for i, name in enumerate(classes)}
        unknown = sorted({str(v) for v in y} - set(index))
        if unknown:
            raise LocalDataError(f"npz file {path}: y_{split} holds labels {unknown[:5]} that are not among the run "
                                 f"config's classes {list(classes)} (key 'classes')")  # fmt: skip
        return np.asarray([index[str(v)] for v in y], dtype=np.int64)
    if y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= len(classes):
        raise LocalDataError(f"npz file {path}: y_{split} must hold class indices in [0, {len(classes)}) or class "
                             f"names; got {y.dtype} values from {y.min()} to {y.max()}")  # fmt: skip
    return y.astype(np.int64)
