"""Write one image folder per device from the embedded MNIST sample: a dataset to try node-local data with.

Each device gets ``train/<class>/*.png`` and ``test/<class>/*.png`` with the digits
named in words (``zero`` ... ``nine``), so the folders sort in another order than
the labels (``eight`` first): a loader that numbered folders by their order would
mislabel almost every image, which is what the run config's ``classes`` prevents.

    python -m datasets.tools.device_folders --out /tmp/devices --devices 3 --drop 2:seven,nine

writes ``/tmp/devices/device-0`` ... ``device-2``; device 2 holds no sevens or nines.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from datasets.embedded import load_mnist_5k

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
CLASSES = ",".join(DIGITS)  # the run config's classes for these folders
INPUT_SHAPE = "1x28x28"


def write_split(folder: Path, images: np.ndarray, labels: np.ndarray, names: tuple[str, ...] = DIGITS) -> None:
    """``images`` (uint8 ``(N, 1, H, W)``) as ``folder/<names[label]>/<i>.png``."""
    from PIL import Image

    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        target = folder / names[int(label)]
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0]).save(target / f"{i:05d}.png")


def make_device_folders(
    out: Path,
    *,
    devices: int,
    train_per_class: int = 20,
    test_per_class: int = 5,
    drop: dict[int, tuple[str, ...]] | None = None,
    seed: int = 0,
) -> list[Path]:
    """Write ``out/device-<k>`` for every device: disjoint MNIST images, each class but the dropped ones.

    Parameters
    ----------
    out
        The folder to write the device folders into.
    devices
        How many devices.
    train_per_class, test_per_class
        Images of each class a device holds in ``train/`` and ``test/``.
    drop
        Device -> the class names it lacks (in both splits).
    seed
        Seeds which images each device gets.

    Returns
    -------
    list of Path
        The device folders, in device order.

    Raises
    ------
    ValueError
        If the sample holds too few images of a class for every device, or ``drop``
        names an unknown class.

    """
    drop = drop or {}
    unknown = sorted({name for names in drop.values() for name in names} - set(DIGITS))
    if unknown:
        raise ValueError(f"drop names {unknown}, which are not among {list(DIGITS)}")
    source = load_mnist_5k()
    rng = np.random.default_rng(seed)
    folders = []
    pools = {}
    for split, x, y, per_class in (("train", source.train_x, source.train_y, train_per_class),
                                   ("test", source.test_x, source.test_y, test_per_class)):  # fmt: skip
        for label in range(len(DIGITS)):
            indices = rng.permutation(np.flatnonzero(y == label))
            if len(indices) < devices * per_class:
                raise ValueError(f"the sample holds {len(indices)} {split} images of {DIGITS[label]}, fewer than "
                                 f"{devices} devices x {per_class}")  # fmt: skip
            pools[split, label] = (x, indices)
    for device in range(devices):
        folder = out / f"device-{device}"
        for split, per_class in (("train", train_per_class), ("test", test_per_class)):
            labels = [label for label in range(len(DIGITS)) if DIGITS[label] not in drop.get(device, ())]
            chosen = {label: pools[split, label][1][device * per_class : (device + 1) * per_class] for label in labels}
            images = np.concatenate([pools[split, label][0][chosen[label]] for label in labels])
            write_split(folder / split, images, np.repeat(labels, per_class))
        folders.append(folder)
    return folders


def _drops(text: str) -> dict[int, tuple[str, ...]]:
    """``"2:seven,nine 0:one"`` -> ``{2: ("seven", "nine"), 0: ("one",)}``."""
    out = {}
    for item in text.split():
        device, names = item.split(":")
        out[int(device)] = tuple(names.split(","))
    return out


def main(argv: list[str] | None = None) -> None:
    """Write the device folders the command line asks for, and print the run config that reads them."""
    parser = argparse.ArgumentParser(prog="python -m datasets.tools.device_folders", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write device-0, device-1, ... into")
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--train-per-class", type=int, default=20)
    parser.add_argument("--test-per-class", type=int, default=5)
    parser.add_argument("--drop", default="", help='classes a device lacks: "2:seven,nine 0:one"')
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folders = make_device_folders(args.out, devices=args.devices, train_per_class=args.train_per_class,
                                  test_per_class=args.test_per_class, drop=_drops(args.drop),
                                  seed=args.seed)  # fmt: skip
    for folder in folders:
        print(folder)
    print(f'run config: dataset="imagefolder" classes="{CLASSES}" input-shape="{INPUT_SHAPE}"')


if __name__ == "__main__":
    main()
