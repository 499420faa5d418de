"""stamen's ClientApp, whose client refuses to train unless ``Context.state`` kept what it stored last round.

Every client trains every round (``fraction-fit = 1``), so before round r it must have
stored r - 1 counts and, from round 2 on, the model it returned in round r - 1.
"""

from __future__ import annotations

import numpy as np
from flwr.client import Client
from flwr.common import Context

from app.client_app import client_fn as stamen_client_fn
from app.message_client import serving_both
from clients.state import ClientState


def client_fn(context: Context) -> Client:
    client = stamen_client_fn(context)
    honest_fit = client.numpy_client.fit
    state = ClientState(context.state, owner="keeper")

    def checked_fit(parameters, config):
        server_round, fits = int(config["server-round"]), state.value("fits", 0)
        if fits != server_round - 1:
            raise RuntimeError(f"state lost: {fits} fits stored before round {server_round}")
        previous = state.arrays("returned")
        if server_round > 1 and (previous is None or not np.all(np.isfinite(previous[0]))):
            raise RuntimeError(f"state lost: no model stored before round {server_round}")
        arrays, num_examples, metrics = honest_fit(parameters, config)
        state.set_value("fits", fits + 1)
        state.set_arrays("returned", arrays)
        return arrays, num_examples, metrics

    client.numpy_client.fit = checked_fit
    return client


app = serving_both(client_fn)  # both of Flower's APIs, as stamen's own ClientApp
