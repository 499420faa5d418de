"""A ClientApp of this app's own around stamen's ``client_fn``, with the throwaway model registered first.

The ClientApp is built here, not re-exported: Flower hands it to each simulation worker by
reference to the module that defines its ``client_fn``, so that worker imports this module,
and so ``tiny.model``, before it builds a client.
"""

from flwr.client import NumPyClient
from flwr.common import Context

import tiny.model  # noqa: F401  (registers tiny-net)
from app.client_app import client_fn as stamen_client_fn
from app.message_client import serving


def client_fn(context: Context) -> NumPyClient:
    return stamen_client_fn(context)


app = serving(client_fn)  # train, evaluate and query handlers, as stamen's own ClientApp
