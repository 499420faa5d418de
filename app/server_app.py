"""ServerApp: the run its run config names, played by stamen's round engine on Flower's Message API.

:func:`build_server_app` is the entry point, for stamen's own app (``app`` below) and an outside app alike.
"""


from __future__ import annotations

from collections.abc import Callable

from flwr.common import Context
from flwr.serverapp import Grid, ServerApp

from app.message_methods import run_on_grid
from app.own_parts import ModelFn, OwnParts
from strategies.contracts.models import ModelCard


def build_server_app(
    *,
    model: ModelFn | None = None,
    model_name: str = "",
    model_card: ModelCard | None = None,
    data_name: str = "",
    allow_app_keys: bool = True,
) -> ServerApp:
    """A Flower ``ServerApp`` that runs the stamen method named by the run config's ``strategy``.

    It is what stamen's own app runs (``app = build_server_app(allow_app_keys=False)``), so
    an app built with it gets the same run: the checks before any work, the preflight,
    a line per round, the results folder (``metrics.jsonl``, ``summary.json``,
    ``accuracy.png``), checkpoints and resuming, and the personalised evaluation.

    Parameters
    ----------
    model
        ``model(run_config) -> torch.nn.Module``: the app's own network, built from the
        run's ``seed`` (the clients build it the same way). ``None``: the registered
        model named by the ``model`` key (docs/models.md).
    model_name
        What the runs call the app's network; default: its class name.
    model_card
        Its traits for stamen's checks (BatchNorm, smooth activations); default: read
        from the network (:func:`clients.models.card_of`).
    data_name
        The name of the app's own data, which its clients load
        (``build_client_app(data=...)``); ``""``: the data is stamen's ``dataset``.
    allow_app_keys
        Pass the app's own run-config keys through to it; a key that looks like a misspelt
        stamen key is still refused (:func:`app.config.keys.looks_like_stamen_key`).

    """
    parts = OwnParts(model=model, model_name=model_name, model_card=model_card, data_name=data_name,
                     allow_app_keys=allow_app_keys)  # fmt: skip
    app = ServerApp()
    app.main()(server_main(parts))
    return app


def server_main(parts: OwnParts) -> Callable[[Grid, Context], None]:
    """The ServerApp's ``main``: the method's Message API strategy started on the grid (:func:`run_on_grid`)."""

    def main(grid: Grid, context: Context) -> None:
        run_on_grid(grid, context.run_config, parts)

    return main


app = build_server_app(allow_app_keys=False)
