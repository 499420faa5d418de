"""B4's floor: stamen's ClientApp with the training taken out (the message path alone).

Each message builds stamen's real client (settings, data, model, as every message
does); ``fit`` returns the received parameters at once. A run of this app through
Flower measures what a round costs with no client work: Flower's dispatch, polling
and serialisation, plus stamen's per-message set-up and its strategy.
"""

from __future__ import annotations

from flwr.client import NumPyClient
from flwr.common import Context

from app.client_app import node_client
from app.message_client import serving
from app.own_parts import OwnParts


def null_client(context: Context) -> NumPyClient:
    inner = node_client(context, parts=OwnParts(allow_app_keys=False))

    def fit(parameters: list, config: dict) -> tuple[list, int, dict]:
        return parameters, len(inner.train_y), {"train-loss": 0.0, "partition-id": inner.partition_id}

    inner.fit = fit
    return inner


app = serving(null_client)
