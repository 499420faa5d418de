"""Which of a model's arrays stay on the client: a method's personal layers, chosen by a rule over their names.

FedPer and FedRep share a model's body and keep its head at home. A contract names the
rule (:class:`LastLayers`: the last ``k`` layers, ``k`` read from one of the method's
keys); the base strategy then sends and averages only the other arrays, and the base
client keeps the personal ones in its ``Context.state``. The rule works on the names a
model's ``state_dict`` gives its arrays (``layers.4.weight``), so both sides, and the
settings check before a run starts, reach the same split without Flower or torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strategies.contracts.keys import ConfigError


def layers_of(names: Sequence[str]) -> dict[str, list[str]]:
    """The model's layers in order: the module that owns each array (``layers.4`` for ``layers.4.weight``)."""
    layers: dict[str, list[str]] = {}
    for name in names:
        layers.setdefault(name.rpartition(".")[0], []).append(name)
    return layers


class PersonalArrays:
    """A rule that picks a model's personal arrays; subclass it for another rule (FedBN's norm layers, say)."""

    def select(self, values: Mapping[str, object], names: Sequence[str]) -> tuple[str, ...]:
        """The personal arrays among ``names`` for a run whose method keys are ``values``.

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

    def select(self, values: Mapping[str, object], names: Sequence[str]) -> tuple[str, ...]:
        count, layers = int(values[self.key]), layers_of(names)
        if not 1 <= count < len(layers):
            raise ConfigError(f"run config key {self.key!r}: {count} is outside [1, {len(layers) - 1}] for this model, "
                              f"whose layers are {list(layers)} (at least one layer must be shared)")  # fmt: skip
        return tuple(name for layer in list(layers)[-count:] for name in layers[layer])

    def describe(self, values: Mapping[str, object]) -> str:
        return f"the model's last {values[self.key]} layer(s) ({self.key})"
