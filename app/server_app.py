"""ServerApp: the run on the API its ``api`` key names, the legacy one inside stamen's RoundServer.

:func:`build_server_app` is the entry point, for stamen's own app (``app`` below) and an outside app alike.
"""


from __future__ import annotations

from collections.abc import Callable, Mapping

from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat import start_grid
from flwr.serverapp import Grid

from app.config import ConfigError
from app.message_methods import run_on_grid
from app.own_parts import ModelFn, OwnParts
from app.server_run import refused, run_strategy
from strategies.contracts.common import DEFAULT_API, ExecutionSettings
from strategies.contracts.models import ModelCard
from strategies.paced_grid import paced_run
from strategies.server import RoundServer


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
    """The ServerApp's ``main``: the run on the API its ``api`` key names (the same records either way).

    ``message``: the method's Message API strategy started on the grid
    (:func:`app.message_methods.run_on_grid`); ``legacy``: Flower's legacy loop in
    stamen's RoundServer (:func:`server_function`), as a ``server_fn`` ServerApp runs it.
    """

    def main(grid: Grid, context: Context) -> None:
        if str(context.run_config.get("api", DEFAULT_API)) == "message":
            run_on_grid(grid, context.run_config, parts)
            return
        components = server_function(parts)(context)  # a bad api value is refused here, with the allowed ones
        # one pull loop for every client thread, every pull-interval s (Flower's deployed grid: 3 s per thread)
        with paced_run(grid, ExecutionSettings.from_config(context.run_config).pull_interval) as run_grid:
            start_grid(grid=run_grid, server=components.server, config=components.config)

    return main


def server_function(parts: OwnParts) -> Callable[[Context], ServerAppComponents]:
    """Flower's ``server_fn`` for an app's parts (:func:`build_server_app`); a refused run logs why, in one line."""

    def server_fn(context: Context) -> ServerAppComponents:
        try:
            return server_components(context.run_config, parts)
        except ConfigError as err:
            refused(err, context.run_config, parts)
            raise

    return server_fn


def server_components(run_config: Mapping[str, object], parts: OwnParts) -> ServerAppComponents:
    """Build the strategy named by ``strategy``, with a result writer as its recorder, inside stamen's round server."""
    strategy, rounds, settings = run_strategy(run_config, parts)
    # server-threads: each message waits in its own thread, which polls for the reply every 0.1 s; with
    # Flower's default pool (CPUs + 4 threads) a 10-client round on 2 cores goes out in two waves (B4).
    server = RoundServer(client_manager=SimpleClientManager(), strategy=strategy,
                         max_workers=settings.execution.server_threads)  # fmt: skip
    return ServerAppComponents(server=server, config=ServerConfig(num_rounds=rounds))


server_fn = server_function(OwnParts(allow_app_keys=False))  # stamen's own (apps that wrap it, the tests)
app = build_server_app(allow_app_keys=False)
