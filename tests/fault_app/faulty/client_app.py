"""stamen's ClientApp, except that partition 0 replies with NaN weights and partition 1 crashes in fit."""

from __future__ import annotations

import numpy as np
from flwr.client import NumPyClient
from flwr.common import Context

from app.client_app import client_fn as stamen_client_fn
from app.message_client import serving


def client_fn(context: Context) -> NumPyClient:
    client = stamen_client_fn(context)  # stamen's NumPyClient for this node
    honest_fit = client.fit
    partition = int(context.node_config["partition-id"])

    def nan_fit(parameters, config):
        arrays, num_examples, metrics = honest_fit(parameters, config)
        return [np.full_like(a, np.nan) for a in arrays], num_examples, metrics

    def crashing_fit(parameters, config):
        raise RuntimeError("this client crashed on purpose")

    if partition == 0:
        client.fit = nan_fit
    elif partition == 1:
        client.fit = crashing_fit
    return client


app = serving(client_fn)  # train, evaluate and query handlers, as stamen's own ClientApp
