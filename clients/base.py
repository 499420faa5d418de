"""The shared torch ``NumPyClient``: parameters in and out, the round's settings, personalised evaluation."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from logging import WARNING
from typing import ClassVar

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.common.logger import log
from torch import Tensor, nn

from clients.batches import batch_problem, to_tensor
from clients.evaluation import PersonalisedResult, accuracy_and_loss, personalised_evaluation
from clients.models import layout_of
from clients.node_report import node_properties
from clients.replies import evaluation_metrics, fit_metrics, unpacked
from clients.runtime import round_generator, torch_device
from clients.state import ClientState
from clients.training import Alignment, Step, TrainReport, local_sgd, watching
from datasets import ClientData
from strategies.contracts.client_reports import PARTITION_ID
from strategies.contracts.common import TrainingSettings
from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.fathom import PHI
from strategies.contracts.fedavg import CONTRACT as FEDAVG
from strategies.contracts.payload import MODEL, pack
from strategies.contracts.settings import Settings

PERSONAL_LAYERS = "personal-layers"  # the name under which a client keeps its personal arrays in Context.state


class TorchClient(NumPyClient):
    """A client holding one torch model and its own train/test arrays.

    A method's client sets ``contract`` and overrides :meth:`local_train` (and
    :meth:`check` to refuse, before any work, settings its data cannot serve;
    :meth:`personal_model` to be tested on a model of its own). Everything else is
    shared: parameter exchange (the model, and the array sets the contract declares,
    unpacked by name into :attr:`received` and packed from the report's ``arrays``), a
    method's personal arrays (kept in ``Context.state``, merged into the model before
    training and evaluation, never sent), the round's settings (the run's, updated with
    what the server sent in the fit or evaluate config under the same key names), the
    reply's metrics and the personalised evaluation.

    Parameters
    ----------
    model
        The network; its weights are replaced by the server's in every message.
    data
        This client's arrays.
    settings
        The run's settings; ``settings.method`` is this client's method's.
    partition_id, num_partitions
        This client's partition and how many there are (``get_properties`` reports
        them; 0 partitions = not known). A device with its own data may have none
        (-1): the server numbers it and sends the number in every fit and evaluate config.
    data_dir
        The device's own data folder, if it has one (reported, and named in its errors).
    state
        What outlives a message (``context.state``); a fresh one by default.

    """

    contract: ClassVar[Contract] = FEDAVG

    def __init__(
        self,
        *,
        model: nn.Module,
        data: ClientData,
        settings: Settings,
        partition_id: int,
        num_partitions: int = 0,
        data_dir: str = "",
        state: ClientState | None = None,
        reload: Callable[[int], ClientData] | None = None,
    ) -> None:
        if not isinstance(settings.method, self.contract.settings):
            raise TypeError(f"{type(self).__name__} needs {self.contract.settings.__name__}, "
                            f"got {type(settings.method).__name__}")  # fmt: skip
        if settings.execution.num_threads > 0:
            torch.set_num_threads(settings.execution.num_threads)
        self.training = settings.training
        self.method = settings.method
        self.normalisation = settings.data.normalisation()
        self.seed = settings.run.seed
        self.tuned = settings.run.tune != "none"
        self.alignment: Alignment | None = None  # a tuned run's phi over this round's steps
        self.partition_id = partition_id
        self.num_partitions = num_partitions
        self.data_dir = data_dir
        self.state = state if state is not None else ClientState(owner=self.contract.name)
        self.device = torch_device(settings.execution.device)
        self.model = model.to(self.device)
        self.model_card = settings.model_card
        self.layout = layout_of(self.model)
        names = list(self.layout.names)
        personal = set(self.contract.personal_arrays(self.method, self.layout))
        self.shared_names = [name for name in names if name not in personal]  # what travels
        self.personal_names = [name for name in names if name in personal]  # what stays here, in Context.state
        self.received: dict[str, list[np.ndarray]] = {}  # the array sets the server sent beside the model
        self.reload = reload
        self.use_data(data)

    def use_data(self, data: ClientData) -> None:
        """Hold ``data``'s arrays, on this client's device (and ``data`` itself, for its fingerprint)."""
        self.data = data
        self.train_x = to_tensor(data.train_x, self.device, self.normalisation)
        self.train_y = torch.as_tensor(data.train_y, device=self.device)
        self._test_x: Tensor | None = None
        self.test_y = torch.as_tensor(data.test_y, device=self.device)

    @property
    def test_x(self) -> Tensor:
        """The test inputs on this client's device, normalised when first read.

        A client is built for every message and a fit message never reads them: scaling a
        quarter of the data for nothing cost a CIFAR-10 client about 3 ms a message.
        """
        if self._test_x is None:
            self._test_x = to_tensor(self.data.test_x, self.device, self.normalisation)
        return self._test_x

    # ------------------------------------------------------------------ hooks

    def local_train(self, training: TrainingSettings, method: MethodSettings, rng: np.random.Generator) -> TrainReport:
        """One round of local work from the model the server sent (in ``self.model``)."""
        raise NotImplementedError(f"{type(self).__name__} must define local_train")

    def personal_model(self, training: TrainingSettings, method: MethodSettings) -> list[np.ndarray] | None:
        """Every array of the model this client tests as its own, as it is; ``None`` tests the model received.

        The model received (in ``self.model``, personal arrays merged) is adapted as the
        evaluate config says and tested; a method that keeps a model of its own (Ditto's
        ``v_k``) returns it here and it is tested without adaptation, beside the received one.
        """
        return None

    def batch_sizes(self, training: TrainingSettings, method: MethodSettings) -> dict[str, int]:
        """The round's batch sizes by key (base: ``batch-size``, when the method reads it)."""
        return {"batch-size": training.batch_size} if "batch-size" in self.contract.uses else {}

    def check(self, training: TrainingSettings, method: MethodSettings) -> None:
        """Raise ``ValueError`` if the round's settings cannot work on this client's data.

        The base refuses what :func:`clients.batches.batch_problem` names (an empty training
        set, a batch the model cannot train on). A method that adds rules calls this first.
        """
        where = f" in {self.data_dir}" if self.data_dir else ""
        sizes = self.batch_sizes(training, method)
        if problem := batch_problem(len(self.train_y), sizes, training, self.model_card, where=where):
            raise ValueError(problem)

    def local_sgd(self, training: TrainingSettings, rng: np.random.Generator, **options: object) -> TrainReport:
        """SGD on this client's training data: ``lr``, ``batch-size`` and ``local-steps`` or ``local-epochs``.

        ``options`` change the step size (``lr``), the steps, the batch size, add a loss
        term (``extra_loss``, ``batch_term``), watch every step (``on_step``) or train only
        some parameters (``trainable``): :func:`clients.training.local_sgd`.
        """
        options["on_step"] = self.watched(options.get("on_step"))
        return local_sgd(self.model, self.train_x, self.train_y, training, rng, **options)

    def watched(self, on_step: Callable[[Step], None] | None = None) -> Callable[[Step], None] | None:
        """``on_step``, and in a tuned run also the round's :class:`Alignment`; pass it to ``train_steps``."""
        return watching(self.alignment, on_step)

    def settings_for(self, config: dict) -> tuple[TrainingSettings, MethodSettings]:
        """The run's settings, updated with the values the server sent under the same keys."""
        return self.training.updated(config), self.method.updated(config)

    # ------------------------------------------------------------- NumPyClient

    def get_properties(self, config: dict) -> dict:
        """The preflight's answer: partition, sizes, data and code; with a fit config, whether it suits this data.

        A config this client cannot serve is reported as data (``preflight-error``), not
        raised (:func:`clients.node_report.node_properties`).
        """
        return node_properties(self, config)

    def get_parameters(self, config: dict) -> list[np.ndarray]:
        # copies: the caller must not see later in-place training through shared memory
        return [value.detach().cpu().numpy().copy() for value in self.model.state_dict().values()]

    def set_parameters(self, parameters: list[np.ndarray]) -> None:
        keys = list(self.model.state_dict().keys())
        if len(keys) != len(parameters):
            raise ValueError(f"expected {len(keys)} arrays, received {len(parameters)}")
        state = OrderedDict((k, torch.as_tensor(np.asarray(v))) for k, v in zip(keys, parameters, strict=True))
        self.model.load_state_dict(state, strict=True)

    def shared_arrays(self) -> list[np.ndarray]:
        """Copies of the model's arrays that travel (all of them, unless the method keeps personal ones)."""
        values = self.model.state_dict()
        return [values[name].detach().cpu().numpy().copy() for name in self.shared_names]

    def receive(self, parameters: list[np.ndarray], config: dict, purpose: str) -> None:
        """Take a ``purpose`` message's arrays: the model into ``self.model``, the other sets into ``received``.

        The model's personal arrays come from ``Context.state`` (their initial values,
        the first time); the message carries only the shared ones.

        Raises
        ------
        ValueError
            If the arrays do not match their layout, or the sets are not those the contract sends.

        """
        model, sets = unpacked(parameters, config, purpose, contract=self.contract, model_size=len(self.shared_names))
        state = OrderedDict((k, torch.as_tensor(np.asarray(v))) for k, v in zip(self.shared_names, model, strict=True))
        if self.personal_names:
            kept = self.state.arrays(PERSONAL_LAYERS)
            current = self.model.state_dict()
            personal = kept or [current[name].detach().cpu().numpy() for name in self.personal_names]
            state.update((k, torch.as_tensor(np.asarray(v))) for k, v in zip(self.personal_names, personal,
                                                                              strict=True))  # fmt: skip
        self.model.load_state_dict(state, strict=True)
        self.received = sets

    def keep_personal(self) -> None:
        """Store the model's personal arrays in ``Context.state`` for the next message (none: nothing to do)."""
        if self.personal_names:
            values = self.model.state_dict()
            personal = [values[name].detach().cpu().numpy().copy() for name in self.personal_names]
            self.state.set_arrays(PERSONAL_LAYERS, personal)

    def take_partition(self, config: dict) -> None:
        """Take the partition number the server sends (a device with its own data learns its number so).

        A client that can load any partition (``reload``: a simulated node after a sampled
        preflight, where the server numbers the nodes) serves the one it is sent.
        """
        if PARTITION_ID not in config:
            return
        partition = int(config[PARTITION_ID])
        if partition != self.partition_id and self.reload is not None:
            self.use_data(self.reload(partition))
        self.partition_id = partition

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        self.receive(parameters, config, "fit")
        self.take_partition(config)
        training, method = self.settings_for(config)
        self.check(training, method)
        small = any(size > len(self.train_y) for size in self.batch_sizes(training, method).values())
        rng = round_generator(self.seed, self.partition_id, int(config.get("server-round", 0)), "fit")
        self.alignment = Alignment() if self.tuned else None
        kept = self.state.snapshot()
        report = self.local_train(training, method, rng)
        if self.alignment is not None:  # a tuned run: FATHOM's local signal, and the step size in force
            report.extra.setdefault(PHI, self.alignment.phi)
        self.keep_personal()
        declared = self.contract.returned_sets()
        if set(report.arrays) != set(declared):
            raise RuntimeError(f"{type(self).__name__}.local_train returned array sets {sorted(report.arrays)}; "
                               f"{self.contract.name}'s contract returns {list(declared)}")  # fmt: skip
        arrays, layout = pack({MODEL: self.shared_arrays(), **{name: report.arrays[name] for name in declared}})
        if self.state.non_finite or not all(np.all(np.isfinite(a)) for a in arrays):
            # the server rejects this reply; what the client keeps stays as it was before the round
            log(WARNING, "partition %s: round %s gave non-finite values; %s kept unchanged", self.partition_id,
                config.get("server-round"), ", ".join(self.state.non_finite) or "what this client keeps")  # fmt: skip
            self.state.restore(kept)
        return arrays, len(self.train_y), fit_metrics(report, partition_id=self.partition_id, small_batch=small,
                                                      layout=layout)  # fmt: skip

    def evaluate(self, parameters: list[np.ndarray], config: dict) -> tuple[float, int, dict]:
        """Personalised evaluation: adapt a copy on own training data, test on own test split.

        A method whose client keeps a model of its own (:meth:`personal_model`) tests that
        one, as it is, beside the model received.
        """
        self.receive(parameters, config, "evaluate")
        self.take_partition(config)
        training, method = self.settings_for(config)
        own = self.personal_model(training, method)
        if own is not None:
            global_accuracy, global_loss = accuracy_and_loss(self.model, self.test_x, self.test_y)
            self.set_parameters(own)
            accuracy, loss = accuracy_and_loss(self.model, self.test_x, self.test_y)
            return self.evaluation_reply(PersonalisedResult(accuracy, loss, global_accuracy, global_loss, 0))
        rng = round_generator(self.seed, self.partition_id, int(config.get("server-round", 0)), "evaluate")
        result = personalised_evaluation(
            self.model, (self.train_x, self.train_y), (self.test_x, self.test_y), adapt_steps=training.adapt_steps,
            adapt_lr=training.adapt_lr, adapt_batch_size=training.adapt_batch_size, rng=rng,
        )  # fmt: skip
        return self.evaluation_reply(result)

    def evaluation_reply(self, result: PersonalisedResult) -> tuple[float, int, dict]:
        """``evaluate``'s reply: the personalised loss, the test examples and the shared evaluation metrics.

        A client with personal arrays has no global model to test: its reply carries no ``global-*``.
        """
        metrics = evaluation_metrics(result, partition_id=self.partition_id, global_model=not self.personal_names,
                                     classifier=not self.test_y.is_floating_point())  # fmt: skip
        return result.loss, len(self.test_y), metrics
