"""Feature shift: every client's images under a colour transform of its own (FedBN's setting).

The labels stay as the partitioner dealt them (``iid`` gives every client every
class); what differs between clients is how their images look, as photographs from
different cameras do. A client's transform is drawn once from ``(seed, partition)``
and applied to its training and test images alike: its test split is its own domain.
"""

from __future__ import annotations

import numpy as np

FEATURE_SHIFTS = ("none", "colour")
GREYSCALE_SHARE = 0.25  # a quarter of the clients see their images without colour
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, as PIL's convert("L")


def colour_transform(seed: int, partition_id: int) -> dict[str, float | bool | list[float]]:
    """Client ``partition_id``'s transform: greyscale or not, contrast, brightness and per-channel gains."""
    rng = np.random.default_rng([seed, partition_id, 0xFEA7])
    return {"greyscale": bool(rng.random() < GREYSCALE_SHARE), "contrast": float(rng.uniform(0.5, 1.5)),
            "brightness": float(rng.uniform(-0.25, 0.25)), "gains": rng.uniform(0.6, 1.4, size=3).tolist()}  # fmt: skip


def shift_colours(images: np.ndarray, transform: dict) -> np.ndarray:
    """``images`` (uint8 ``(N, 3, H, W)``) under ``transform``, as uint8.

    In [0, 1] units: greyscale (BT.601 luma in all three channels) if asked, then
    ``(x - 0.5) * contrast + 0.5 + brightness``, then each channel times its gain,
    clipped to [0, 1].

    Raises
    ------
    ValueError
        For anything but uint8 RGB images.

    """
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"feature-shift 'colour' needs uint8 RGB images (N, 3, H, W), got {images.dtype} "
                         f"{images.shape}")  # fmt: skip
    x = images.astype(np.float32) / 255.0
    if transform["greyscale"]:
        x = np.repeat(np.tensordot(LUMA, x, axes=([0], [1]))[:, None], 3, axis=1)
    x = (x - 0.5) * transform["contrast"] + 0.5 + transform["brightness"]
    x *= np.asarray(transform["gains"], dtype=np.float32)[None, :, None, None]
    return np.rint(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
