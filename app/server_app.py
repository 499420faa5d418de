"""ServerApp: parse the run config, build the initial model and the chosen method's strategy."""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.common import Context, Parameters, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.client_manager import SimpleClientManager

from app.config import ConfigError, Settings, check_on_server, ignored_keys, ignored_keys_line, parse_settings
from app.provenance import run_provenance
from app.registry import METHODS
from app.results import ResultWriter, run_directory
from app.workdir import resolved
from clients.base import torch_device
from clients.models import build_model, layout_of, parameter_count
from clients.training import accuracy_and_loss, to_tensor
from datasets import dataset_shape, load_source
from strategies.base import FederatedStrategy
from strategies.checkpoint import Checkpoint, CheckpointError, checkpoint_file, load_checkpoint
from strategies.contracts.models import ModelLayout
from strategies.resume import ContinuedRun
from strategies.server import RoundServer


def central_evaluator(settings: Settings) -> Callable[[list[np.ndarray]], dict[str, float]]:
    """Accuracy and loss of a global model on the dataset's whole test set, on the server's device."""
    source = load_source(settings.data_spec())
    device = torch_device(settings.execution.device)
    model = build_model(settings.training.model, input_shape=source.input_shape, num_classes=source.num_classes)
    model.to(device)
    test_x, test_y = to_tensor(source.test_x, device), torch.as_tensor(source.test_y, device=device)
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
    arrays = model.state_dict()
    return ndarrays_to_parameters([value.detach().cpu().numpy() for value in arrays.values()]), layout_of(model)


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
     "eval-every"}
)  # fmt: skip


def checkpoint_to_resume(settings: Settings) -> Checkpoint:
    """The checkpoint named by ``resume-from``, checked against this run's settings.

    Raises
    ------
    ConfigError
        If the checkpoint is unreadable, was written with other settings (the
        differing keys are named), or already covers ``num-server-rounds``.

    """
    try:
        checkpoint = load_checkpoint(str(resolved(settings.execution.resume_from)))
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


def server_fn(context: Context) -> ServerAppComponents:
    """Build the strategy named by ``strategy`` with a result writer as its recorder."""
    settings = parse_settings(context.run_config)
    ignored = ignored_keys(context.run_config, settings)
    if ignored:
        log(WARNING, ignored_keys_line(ignored))
    check_on_server(settings)
    checkpoint = checkpoint_to_resume(settings) if settings.execution.resume_from else None
    # everything that can fail on the server runs before the results folder exists, so a folder is
    # only made for a run that reaches its clients (and then ends with a summary.json either way)
    parameters, layout = initial_model(settings)
    central_evaluation = central_evaluator(settings) if settings.run.central_eval else None
    if checkpoint is None:
        execution = settings.execution
        run_dir = run_directory(execution.results_dir, execution.run_name,
                                f"{settings.run.strategy}-{settings.data.dataset}")  # fmt: skip
        resume_after = None
    else:  # a resumed run continues in the checkpoint's folder, its records and round numbers
        run_dir = checkpoint_file(str(resolved(settings.execution.resume_from))).parent
        resume_after = checkpoint.round
        log(INFO, "stamen: resuming %s after round %d", run_dir, checkpoint.round)
    strategy = METHODS[settings.run.strategy].strategy(
        settings=settings,
        initial_parameters=parameters,
        layout=layout,
        recorder=ResultWriter(run_dir=run_dir, settings=settings.as_run_config(), resume_after=resume_after,
                              provenance=run_provenance(settings.execution.device)),
        central_evaluation=central_evaluation,
    )
    if checkpoint is not None:
        strategy = ContinuedRun(strategy=strategy, checkpoint=checkpoint)
    # server-threads: each message waits in its own thread, which polls for the reply every 0.1 s; with
    # Flower's default pool (CPUs + 4 threads) a 10-client round on 2 cores goes out in two waves (B4).
    server = RoundServer(client_manager=SimpleClientManager(), strategy=strategy,
                         max_workers=settings.execution.server_threads)  # fmt: skip
    rounds = strategy.remaining_rounds if checkpoint is not None else settings.run.num_server_rounds
    return ServerAppComponents(server=server, config=ServerConfig(num_rounds=rounds))


app = ServerApp(server_fn=server_fn)
