"""Which of a model's arrays stay on the client: a method's personal layers, chosen by a rule.

FedPer and FedRep share a model's body and keep its head at home; FedBN keeps its
BatchNorm layers. A contract names the rule: :class:`LastLayers` (the last ``k`` layers,
``k`` read from one of the method's keys, by name), :class:`Head` (the head of the
model's own split into a representation and a head) or :class:`NormLayers` (every
array of the layers of one kind: BatchNorm's weights, biases and running statistics).
The base strategy then sends and averages only the other arrays, and the base client
keeps the personal ones in its ``Context.state``. A rule reads the built model's
:class:`~strategies.contracts.models.ModelLayout` (names, the kind of layer owning each
array, the head), so both sides, and the settings check before a run starts, reach the
same split without Flower or torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strategies.contracts.keys import ConfigError
from strategies.contracts.models import BATCH_NORM, GROUP_NORM, ModelLayout


def layers_of(names: Sequence[str]) -> dict[str, list[str]]:
    """The model's layers in order: the module that owns each array (``layers.4`` for ``layers.4.weight``)."""
    layers: dict[str, list[str]] = {}
    for name in names:
        layers.setdefault(name.rpartition(".")[0], []).append(name)
    return layers


class PersonalArrays:
    """A rule that picks a model's personal arrays; subclass it for another rule."""

    def select(self, values: Mapping[str, object], layout: ModelLayout) -> tuple[str, ...]:
        """The personal arrays of the model ``layout`` describes, for a run whose method keys are ``values``.

        Raises
        ------
        ConfigError
            If the rule cannot apply to this model, naming the key and what is allowed.

        """
        raise NotImplementedError

    def describe(self, values: Mapping[str, object]) -> str:
        """The rule in words, for errors and docs ("the last 1 layer(s)")."""
        raise NotImplementedError


@dataclass(frozen=True)
class LastLayers(PersonalArrays):
    """The model's last ``k`` layers are personal (its head), ``k`` being the value of ``key``.

    At least one layer must stay shared, or nothing would be averaged.
    """

    key: str

    def select(self, values: Mapping[str, object], layout: ModelLayout) -> tuple[str, ...]:
        count, layers = int(values[self.key]), layers_of(layout.names)
        if not 1 <= count < len(layers):
            raise ConfigError(f"run config key {self.key!r}: {count} is outside [1, {len(layers) - 1}] for this model, "
                              f"whose layers are {list(layers)} (at least one layer must be shared)")  # fmt: skip
        return tuple(name for layer in list(layers)[-count:] for name in layers[layer])

    def describe(self, values: Mapping[str, object]) -> str:
        return f"the model's last {values[self.key]} layer(s) ({self.key})"


def everything_shared(layout: ModelLayout, personal: Sequence[str], what: str) -> None:
    """Refuse a rule that keeps every array at home: nothing would be averaged."""
    if len(personal) == len(layout.names):
        raise ConfigError(f"{what} is the whole model; at least one layer must be shared")


@dataclass(frozen=True)
class Head(PersonalArrays):
    """The head of the model's own split (``features`` / ``classify``: its classifier) is personal."""

    def select(self, values: Mapping[str, object], layout: ModelLayout) -> tuple[str, ...]:
        if not layout.head:
            raise ConfigError("run config key 'model': this model declares no head (a representation / head split: "
                              "docs/adding-a-model.md), which this method keeps on the clients")  # fmt: skip
        everything_shared(layout, layout.head, "the model's head")
        return tuple(name for name in layout.names if name in layout.head)

    def describe(self, values: Mapping[str, object]) -> str:
        return "the model's head (its classifier)"


@dataclass(frozen=True)
class NormLayers(PersonalArrays):
    """Every array of the layers of ``kind`` is personal: FedBN's BatchNorm weights, biases and running statistics.

    A model without such layers is refused, naming ``model``: the method would be
    FedAvg under another name.
    """

    kind: str = BATCH_NORM

    def __post_init__(self) -> None:
        if self.kind not in (BATCH_NORM, GROUP_NORM):
            raise ValueError(f"NormLayers: kind {self.kind!r} is not one of {[BATCH_NORM, GROUP_NORM]}")

    def select(self, values: Mapping[str, object], layout: ModelLayout) -> tuple[str, ...]:
        chosen = layout.of_kind(self.kind)
        if not chosen:
            raise ConfigError(f"run config key 'model': the model has no {self.kind} layers, which this method keeps "
                              "on the clients (choose a model with them: docs/models.md)")  # fmt: skip
        everything_shared(layout, chosen, f"its {self.kind} layers")
        return chosen

    def describe(self, values: Mapping[str, object]) -> str:
        return f"the model's {self.kind} layers (weights, biases and running statistics)"


@dataclass(frozen=True)
class WholeModel(PersonalArrays):
    """Every array is personal: **no model travels** (FedProto: only class prototypes do).

    Each client keeps its whole model in its ``Context.state``; the messages carry only the
    array sets the contract declares. The base strategy then has no update to screen or
    average, and the run config refuses what needs a server-side model: ``central-eval``,
    ``max-update-ratio``, ``checkpoint-every`` and ``resume-from`` (a checkpoint could not
    hold the clients' models).
    """

    def select(self, values: Mapping[str, object], layout: ModelLayout) -> tuple[str, ...]:
        return tuple(layout.names)

    def describe(self, values: Mapping[str, object]) -> str:
        return "the whole model (no model travels)"
