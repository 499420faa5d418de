"""A ClientApp of this app's own around stamen's ``client_fn``, with the throwaway model registered first.

The ClientApp is built here, not re-exported: Flower hands it to each simulation worker by
reference to the module that defines its ``client_fn``, so that worker imports this module,
and so ``tiny.model``, before it builds a client.
"""

from flwr.client import Client
from flwr.common import Context

import tiny.model  # noqa: F401  (registers tiny-net)
from app.client_app import client_fn as stamen_client_fn
from app.message_client import serving_both


def client_fn(context: Context) -> Client:
    return stamen_client_fn(context)


app = serving_both(client_fn)  # both of Flower's APIs, as stamen's own ClientApp
