"""stamen's ClientApp, except that partition 0 replies with NaN weights and partition 1 crashes in fit."""

from __future__ import annotations

import numpy as np
from flwr.client import Client
from flwr.common import Context

from app.client_app import client_fn as stamen_client_fn
from app.message_client import serving_both


def client_fn(context: Context) -> Client:
    client = stamen_client_fn(context)  # Flower's Client wrapping stamen's NumPyClient
    honest_fit = client.numpy_client.fit
    partition = int(context.node_config["partition-id"])

    def nan_fit(parameters, config):
        arrays, num_examples, metrics = honest_fit(parameters, config)
        return [np.full_like(a, np.nan) for a in arrays], num_examples, metrics

    def crashing_fit(parameters, config):
        raise RuntimeError("this client crashed on purpose")

    if partition == 0:
        client.numpy_client.fit = nan_fit
    elif partition == 1:
        client.numpy_client.fit = crashing_fit
    return client


app = serving_both(client_fn)  # both of Flower's APIs, as stamen's own ClientApp
