"""What a method promises: its keys, the shared keys its clients read, and the metrics they report.

A method's contract is the one module both its strategy and its client import. It
holds no Flower and no torch, so the ClientApp can read it without the server's
code, and the server without torch's training code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from strategies.contracts.keys import INF, KeyedSettings

if TYPE_CHECKING:
    from strategies.contracts.common import Settings


@dataclass(frozen=True)
class Metric:
    """A scalar that clients report, and what the server accepts for it.

    Attributes
    ----------
    name
        The metric key (kebab-case).
    doc
        One line: what it measures.
    low, high
        The closed range a reply's value must lie in; a value outside it, or not
        finite, gets the whole reply rejected.
    required
        A fit reply without this metric is rejected.
    total
        The round record key that holds the sum over the round's accepted replies
        (``""``: not summed).

    """

    name: str
    doc: str
    low: float = -INF
    high: float = INF
    required: bool = False
    total: str = ""

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not acceptable for this metric, or ``None``."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            return f"metric {self.name!r} = {value!r} is not a number"
        if number != number or number in (INF, -INF):
            return f"metric {self.name!r} is non-finite ({value})"
        if not self.low <= number <= self.high:
            low = "-inf" if self.low == -INF else f"{self.low:g}"
            return f"metric {self.name!r} = {value} is outside [{low}, {self.high:g}]"
        return None


@dataclass(frozen=True, kw_only=True)
class MethodSettings(KeyedSettings):
    """Base of a method's own settings: every key carries the method's name as its prefix."""

    def check_in(self, settings: Settings) -> None:
        """Rules between this method's keys and the shared ones (``settings.training`` ...); raise ``ConfigError``."""

    def check_on_server(self) -> None:
        """Checks only the server can make, before any client works (files it alone reads); raise ``ConfigError``."""


@dataclass(frozen=True, kw_only=True)
class Tunable:
    """What a method's settings mean to an online tuner (``tune = "fathom"``).

    Attributes
    ----------
    step
        The run-config key of its local step size (``lr``, ``perfedavg-beta``).
    other_steps
        Other keys ``fathom-step`` may name instead (Per-FedAvg's ``perfedavg-alpha``).
    work
        The keys of its amount of local work, in order of preference: the first one set
        above 0 is tuned (``local-epochs`` when it is > 0, else ``local-steps``).
    batch
        The key of its batch size.

    """

    step: str
    work: tuple[str, ...]
    batch: str = "batch-size"
    other_steps: tuple[str, ...] = ()

    def keys(self, values: Mapping[str, object]) -> dict[str, str]:
        """Dimension (``step``, ``work``, ``batch``) -> the key it moves, for a run whose settings are ``values``."""
        work = next((k for k in self.work if float(values[k]) > 0), self.work[-1])
        return {"step": str(values.get("fathom-step") or self.step), "work": work, "batch": self.batch}


@dataclass(frozen=True, kw_only=True)
class Contract:
    """A federated method as both its strategy and its client see it.

    Attributes
    ----------
    name
        The method's name: the value of the ``strategy`` key and the prefix of its own keys.
    summary
        One line for the table of methods.
    settings
        Its own settings class (keys ``<name>-...``).
    uses
        The shared training keys its clients read (``lr``, ``local-steps``, ...); they go
        to the clients in every fit config, with the method's own keys that are not
        server-only.
    metrics
        What its clients report from ``fit`` besides the shared metrics.
    example
        Run-config values that show the method at work on the embedded data (docs and
        the smoke test run it).
    tunable
        Which of its settings an online tuner may move; ``None``: it cannot be tuned.
    step_sizes
        Its step-size keys, named when a run diverges; by default the tunable ones, else ``lr``.

    """

    name: str
    summary: str
    settings: type[MethodSettings]
    uses: tuple[str, ...]
    metrics: tuple[Metric, ...] = ()
    example: Mapping[str, object] = field(default_factory=dict)
    tunable: Tunable | None = None
    step_sizes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.settings.prefix != self.name:
            raise ValueError(f"{self.settings.__name__}.prefix is {self.settings.prefix!r}, not {self.name!r}")

    def step_keys(self) -> tuple[str, ...]:
        """The run-config keys of its step sizes: the likeliest cause of a run that diverges."""
        if self.step_sizes:
            return self.step_sizes
        if self.tunable is not None:
            return (self.tunable.step, *self.tunable.other_steps)
        return ("lr",) if "lr" in self.uses else ()

    def broadcast_keys(self) -> tuple[str, ...]:
        """The method's own keys its clients read (every key that is not server-only)."""
        return tuple(spec.name for spec in self.settings.key_specs() if not spec.server_only)
