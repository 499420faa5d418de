"""Shared fixtures: where the real data lives, and a skip when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flwr.server.client_proxy import ClientProxy

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("STAMEN_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared_dataset(name: str) -> Path:
    """The real dataset folder under ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real data {path} is absent (set STAMEN_SHARED_DATA to the folder holding {name}/)")
    return path


class FakeProxy(ClientProxy):
    """A connected node as the strategy sees it, for tests that drive a strategy by hand."""

    def get_properties(self, ins, timeout, group_id):
        raise NotImplementedError

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError
