"""The run's method from its run config: the checks before any work, its model, results folder, checkpoint.

The round engine (:class:`strategies.flower.rounds.Rounds`, as the method strategies of
:mod:`app.message_methods`) plays what :func:`run_method` builds.
"""


from __future__ import annotations

from collections.abc import Callable, Mapping
from logging import ERROR, INFO, WARNING

import numpy as np
import torch
from flwr.common.logger import log

from app.config import ConfigError, Settings, check_on_server, ignored_keys, ignored_keys_line
from app.own_parts import OwnParts
from app.registry import METHODS
from app.results.provenance import run_provenance
from app.results.run_folder import earlier_run_problem, run_directory, write_refusal
from app.results.writer import ResultWriter
from app.workdir import resolved
from clients.batches import to_tensor
from clients.evaluation import accuracy_and_loss
from clients.models import build_model, layout_of, parameter_count
from clients.runtime import torch_device
from datasets import dataset_shape, load_source
from strategies.base import FederatedStrategy
from strategies.contracts.common import DataSettings, ExecutionSettings, RunSettings
from strategies.contracts.models import ModelLayout
from strategies.rounds.checkpoint import (
    Checkpoint,
    CheckpointError,
    arrays_of_model,
    check_model,
    checkpoint_file,
    load_checkpoint,
)
from strategies.rounds.run_checkpoints import resumable_state_problem


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


def initial_model(settings: Settings) -> tuple[list[np.ndarray], ModelLayout]:
    """The model every run starts from, built from the seed so server and clients agree, and its layout."""
    input_shape, num_classes = dataset_shape(settings.data_spec())
    model = build_model(settings.training.model, input_shape=input_shape, num_classes=num_classes,
                        seed=settings.run.seed)  # fmt: skip
    log(INFO, "stamen: %s on %s, model %s (%d parameters)", settings.run.strategy, settings.data.dataset,
        settings.training.model, parameter_count(model))  # fmt: skip
    return model_arrays(model), layout_of(model)


def model_arrays(model: torch.nn.Module) -> list[np.ndarray]:
    """Every ``state_dict`` array of ``model``, in order, as numpy arrays (copies)."""
    return [value.detach().cpu().numpy().copy() for value in model.state_dict().values()]


def build_strategy(settings: Settings, **options: object) -> FederatedStrategy:
    """The run's method's strategy from its initial model; ``options`` go to its constructor (recorder, ...)."""
    arrays, layout = initial_model(settings)
    return METHODS[settings.run.strategy].build(settings=settings, initial_model=arrays, layout=layout, **options)


# What may change when a run resumes: its length, where and how often it writes, where it computes.
RESUMABLE_CHANGES = frozenset(
    {"num-server-rounds", "checkpoint-every", "resume-from", "results-dir", "run-name", "device", "num-threads",
     "eval-every", "pull-interval", "overlap-rounds"}
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
    (:func:`app.results.run_folder.write_refusal`): it is the ``summary.json`` of a new or empty
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


def run_method(run_config: Mapping[str, object],
               parts: OwnParts) -> tuple[FederatedStrategy, Checkpoint | None, Settings]:  # fmt: skip
    """The run's method, the checkpoint it continues from (``resume-from``; ``None`` for a new run), its settings.

    Everything that can fail on the server runs here, before the results folder exists;
    the round engine (:class:`strategies.flower.rounds.Rounds`) plays what it builds.
    """
    settings, network = parts.settings(run_config, own_data=bool(parts.data_name))  # checked by app.config.rules
    ignored = ignored_keys(run_config, settings)
    if ignored:
        log(WARNING, ignored_keys_line(ignored))
    if network is None:
        arrays, layout = initial_model(settings)
    else:
        arrays, layout = model_arrays(network), layout_of(network)
        log(INFO, "stamen: %s on %s, the app's model %s (%d parameters)", settings.run.strategy,
            parts.data_name or settings.data.dataset, settings.training.model, parameter_count(network))  # fmt: skip
    check_on_server(settings, layout=layout)
    checkpoint = checkpoint_to_resume(settings, model=arrays) if settings.execution.resume_from else None
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
    strategy = METHODS[settings.run.strategy].build(
        settings=settings,
        initial_model=arrays,
        layout=layout,
        recorder=ResultWriter(run_dir=run_dir, settings=recorded, resume_after=resume_after,
                              provenance=run_provenance(settings.execution.device)),
        central_evaluation=central_evaluation,
    )
    return strategy, checkpoint, settings


def earlier_run_in_the_way(settings: Settings) -> str | None:
    """Why a new run may not write to its ``run-name`` folder (``app.results.run_folder.earlier_run_problem``), or None.

    Asked before any work, so a run that would mix its files with an earlier run's is
    refused at once; the writer claims the folder atomically later (:class:`ResultWriter`).
    """
    execution = settings.execution
    if not execution.run_name:  # a default folder is always a new one
        return None
    return earlier_run_problem(run_directory(execution.results_dir, execution.run_name, ""))


