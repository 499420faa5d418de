"""What a method promises: its keys, the shared keys its clients read, and the metrics they report.

A method's contract is the one module both its strategy and its client import. It
holds no Flower and no torch, so the ClientApp can read it without the server's
code, and the server without torch's training code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from strategies.contracts.keys import INF, KeyedSettings
from strategies.contracts.models import ModelLayout
from strategies.contracts.payload import ArraySet
from strategies.contracts.personal import PersonalArrays

if TYPE_CHECKING:
    from strategies.contracts.settings import Settings


SUMMARIES = ("mean", "sum", "min", "max")


@dataclass(frozen=True)
class Metric:
    """A scalar that clients report, what the server accepts for it, and how a round's record summarises it.

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
    summary
        The statistics of the round's accepted replies its record keeps, among
        ``mean`` (weighted by the replies' example counts), ``sum``, ``min`` and ``max``;
        ``()`` keeps none (a metric that only identifies the reply). A sum of integers
        stays an integer; anything else is a float, never truncated.
    record_as
        The record key (default: the name). With one statistic it is the key itself,
        with several each gets ``<key>-<statistic>``.

    """

    name: str
    doc: str
    low: float = -INF
    high: float = INF
    required: bool = False
    summary: tuple[str, ...] = ("mean",)
    record_as: str = ""

    def __post_init__(self) -> None:
        unknown = [s for s in self.summary if s not in SUMMARIES]
        if unknown or len(set(self.summary)) != len(self.summary):
            raise ValueError(f"metric {self.name!r}: summary {self.summary} must be distinct ones of {SUMMARIES}")

    def record_keys(self) -> dict[str, str]:
        """Statistic -> the round record's key for it."""
        key = self.record_as or self.name
        return {s: key if len(self.summary) == 1 else f"{key}-{s}" for s in self.summary}

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

    def check_model(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Rules between this method's keys and the run's model: its arrays by name -> shape; raise ``ConfigError``.

        The server runs it before the run's folder exists, and ``python -m app.config``
        before a run is submitted, on the model built from the run's settings.
        """


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


class TunerSettings(Protocol):
    """What the shared checks read of a tuner's own settings (``tune = "<tuner>"``), so they name no tuner.

    A tuner declares its own bounds here: FATHOM's are its ``FathomSettings``
    (:mod:`strategies.contracts.fathom`); ``app/config/rules.py`` checks them against the
    keys the method lets it move (:class:`Tunable`).
    """

    step: str  # the step-size key it moves ("" = the method's own)

    @property
    def step_key(self) -> str:
        """The run-config key of :attr:`step` (``fathom-step``)."""

    def gamma_of(self, dimension: str) -> tuple[str, float]:
        """The hyper-step key and value of a dimension (``step``, ``work``, ``batch``); 0 holds it fixed."""

    def bounds_of(self, dimension: str, work_key: str) -> tuple[tuple[str, str], tuple[float, float]]:
        """The bound keys and values of a dimension; ``work_key``: the key of the method's local work."""


ASYNCHRONOUS = ("", "global", "own")  # Contract.asynchronous


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
    sends
        Array sets the server sends beside the model (SCAFFOLD's ``control``), each in the
        instructions its ``purposes`` name; the strategy's ``payload_for`` builds them.
    returns
        Array sets every fit reply carries beside the model (SCAFFOLD's ``delta-control``);
        the client's ``local_train`` returns them in its report, the strategy's ``combine``
        finds them in ``reply.extras``.
    personal
        Which of the model's arrays stay on the clients (FedRep's head); ``None``: all are shared.
    keeps
        What else each client keeps across rounds in its ``Context.state``, in words (Ditto:
        "its personal model v_k"); a run resumed from a checkpoint starts it afresh, and says so.
    representation
        It trains on the model's representation ``features(x)`` (MOON, FedProto): a model
        without the split into features and a head (not a ``SplitModel``) is refused.
    robust_aggregation
        Its server combines the replies' models through the shared ``aggregation`` (the base
        ``combine``), so the robust rules (``median``, ``trimmed-mean``, ``krum``,
        ``multi-krum``) apply; ``False`` for a method whose combination is its own maths
        (FedAMP's attention, the diffusion's combination matrix, FedProto's prototypes,
        FATHOM's example-weighted mean), which then refuses them.
    adapts_at_test
        Its clients adapt the model they receive with ``adapt-steps`` SGD steps before
        testing it (Per-FedAvg's one step); ``False`` for a method whose clients test their
        personal model as it is (Ditto's ``v_k``, FedRep's body with its own head), which
        is then sent ``adapt-steps = 0``.
    overlaps_rounds
        Its next round's fit reads nothing that closing a round writes (the round's
        evaluation, its record), so the Message API adapter may send round r+1's fit with
        round r's evaluation (``overlap-rounds``); ``False`` for a method whose
        ``fit_config``, sampling or ``begin_round`` reads the last evaluation.
    asynchronous
        How a reply trained from an older model joins a buffered (asynchronous) update
        (``pace = "buffered"``, docs/fleets.md): ``global`` (it is rebased onto the newest
        global model with its staleness weight, FedBuff), ``own`` (each partition is sent a
        model of its own that only its own replies change, the diffusion's agents), or
        ``""``: the method refuses the buffered pace (its server state assumes rounds).

    """

    name: str
    summary: str
    settings: type[MethodSettings]
    uses: tuple[str, ...]
    metrics: tuple[Metric, ...] = ()
    example: Mapping[str, object] = field(default_factory=dict)
    tunable: Tunable | None = None
    step_sizes: tuple[str, ...] = ()
    sends: tuple[ArraySet, ...] = ()
    returns: tuple[ArraySet, ...] = ()
    personal: PersonalArrays | None = None
    keeps: str = ""
    representation: bool = False
    robust_aggregation: bool = True
    adapts_at_test: bool = True
    overlaps_rounds: bool = True
    asynchronous: str = ""

    def __post_init__(self) -> None:
        if self.settings.prefix != self.name:
            raise ValueError(f"{self.settings.__name__}.prefix is {self.settings.prefix!r}, not {self.name!r}")
        for what, sets in (("sends", self.sends), ("returns", self.returns)):
            names = [s.name for s in sets]
            if len(set(names)) != len(names):
                raise ValueError(f"contract {self.name!r} {what} two array sets of one name: {names}")
        if self.asynchronous not in ASYNCHRONOUS:
            raise ValueError(f"contract {self.name!r}: asynchronous {self.asynchronous!r} is not one of {ASYNCHRONOUS}")
        unrecorded = [m.name for m in self.metrics if not m.summary]
        if unrecorded:
            raise ValueError(f"contract {self.name!r}: metrics {unrecorded} declare no summary; every metric a method "
                             "declares is recorded")  # fmt: skip

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

    def sent_sets(self, purpose: str) -> tuple[str, ...]:
        """The names of the array sets the server may send with ``purpose`` (``fit`` or ``evaluate``) instructions."""
        return tuple(s.name for s in self.sends if purpose in s.purposes)

    def returned_sets(self) -> tuple[str, ...]:
        """The names of the array sets every fit reply carries beside the model."""
        return tuple(s.name for s in self.returns)

    def client_state(self, method: MethodSettings) -> str:
        """What each client keeps across rounds (``Context.state``), in words; ``""`` when nothing."""
        kept = [self.keeps] if self.keeps else []
        if self.personal is not None:
            kept.append(self.personal.describe(method.values()))
        return " and ".join(kept)

    def personal_arrays(self, method: MethodSettings, layout: ModelLayout | Sequence[str]) -> tuple[str, ...]:
        """The model's arrays (``state_dict`` names) that stay on the clients; none unless ``personal`` is set.

        ``layout`` is the built model's :class:`ModelLayout`; bare names serve the rules that go by name.
        """
        if self.personal is None:
            return ()
        if not isinstance(layout, ModelLayout):
            layout = ModelLayout.of_names(layout)
        return self.personal.select(method.values(), layout)
