"""Shared fixtures: where the real data lives, a skip when it is absent, settings and stand-in nodes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from flwr.common import Code, GetPropertiesRes, Status
from flwr.server.client_proxy import ClientProxy

from app.config import parse_settings
from datasets import ClientData

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("STAMEN_SHARED_DATA", REPO.parent / "shared" / "data"))
OK = Status(code=Code.OK, message="")


def shared_dataset(name: str) -> Path:
    """The real dataset folder under ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data {path} is absent (set STAMEN_SHARED_DATA to the folder holding {name}/)")
    return path


def settings(**config):
    """Run settings from keyword arguments: ``settings(strategy="fedavg", local_steps=4)``."""
    return parse_settings({key.replace("_", "-"): value for key, value in config.items()})


def regression_data(n: int = 16, seed: int = 0) -> tuple[ClientData, np.ndarray, np.ndarray]:
    """A client's least-squares data (3 features), and its training inputs and targets in float64 for hand maths."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)).astype(np.float32)
    return ClientData(x, y, x[:4], y[:4], num_classes=0), x.astype(np.float64), y.astype(np.float64)


class FakeProxy(ClientProxy):
    """A connected node as the strategy sees it, serving partition ``partition`` (by default its id as a number)."""

    def __init__(self, cid: str, partition: int | None = None) -> None:
        super().__init__(cid)
        self.partition = int(cid) if partition is None else partition

    def get_properties(self, ins, timeout, group_id):
        return GetPropertiesRes(OK, {"partition-id": self.partition, "num-partitions": 0})

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError
