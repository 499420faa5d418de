"""What a client sends back: a message's arrays unpacked and checked, and the metrics of its fit and evaluate replies.

Pure functions of plain values (no Flower, no model): :class:`clients.base.TorchClient`
calls them with what it holds.
"""

from __future__ import annotations

import math

import numpy as np

from clients.evaluation import PersonalisedResult
from clients.training import TrainReport
from strategies.contracts.client_reports import (
    ACCURACY,
    GLOBAL_ACCURACY,
    GLOBAL_LOSS,
    GRAD_EVALS,
    HVP_EVALS,
    LOCAL_STEPS,
    PARTITION_ID,
    SAMPLE_GRADS,
    SMALL_BATCH,
    START_LOSS,
    TRAIN_LOSS,
)
from strategies.contracts.contract import Contract
from strategies.contracts.payload import LAYOUT, MODEL, PayloadError, sets_problem, unpack


def unpacked(parameters: list[np.ndarray], config: dict, purpose: str, *, contract: Contract,
             model_size: int) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:  # fmt: skip
    """A ``purpose`` message's model arrays and its other array sets, by the layout it names.

    Raises
    ------
    ValueError
        If the arrays do not match their layout, the sets are not those ``contract`` sends,
        or the model's arrays are not ``model_size``.

    """
    try:
        sets = unpack(parameters, config.get(LAYOUT))
    except PayloadError as err:
        raise ValueError(f"{contract.name} client: {err}") from err
    model = sets.pop(MODEL, [])
    if problem := sets_problem(list(sets), contract.sends, purpose):
        raise ValueError(f"{contract.name} client: {problem} (is the server's code another version of stamen?)")
    if len(model) != model_size:
        raise ValueError(f"expected {model_size} arrays, received {len(model)}")
    return model, sets


def fit_metrics(report: TrainReport, *, partition_id: int, small_batch: bool, layout: str) -> dict:
    """A fit reply's metrics: the round's losses and costs, the partition, the layout of its arrays."""
    metrics = {TRAIN_LOSS: report.mean_loss, LOCAL_STEPS: report.steps, GRAD_EVALS: report.grad_evals,
               HVP_EVALS: report.hvp_evals, SAMPLE_GRADS: report.sample_grads, PARTITION_ID: partition_id,
               SMALL_BATCH: int(small_batch), **report.extra, LAYOUT: layout}  # fmt: skip
    if math.isfinite(report.first_loss):  # a method that steps through train_steps knows it
        metrics[START_LOSS] = report.first_loss
    return metrics


def evaluation_metrics(result: PersonalisedResult, *, partition_id: int, global_model: bool,
                       classifier: bool) -> dict:  # fmt: skip
    """An evaluate reply's metrics; ``global-*`` only where the client tested a global model (no personal arrays)."""
    metrics = {GRAD_EVALS: result.grad_evals, PARTITION_ID: partition_id}
    if global_model:
        metrics[GLOBAL_LOSS] = result.global_loss
    if classifier:  # least squares has losses only
        metrics[ACCURACY] = result.accuracy
        if global_model:
            metrics[GLOBAL_ACCURACY] = result.global_accuracy
    return metrics
