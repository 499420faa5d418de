"""The shared torch ``NumPyClient``: parameters in and out, local SGD, personalised evaluation."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch
from flwr.client import NumPyClient
from torch import nn

from clients.settings import ClientSettings
from clients.training import (
    TrainReport,
    batch_indices,
    personalised_evaluation,
    sgd_steps,
    steps_for,
    to_tensor,
)
from datasets import ClientData

# Metric keys, defined once; strategies read the same strings.
TRAIN_LOSS = "train-loss"
GRAD_EVALS = "grad-evals"
HVP_EVALS = "hvp-evals"
SAMPLE_GRADS = "sample-grads"
LOCAL_STEPS = "local-steps"
ACCURACY = "accuracy"
GLOBAL_ACCURACY = "global-accuracy"
GLOBAL_LOSS = "global-loss"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"


def round_generator(seed: int, partition_id: int, server_round: int, purpose: str) -> np.random.Generator:
    """A generator that depends only on (seed, partition, round, purpose): reproducible runs."""
    digest = hashlib.sha256(f"{seed}/{partition_id}/{server_round}/{purpose}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class TorchClient(NumPyClient):
    """A client holding one torch model and its own train/test arrays.

    Subclasses change what a round of local training does by overriding
    :meth:`local_train`; everything else (parameter exchange, reply metrics,
    personalised evaluation) is shared.

    Parameters
    ----------
    model
        The network; its initial weights are replaced by the server's each message.
    data
        This client's arrays.
    settings
        Default hyperparameters; a round's config dict may override them.
    partition_id, num_partitions
        This client's partition and how many there are (reported through
        ``get_properties``; 0 partitions = not known).

    """

    def __init__(
        self,
        *,
        model: nn.Module,
        data: ClientData,
        settings: ClientSettings,
        partition_id: int,
        num_partitions: int = 0,
    ) -> None:
        if settings.num_threads > 0:
            torch.set_num_threads(settings.num_threads)
        self.settings = settings
        self.partition_id = partition_id
        self.num_partitions = num_partitions
        self.device = settings.torch_device()
        self.model = model.to(self.device)
        self.train_x = to_tensor(data.train_x, self.device)
        self.train_y = torch.as_tensor(data.train_y, device=self.device)
        self.test_x = to_tensor(data.test_x, self.device)
        self.test_y = torch.as_tensor(data.test_y, device=self.device)

    # ----------------------------------------------------------------- parameters

    def get_properties(self, config: dict) -> dict:
        """Partition and sizes; with a fit config, also check it suits this client's data."""
        self.check_settings(self.settings.updated(config))
        return {
            PARTITION_ID: self.partition_id,
            NUM_PARTITIONS: self.num_partitions,
            "num-train": len(self.train_y),
            "num-test": len(self.test_y),
        }

    def check_settings(self, settings: ClientSettings) -> None:
        """Raise ``ValueError`` if ``settings`` cannot work on this client's data (base: all can)."""

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        # copies: the caller must not see later in-place training through shared memory
        return [value.detach().cpu().numpy().copy() for value in self.model.state_dict().values()]

    def set_parameters(self, parameters: list[np.ndarray]) -> None:
        keys = list(self.model.state_dict().keys())
        if len(keys) != len(parameters):
            raise ValueError(f"expected {len(keys)} arrays, received {len(parameters)}")
        state = OrderedDict((k, torch.as_tensor(np.asarray(v))) for k, v in zip(keys, parameters, strict=True))
        self.model.load_state_dict(state, strict=True)

    # ------------------------------------------------------------------- training

    def local_train(self, settings: ClientSettings, rng: np.random.Generator) -> TrainReport:
        """One round of local work; the base class runs plain SGD (FedAvg)."""
        num = len(self.train_y)
        steps = steps_for(num, settings.batch_size, settings.local_steps, settings.local_epochs)
        return sgd_steps(
            self.model, self.train_x, self.train_y, batch_indices(num, settings.batch_size, steps, rng), settings.lr
        )

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        self.set_parameters(parameters)
        settings = self.settings.updated(config)
        self.check_settings(settings)
        rng = round_generator(settings.seed, self.partition_id, int(config.get("server-round", 0)), "fit")
        report = self.local_train(settings, rng)
        metrics = {
            TRAIN_LOSS: report.mean_loss,
            LOCAL_STEPS: report.steps,
            GRAD_EVALS: report.grad_evals,
            HVP_EVALS: report.hvp_evals,
            SAMPLE_GRADS: report.sample_grads,
            PARTITION_ID: self.partition_id,
            **report.extra,
        }
        return self.get_parameters({}), len(self.train_y), metrics

    # ----------------------------------------------------------------- evaluation

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Personalised evaluation: adapt a copy on own training data, test on own test split."""
        self.set_parameters(parameters)
        settings = self.settings.updated(config)
        rng = round_generator(settings.seed, self.partition_id, int(config.get("server-round", 0)), "evaluate")
        result = personalised_evaluation(
            self.model,
            (self.train_x, self.train_y),
            (self.test_x, self.test_y),
            adapt_steps=settings.adapt_steps,
            adapt_lr=settings.adaptation_lr(),
            adapt_batch_size=settings.adapt_batch_size,
            rng=rng,
        )
        metrics = {GLOBAL_LOSS: result.global_loss, GRAD_EVALS: result.grad_evals, PARTITION_ID: self.partition_id}
        if not self.test_y.is_floating_point():  # classifiers; least squares has losses only
            metrics |= {ACCURACY: result.accuracy, GLOBAL_ACCURACY: result.global_accuracy}
        return result.loss, len(self.test_y), metrics
