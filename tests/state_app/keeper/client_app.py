"""stamen's ClientApp, whose client refuses to train unless ``Context.state`` kept what it stored last round.

Every client trains every round (``fraction-fit = 1``), so before round r it must have
stored r - 1 counts and, from round 2 on, the model it returned in round r - 1.
"""

from __future__ import annotations

import numpy as np
from flwr.client import NumPyClient
from flwr.common import Context

from app.client_app import client_fn as stamen_client_fn
from app.message_client import serving
from clients.state import ClientState


def client_fn(context: Context) -> NumPyClient:
    client = stamen_client_fn(context)
    honest_fit = client.fit
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

    client.fit = checked_fit
    return client


app = serving(client_fn)  # train, evaluate and query handlers, as stamen's own ClientApp
