"""What a client keeps across rounds: a round's writes are taken back when the round produced non-finite values."""

from __future__ import annotations

import numpy as np
from conftest import regression_data, settings
from helpers import toy_client

from clients.apfl import LOCAL_MODEL, ApflClient
from clients.base import PERSONAL_LAYERS
from clients.models import build_model
from clients.state import ClientState
from strategies.contracts.apfl import MIXING


def test_a_snapshot_puts_back_what_the_owner_kept_and_leaves_other_owners_alone():
    state = ClientState(owner="a")
    other = ClientState(state.records, owner="b")
    state.set_arrays("model", [np.ones(2)])
    state.set_value("count", 1)
    other.set_value("count", 7)
    kept = state.snapshot()
    state.set_arrays("model", [np.array([np.nan, 1.0])])
    state.set_arrays("new", [np.zeros(1)])
    state.set_value("count", float("inf"))
    assert state.non_finite == ["model", "count"]
    state.restore(kept)
    np.testing.assert_array_equal(state.arrays("model")[0], np.ones(2))
    assert state.value("count", 0) == 1 and state.arrays("new") is None and other.value("count", 0) == 7
    assert state.non_finite == []


def test_a_diverged_round_keeps_no_nan_head_and_no_nan_local_model():
    head_client = toy_client()
    body = head_client.get_parameters({})[:4]
    reply, _, _ = head_client.fit(body, {"server-round": 1, "payload": "model:4", "lr": 1e30})
    assert not all(np.all(np.isfinite(a)) for a in reply)
    assert head_client.state.arrays(PERSONAL_LAYERS) is None  # the initial head again next round, not NaN

    data, _, _ = regression_data()
    apfl = ApflClient(model=build_model("linear", input_shape=(3,), num_classes=0), data=data, partition_id=0,
                      settings=settings(strategy="apfl", dataset="least-squares", partitioner="natural", model="linear",
                                        lr=1e30, batch_size=16, device="cpu"))  # fmt: skip
    apfl.state.set_arrays(LOCAL_MODEL, [np.ones((1, 3), np.float32)])
    apfl.state.set_value(MIXING, 0.3)
    apfl.fit([np.zeros((1, 3), np.float32)], {"server-round": 1})
    np.testing.assert_array_equal(apfl.state.arrays(LOCAL_MODEL)[0], np.ones((1, 3)))
    assert apfl.state.value(MIXING, -1.0) == 0.3
