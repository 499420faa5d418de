"""ServerApp: parse the run config, build the initial model and the chosen method's strategy.

:func:`build_server_app` is the entry point, for stamen's own app (``app`` below) and an outside app alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from logging import ERROR, INFO, WARNING

import numpy as np
import torch
from flwr.common import Context, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat import start_grid
from flwr.serverapp import Grid

from app.config import ConfigError, Settings, check_on_server, ignored_keys, ignored_keys_line
from app.own_parts import ModelFn, OwnParts
from app.provenance import run_provenance
from app.registry import METHODS
from app.results import ResultWriter
from app.run_folder import earlier_run_problem, run_directory, write_refusal
from app.workdir import resolved
from clients.base import torch_device
from clients.models import build_model, layout_of, parameter_count
from clients.training import accuracy_and_loss, to_tensor
from datasets import dataset_shape, load_source
from strategies.base import FederatedStrategy
from strategies.checkpoint import (
    Checkpoint,
    CheckpointError,
    arrays_of_model,
    check_model,
    checkpoint_file,
    load_checkpoint,
)
from strategies.contracts.common import DataSettings, ExecutionSettings, RunSettings
from strategies.contracts.models import ModelCard, ModelLayout
from strategies.resume import ContinuedRun
from strategies.run_checkpoints import resumable_state_problem
from strategies.server import RoundServer


def central_evaluator(settings: Settings) -> Callable[[list[np.ndarray]], dict[str, float]]:
    """Accuracy and loss of a global model on the dataset's whole test set, on the server's device."""
    source = load_source(settings.data_spec())
    device = torch_device(settings.execution.device)
    model = build_model(settings.training.model, input_shape=source.input_shape, num_classes=source.num_classes)
    model.to(device)
    test_x = to_tensor(source.test_x, device, settings.data.normalisation())
    test_y = torch.as_tensor(source.test_y, device=device)
    keys = list(model.state_dict())

    def evaluate(arrays: list[np.ndarray]) -> dict[str, float]:
        model.load_state_dict({k: torch.as_tensor(a) for k, a in zip(keys, arrays, strict=True)})
        accuracy, loss = accuracy_and_loss(model, test_x, test_y)
        return {"accuracy": accuracy, "loss": loss}

    return evaluate


def initial_model(settings: Settings) -> tuple[Parameters, ModelLayout]:
    """The model every run starts from, built from the seed so server and clients agree, and its layout."""
    input_shape, num_classes = dataset_shape(settings.data_spec())
    model = build_model(settings.training.model, input_shape=input_shape, num_classes=num_classes,
                        seed=settings.run.seed)  # fmt: skip
    log(INFO, "stamen: %s on %s, model %s (%d parameters)", settings.run.strategy, settings.data.dataset,
        settings.training.model, parameter_count(model))  # fmt: skip
    return model_parameters(model), layout_of(model)


def model_parameters(model: torch.nn.Module) -> Parameters:
    """Every ``state_dict`` array of ``model``, in order, as Flower's parameters."""
    return ndarrays_to_parameters([value.detach().cpu().numpy() for value in model.state_dict().values()])


def initial_parameters(settings: Settings) -> Parameters:
    """The model every run starts from (:func:`initial_model` without the layout)."""
    return initial_model(settings)[0]


def build_strategy(settings: Settings, **options: object) -> FederatedStrategy:
    """The run's method's strategy from its initial model; ``options`` go to its constructor (recorder, ...)."""
    parameters, layout = initial_model(settings)
    return METHODS[settings.run.strategy].strategy(settings=settings, initial_parameters=parameters,
                                                   layout=layout, **options)  # fmt: skip


# What may change when a run resumes: its length, where and how often it writes, where it computes.
RESUMABLE_CHANGES = frozenset(
    {"num-server-rounds", "checkpoint-every", "resume-from", "results-dir", "run-name", "device", "num-threads",
     "eval-every", "api"}
)  # fmt: skip


def checkpoint_to_resume(settings: Settings, *, model: list[np.ndarray] | None = None) -> Checkpoint:
    """The checkpoint named by ``resume-from``, checked against this run's settings and, if given, its ``model``.

    Raises
    ------
    ConfigError
        If the checkpoint is unreadable or malformed, lacks what resuming reads, holds
        a model of other shapes or dtypes, was written with other settings (the
        differing keys are named), or already covers ``num-server-rounds``.

    """
    try:
        checkpoint = load_checkpoint(str(resolved(settings.execution.resume_from)))
        # a tuned run's checkpoint holds the tuner's state (FATHOM's own tuner is known only to its strategy)
        tuned = settings.tuner is not None or "tuner" in checkpoint.state
        if problem := resumable_state_problem(checkpoint.state, tuned=tuned):
            raise CheckpointError(f"checkpoint {problem}")
        if model is not None:
            check_model(model, arrays_of_model(checkpoint))
    except CheckpointError as err:
        raise ConfigError(f"run config key 'resume-from': {err}") from err
    stored = checkpoint.state.get("settings", {})
    current = settings.as_run_config()
    differing = sorted(k for k in current if k not in RESUMABLE_CHANGES and stored.get(k) != current[k])
    if differing:
        shown = ", ".join(f"{k} = {stored.get(k)!r} there, {current[k]!r} here" for k in differing[:6])
        raise ConfigError(
            f"run config key 'resume-from': the checkpoint was written with other settings ({shown}); only "
            f"{sorted(RESUMABLE_CHANGES)} may change on resume"
        )
    if checkpoint.round >= settings.run.num_server_rounds:
        raise ConfigError(
            f"run config key 'num-server-rounds': {settings.run.num_server_rounds} is not above the checkpoint's "
            f"round {checkpoint.round}; raise it to continue the run"
        )
    return checkpoint


