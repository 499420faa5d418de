"""Where a client computes and what it draws: its device, its Ray node, its generator for a round (no Flower)."""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import torch

from strategies.contracts.keys import ConfigError


def round_generator(seed: int, partition_id: int, server_round: int, purpose: str) -> np.random.Generator:
    """A generator that depends only on (seed, partition, round, purpose): reproducible runs."""
    digest = hashlib.sha256(f"{seed}/{partition_id}/{server_round}/{purpose}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def ray_node() -> str:
    """The id of the Ray node this process runs on, or "" outside a Ray worker.

    Looked up only where Ray is already imported (a simulation's ClientApp actor), so
    a deployed SuperNode never imports it.
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    return str(ray.get_runtime_context().get_node_id())


def torch_device(name: str) -> torch.device:
    """The device to compute on: CUDA when asked for or (``auto``) when present.

    Raises
    ------
    ConfigError
        If ``cuda`` is asked for and torch sees no CUDA device here; naming the key
        now saves a traceback from deep inside torch at the first tensor moved.

    """
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "run config key 'device': 'cuda' was asked for but torch sees no CUDA device; use device = \"auto\" "
            "or \"cpu\", or give clients GPUs with client-resources-num-gpus"
        )
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")
