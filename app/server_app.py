"""ServerApp: parse the run config, build the initial model and the chosen strategy."""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO

import numpy as np
import torch
from flwr.common import Context, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import Server, ServerApp, ServerAppComponents, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.strategy import Strategy

from app.config import ConfigError, Settings, check_server_files, parse_settings
from app.registry import METHODS, STRATEGY_NAMES
from app.results import ResultWriter, run_directory
from clients import build_model
from clients.models import parameter_count
from clients.training import accuracy_and_loss, to_tensor
from datasets import dataset_shape, load_source
from strategies.checkpoint import Checkpoint, CheckpointError, checkpoint_file, load_checkpoint
from strategies.resume import ContinuedRun


def central_evaluator(settings: Settings) -> Callable[[list[np.ndarray]], dict[str, float]]:
    """Accuracy and loss of a global model on the dataset's whole test set, on the server's device."""
    source = load_source(settings.data_spec())
    device = settings.client_settings().torch_device()
    model = build_model(settings.model, input_shape=source.input_shape, num_classes=source.num_classes)
    model.to(device)
    test_x, test_y = to_tensor(source.test_x, device), torch.as_tensor(source.test_y, device=device)
    keys = list(model.state_dict())

    def evaluate(arrays: list[np.ndarray]) -> dict[str, float]:
        model.load_state_dict({k: torch.as_tensor(a) for k, a in zip(keys, arrays, strict=True)})
        accuracy, loss = accuracy_and_loss(model, test_x, test_y)
        return {"accuracy": accuracy, "loss": loss}

    return evaluate


def strategy_arguments(settings: Settings) -> dict:
    """Keyword arguments every strategy takes (the registry adds the method's own)."""
    input_shape, num_classes = dataset_shape(settings.data_spec())
    model = build_model(settings.model, input_shape=input_shape, num_classes=num_classes, seed=settings.seed)
    log(INFO, "stamen: %s on %s, model %s (%d parameters)", settings.strategy, settings.dataset,
        settings.model, parameter_count(model))  # fmt: skip
    arrays = [value.detach().cpu().numpy() for value in model.state_dict().values()]
    return {
        "name": settings.strategy,
        "num_rounds": settings.num_server_rounds,
        "eval_every": settings.eval_every,
        "aggregation": settings.aggregation,
        "evaluate_config": {
            "adapt-steps": settings.adapt_steps,
            "adapt-lr": settings.client_settings().adaptation_lr(),
            "adapt-batch-size": settings.adapt_batch_size,
        },
        "fraction_fit": settings.fraction_fit,
        "fraction_evaluate": settings.fraction_evaluate,
        "min_fit_clients": settings.min_fit_clients,
        "min_evaluate_clients": settings.min_fit_clients,
        "min_available_clients": settings.min_available_clients,
        "initial_parameters": ndarrays_to_parameters(arrays),
        "central_evaluation": central_evaluator(settings) if settings.central_eval else None,
        "checkpoint_every": settings.checkpoint_every,
        "preflight": settings.preflight,
    }


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
        checkpoint = load_checkpoint(settings.resume_from)
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
    if checkpoint.round >= settings.num_server_rounds:
        raise ConfigError(
            f"run config key 'num-server-rounds': {settings.num_server_rounds} is not above the checkpoint's round "
            f"{checkpoint.round}; raise it to continue the run"
        )
    return checkpoint


def server_fn(context: Context) -> ServerAppComponents:
    """Build the strategy named by ``strategy`` with a result writer as its recorder."""
    settings = parse_settings(context.run_config, STRATEGY_NAMES)
    check_server_files(settings)
    checkpoint = checkpoint_to_resume(settings) if settings.resume_from else None
    method = METHODS[settings.strategy]
    kwargs = {**strategy_arguments(settings), **method.strategy_arguments(settings)}
    if checkpoint is None:
        run_dir = run_directory(settings.results_dir, settings.run_name, f"{settings.strategy}-{settings.dataset}")
        kwargs["recorder"] = ResultWriter(run_dir=run_dir, settings=settings.as_run_config())
        strategy = method.strategy_class(**kwargs)
        return components(strategy, settings, settings.num_server_rounds)
    # a resumed run continues in the checkpoint's folder, its records and round numbers
    run_dir = checkpoint_file(settings.resume_from).parent
    log(INFO, "stamen: resuming %s after round %d", run_dir, checkpoint.round)
    kwargs["recorder"] = ResultWriter(run_dir=run_dir, settings=settings.as_run_config(), resume_after=checkpoint.round)
    continued = ContinuedRun(strategy=method.strategy_class(**kwargs), checkpoint=checkpoint)
    return components(continued, settings, continued.remaining_rounds)


def components(strategy: Strategy, settings: Settings, num_rounds: int) -> ServerAppComponents:
    """Flower's server with ``server-threads`` messages in flight.

    Each message to a client waits in its own thread, which polls for the reply
    every 0.1 s; with Flower's default pool (CPUs + 4 threads) a 10-client round on
    2 cores goes out in two waves, which B4 measured at 0.43 s of a round's cost.
    """
    server = Server(client_manager=SimpleClientManager(), strategy=strategy)
    server.set_max_workers(settings.server_threads)
    return ServerAppComponents(server=server, config=ServerConfig(num_rounds=num_rounds))


app = ServerApp(server_fn=server_fn)