def refused(err: Exception, run_config: Mapping[str, object], parts: OwnParts) -> None:
    """Log a refused run's reason as one line, before Flower prints its traceback, and record it in its folder.

    The folder is the one the run would have written to; when the keys naming it are the
    ones refused, there is none, and the log line is all. The record replaces nothing
    (:func:`app.run_folder.write_refusal`): it is the ``summary.json`` of a new or empty
    folder, and ``refused-<timestamp>.json`` beside an earlier run's files.
    """
    reason = " ".join(str(err).split())
    log(ERROR, "stamen: the run is refused: %s", reason)
    try:
        run = RunSettings.from_config(run_config)
        execution = ExecutionSettings.from_config(run_config)
        data_name = parts.data_name or str(run_config.get("dataset", DataSettings.key_specs()[0].default))
        run_dir = run_directory(execution.results_dir, execution.run_name, f"{run.strategy}-{data_name}")
        written = write_refusal(run_dir=run_dir, reason=reason, run_config=run_config)
    except (ConfigError, OSError):  # the refusal's own line above is what matters; a record is a courtesy
        return
    if written is not None:
        log(INFO, "stamen wrote %s (status failed: refused)", written)


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
        if str(context.run_config.get("api", "")) == "message":
            from app.message_methods import run_on_grid  # it imports this module, so it loads on first use

            run_on_grid(grid, context.run_config, parts)
            return
        components = server_function(parts)(context)  # a bad api value is refused here, with the allowed ones
        start_grid(grid=grid, server=components.server, config=components.config)

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


def run_strategy(run_config: Mapping[str, object], parts: OwnParts) -> tuple[FederatedStrategy | ContinuedRun, int,
                                                                             Settings]:  # fmt: skip
    """The run's stamen strategy (continued from ``resume-from``'s checkpoint if named), its rounds left, its settings.

    Everything that can fail on the server runs here, before the results folder exists;
    both adapters (the legacy ``RoundServer`` and the Message API strategy) drive what it builds.
    """
    settings, network = parts.settings(run_config, own_data=bool(parts.data_name))  # checked by app.config.rules
    ignored = ignored_keys(run_config, settings)
    if ignored:
        log(WARNING, ignored_keys_line(ignored))
    if network is None:
        parameters, layout = initial_model(settings)
    else:
        parameters, layout = model_parameters(network), layout_of(network)
        log(INFO, "stamen: %s on %s, the app's model %s (%d parameters)", settings.run.strategy,
            parts.data_name or settings.data.dataset, settings.training.model, parameter_count(network))  # fmt: skip
    check_on_server(settings, layout=layout)
    checkpoint = (checkpoint_to_resume(settings, model=parameters_to_ndarrays(parameters))
                  if settings.execution.resume_from else None)  # fmt: skip
    if checkpoint is None and (problem := earlier_run_in_the_way(settings)):
        raise ConfigError(problem)
    # everything that can fail on the server runs before the results folder exists, so a folder is
    # only made for a run that reaches its clients (and then ends with a summary.json either way)
    central_evaluation = central_evaluator(settings) if settings.run.central_eval else None
    if checkpoint is None:
        execution = settings.execution
        run_dir = run_directory(execution.results_dir, execution.run_name,
                                f"{settings.run.strategy}-{parts.data_name or settings.data.dataset}")  # fmt: skip
        resume_after = None
    else:  # a resumed run continues in the checkpoint's folder, its records and round numbers
        run_dir = checkpoint_file(str(resolved(settings.execution.resume_from))).parent
        resume_after = checkpoint.round
        log(INFO, "stamen: resuming %s after round %d", run_dir, checkpoint.round)
    recorded = {**settings.as_run_config(), **parts.record(run_config, settings)}
    strategy = METHODS[settings.run.strategy].strategy(
        settings=settings,
        initial_parameters=parameters,
        layout=layout,
        recorder=ResultWriter(run_dir=run_dir, settings=recorded, resume_after=resume_after,
                              provenance=run_provenance(settings.execution.device)),
        central_evaluation=central_evaluation,
    )
    if checkpoint is None:
        return strategy, settings.run.num_server_rounds, settings
    continued = ContinuedRun(strategy=strategy, checkpoint=checkpoint)
    return continued, continued.remaining_rounds, settings


def earlier_run_in_the_way(settings: Settings) -> str | None:
    """Why a new run may not write to its ``run-name`` folder (:func:`app.run_folder.earlier_run_problem`), or ``None``.

    Asked before any work, so a run that would mix its files with an earlier run's is
    refused at once; the writer claims the folder atomically later (:class:`ResultWriter`).
    """
    execution = settings.execution
    if not execution.run_name:  # a default folder is always a new one
        return None
    return earlier_run_problem(run_directory(execution.results_dir, execution.run_name, ""))


server_fn = server_function(OwnParts(allow_app_keys=False))  # stamen's own (apps that wrap it, the tests)
app = build_server_app(allow_app_keys=False)
