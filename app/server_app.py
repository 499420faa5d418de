"""ServerApp: parse the run config, build the initial model and the chosen strategy."""

from __future__ import annotations

from collections.abc import Callable
from logging import INFO

import numpy as np
import torch
from flwr.common import Context, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from app.config import Settings, parse_settings
from app.registry import METHODS, STRATEGY_NAMES
from app.results import ResultWriter, run_directory
from clients import build_model
from clients.models import parameter_count
from clients.training import accuracy_and_loss, to_tensor
from datasets import dataset_shape, load_source


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
    }


def server_fn(context: Context) -> ServerAppComponents:
    """Build the strategy named by ``strategy`` with a result writer as its recorder."""
    settings = parse_settings(context.run_config, STRATEGY_NAMES)
    method = METHODS[settings.strategy]
    kwargs = {**strategy_arguments(settings), **method.strategy_arguments(settings)}
    run_dir = run_directory(settings.results_dir, settings.run_name, f"{settings.strategy}-{settings.dataset}")
    kwargs["recorder"] = ResultWriter(run_dir=run_dir, settings=settings.as_run_config())
    strategy = method.strategy_class(**kwargs)
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=settings.num_server_rounds))


app = ServerApp(server_fn=server_fn)
