"""``Settings``: a whole run's settings, typed: the shared groups, the model's card and the method's own."""

from __future__ import annotations

from dataclasses import dataclass, field

from datasets import GENERATED, USER_DATASETS, DataSpec, PartitionSpec, parse_classes, parse_shape
from strategies.contracts.common import DataSettings, ExecutionSettings, FleetSettings, RunSettings, TrainingSettings
from strategies.contracts.contract import MethodSettings
from strategies.contracts.models import ModelCard


@dataclass(frozen=True, kw_only=True)
class Settings:
    """A whole run's settings: the five shared groups, the chosen model's card and the chosen method's own.

    Each group checks its own keys as it is built; the rules between groups (a model
    that needs images on generated data, a BatchNorm model with batches of one, say) and
    the method's own rules against the shared keys are ``app/config/rules.py``'s, which
    :func:`app.config.parse_settings` runs on the settings it builds.
    """

    run: RunSettings
    data: DataSettings
    training: TrainingSettings
    execution: ExecutionSettings
    method: MethodSettings
    model_card: ModelCard  # the traits of ``training.model``, from the model registry
    tuner: MethodSettings | None = None  # the tuner's own settings (fathom-*), when ``tune`` names one
    fleet: FleetSettings = field(default_factory=FleetSettings)  # the pace of the rounds and the simulated fleet

    def __post_init__(self) -> None:
        if self.model_card.name != self.training.model:
            raise ValueError(f"Settings: model card {self.model_card.name!r} for model {self.training.model!r}")

    def as_run_config(self) -> dict[str, object]:
        """Every key of the shared groups and of the method, with its value (for summaries and checkpoints)."""
        out: dict[str, object] = {}
        for group in (self.run, self.data, self.training, self.execution, self.fleet, self.method, self.tuner):
            if group is not None:
                out.update(group.values())
        return out

    def data_spec(self, num_partitions: int = 0) -> DataSpec:
        """What the datasets package needs to load the source (generated data: one user per partition)."""
        data = self.data
        return DataSpec(name=data.dataset, data_dir=data.data_dir, download=data.download,
                        emnist_split=data.emnist_split, synthetic_alpha=data.synthetic_alpha,
                        synthetic_beta=data.synthetic_beta, seed=self.run.seed,
                        num_users=num_partitions if data.dataset in GENERATED else 0,
                        classes=parse_classes(data.classes) if data.dataset in USER_DATASETS else (),
                        input_shape=parse_shape(data.input_shape) if data.dataset in USER_DATASETS else ())  # fmt: skip

    def partition_spec(self, num_partitions: int) -> PartitionSpec:
        """How the source is split for ``num_partitions`` clients."""
        data = self.data
        return PartitionSpec(name=data.partitioner, num_clients=num_partitions, seed=self.run.seed,
                             images_per_class=data.images_per_class, paper_variant=data.paper_variant,
                             concentration=data.dirichlet_concentration, classes_per_client=data.classes_per_client,
                             test_fraction=data.test_fraction, feature_shift=data.feature_shift)  # fmt: skip
