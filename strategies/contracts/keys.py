"""Run-config keys, declared once as fields of frozen settings dataclasses (no Flower, no torch).

A settings class lists its keys as dataclass fields made with :func:`key`: the field's
type and default are the key's, and :func:`key` adds the allowed values and a one-line
doc. The run-config name of a field is its name in kebab-case, after the class's
``prefix`` (``prefix = "fedprox"`` and field ``mu`` give ``fedprox-mu``). Building an
instance checks every value, so settings that exist are valid settings, whether they
came from a run config, a fit config or a test.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, TypeVar

INF = math.inf
_METADATA = "stamen-key"
_KINDS = {"bool": bool, "int": int, "float": float, "str": str}
_KIND_NAMES = {bool: "a boolean (true or false)", int: "an integer", float: "a number", str: "a string"}
_S = TypeVar("_S", bound="KeyedSettings")


class ConfigError(ValueError):
    """A run-config value that cannot be used; the message names the key and what is allowed."""


@dataclass(frozen=True)
class _Allowed:
    doc: str
    choices: tuple[str, ...]
    low: float | int
    high: float | int
    low_open: bool
    high_open: bool
    server_only: bool


def key(
    default: bool | int | float | str,
    doc: str,
    *,
    choices: tuple[str, ...] = (),
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    server_only: bool = False,
) -> Any:
    """A settings field that is a run-config key.

    Parameters
    ----------
    default
        The key's default; its type is the field's annotation (``bool``, ``int``,
        ``float`` or ``str``).
    doc
        One line: what the key does (the configuration reference shows it).
    choices
        The allowed values of a ``str`` key.
    at_least, above, at_most, below
        The allowed range of a number (at most one bound per side).
    server_only
        Only the server reads it (a graph file, a hyper-step): never broadcast to clients.

    """
    if at_least is not None and above is not None or at_most is not None and below is not None:
        raise ValueError("give one lower and one upper bound at most")
    allowed = _Allowed(
        doc=doc,
        choices=tuple(choices),
        low=-INF if at_least is None and above is None else (at_least if at_least is not None else above),
        high=INF if at_most is None and below is None else (at_most if at_most is not None else below),
        low_open=at_least is None,
        high_open=at_most is None,
        server_only=server_only,
    )
    return dataclasses.field(default=default, metadata={_METADATA: allowed})


@dataclass(frozen=True)
class KeySpec:
    """One run-config key: its name, the field holding it, type, default, allowed values and doc."""

    name: str
    field: str
    kind: type
    default: bool | int | float | str
    doc: str
    choices: tuple[str, ...] = ()
    low: float = -INF
    high: float = INF
    low_open: bool = True
    high_open: bool = True
    server_only: bool = False

    def allowed(self) -> str:
        """The allowed values as text: ``one of [...]``, a range such as ``(0, 1]``, or the type."""
        if self.choices:
            return f"one of {list(self.choices)}"
        if self.low == -INF and self.high == INF:
            return f"any {self.kind.__name__}"
        opening, closing = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{opening}{_number(self.low)}, {_number(self.high)}{closing}"

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not allowed for this key, or ``None``."""
        if type(value) is not self.kind:
            return f"{value!r} is not {_KIND_NAMES[self.kind]}"
        if self.choices and value not in self.choices:
            return f"{value!r} is not allowed; choose one of {list(self.choices)}"
        if self.kind in (int, float):
            too_low = value < self.low or (self.low_open and value == self.low)
            too_high = value > self.high or (self.high_open and value == self.high)
            if too_low or too_high or (self.kind is float and math.isnan(value)):
                return f"{value!r} is outside {self.allowed()}"
        return None

    def coerce(self, value: object, *, lenient: bool = False) -> object:
        """``value`` as this key's type, refusing lossy conversions.

        TOML gives ``4.0`` for an int key and ``1`` for a float key: both are taken. A
        real for an int key is refused, unless ``lenient`` (a fit config, where a
        strategy may broadcast a real batch size): then it takes the nearest integer
        (Python's ``round``, halves to even).
        """
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if self.kind is int and isinstance(value, float):
            if value.is_integer():
                return int(value)
            if lenient and math.isfinite(value):
                return int(round(value))
        if type(value) is self.kind:
            return value
        raise ConfigError(f"run config key {self.name!r}: {value!r} is not {_KIND_NAMES[self.kind]}")


def _number(value: float | int) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def key_name(prefix: str, field_name: str) -> str:
    """The run-config key of a field (``mu`` of ``fedprox`` is ``fedprox-mu``; ``local_steps`` is ``local-steps``).

    A trailing underscore is dropped, for fields named like a Python keyword (``lambda_``).
    """
    name = field_name.rstrip("_").replace("_", "-")
    return f"{prefix}-{name}" if prefix else name


@dataclass(frozen=True, kw_only=True)
class KeyedSettings:
    """Base of every settings class whose fields are run-config keys (see the module doc).

    Subclasses declare fields with :func:`key`, set ``prefix`` for a method's keys, and
    may override :meth:`check` for rules that involve several of their keys.
    """

    prefix: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for spec in self.key_specs():
            if spec.kind is float and type(getattr(self, spec.field)) is int:  # lr=1 in Python means 1.0
                object.__setattr__(self, spec.field, float(getattr(self, spec.field)))
            problem = spec.problem(getattr(self, spec.field))
            if problem:
                raise ConfigError(f"run config key {spec.name!r}: {problem}")
        self.check()

    def check(self) -> None:
        """Rules between this class's own keys; raise :class:`ConfigError` naming the key."""

    @classmethod
    def key_specs(cls) -> tuple[KeySpec, ...]:
        """Every key this class declares, in field order."""
        return _key_specs(cls)

    def values(self) -> dict[str, object]:
        """``{run-config key: value}`` for every key of this class."""
        return {spec.name: getattr(self, spec.field) for spec in self.key_specs()}

    @classmethod
    def from_config(cls: type[_S], config: Mapping[str, object]) -> _S:
        """The settings a run config names, strictly typed (other keys are ignored; missing ones take defaults)."""
        return cls(**_field_values(cls, config, lenient=False))

    def updated(self: _S, config: Mapping[str, object]) -> _S:
        """A copy with the values of the keys a fit or evaluate config holds (a real for an int key is rounded)."""
        changes = _field_values(type(self), config, lenient=True)
        return dataclasses.replace(self, **changes) if changes else self


def _field_values(cls: type[KeyedSettings], config: Mapping[str, object], *, lenient: bool) -> dict[str, object]:
    """``{field: value}`` for the keys of ``cls`` that ``config`` holds, coerced to their types."""
    return {spec.field: spec.coerce(config[spec.name], lenient=lenient)
            for spec in cls.key_specs() if spec.name in config}  # fmt: skip


@cache
def _key_specs(cls: type[KeyedSettings]) -> tuple[KeySpec, ...]:
    specs = []
    for field in dataclasses.fields(cls):
        allowed = field.metadata.get(_METADATA)
        if allowed is None:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with key(...)")
        kind = _KINDS[field.type] if isinstance(field.type, str) else field.type
        specs.append(KeySpec(
            name=key_name(cls.prefix, field.name), field=field.name, kind=kind, default=field.default,
            doc=allowed.doc, choices=allowed.choices, low=allowed.low, high=allowed.high,
            low_open=allowed.low_open, high_open=allowed.high_open, server_only=allowed.server_only,
        ))  # fmt: skip
    return tuple(specs)
