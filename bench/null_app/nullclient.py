"""B4's floor: stamen's ClientApp with the training taken out (the message path alone).

``client_fn`` builds stamen's real client (settings, data, model, as every message
does); ``fit`` returns the received parameters at once. A run of this app through
Flower measures what a round costs with no client work: Flower's dispatch, polling
and serialisation, plus stamen's per-message set-up and its strategy.
"""

from __future__ import annotations

from flwr.client import Client, ClientApp
from flwr.common import Context

from app.client_app import client_fn as stamen_client_fn


def client_fn(context: Context) -> Client:
    client = stamen_client_fn(context)
    inner = client.numpy_client

    def fit(parameters: list, config: dict) -> tuple[list, int, dict]:
        return parameters, len(inner.train_y), {"train-loss": 0.0, "partition-id": inner.partition_id}

    inner.fit = fit
    return client


app = ClientApp(client_fn=client_fn)
