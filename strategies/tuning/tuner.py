"""FATHOM's online tuner as a part any method's strategy can hold (``tune = "fathom"``).

FATHOM's signals do not depend on FedAvg: ``H`` compares consecutive global updates,
which every method whose server makes a new global model has, and ``phi`` measures how
aligned a client's successive local steps are, which every method that takes local
gradient steps has (its clients report it when the run is tuned). A method's contract
says which of its keys are its step size, its local work and its batch size
(:class:`strategies.contracts.contract.Tunable`); the tuner moves those values with
:func:`strategies.tuning.fathom_math.fathom_update` and the strategy broadcasts them in every
fit config, where the clients read them under the same keys.
"""

from __future__ import annotations

import math
from dataclasses import replace
from logging import INFO, WARNING

import numpy as np
from flwr.common.logger import log

from strategies.aggregation.rules import flatten
from strategies.contracts.client_reports import START_LOSS, TRAIN_LOSS
from strategies.contracts.contract import Metric
from strategies.contracts.fathom import CONTRACT as FATHOM
from strategies.contracts.fathom import PHI, FathomSettings
from strategies.contracts.payload import Scalar
from strategies.rounds.summaries import weighted_mean
from strategies.screening.replies import Reply
from strategies.tuning.fathom_math import FathomState, RoundAggregate, clipped, fathom_update, fell_back, new_lowest
from strategies.tuning.start_probe import ProbeTally, local_progress, probe_choice, probe_factors, probe_slots, tallied
from strategies.tuning.stationarity import decay_window

PHI_METRIC: Metric = next(m for m in FATHOM.metrics if m.name == PHI)  # required in a tuned run's fit replies


def mean_start_loss(replies: list[Reply]) -> float:
    """The global model's loss this round: the replies' example-weighted mean ``start-loss`` (nan: none has one)."""
    carried = [(float(reply.metrics[START_LOSS]), reply.num_examples) for reply in replies
               if START_LOSS in reply.metrics]  # fmt: skip
    finite = [(loss, examples) for loss, examples in carried if np.isfinite(loss)]
    return weighted_mean([loss for loss, _ in finite], [examples for _, examples in finite])


class FathomTuner:
    """The values in force for one run's step size, local work and batch size, and their update.

    Parameters
    ----------
    settings
        FATHOM's hyper-steps, smoothing and bounds (the ``fathom-*`` keys).
    keys
        Dimension (``step``, ``work``, ``batch``) -> the run-config key it moves.
    start
        Every key's starting value (the run's settings).

    """

    def __init__(self, *, settings: FathomSettings, keys: dict[str, str], start: dict[str, object]) -> None:
        self.settings = settings
        self.keys = keys
        self.work_bounds = settings.bounds_of("work", keys["work"])[1]
        self.state = FathomState(lr=float(start[keys["step"]]), epochs=float(start[keys["work"]]),
                                 batch_size=float(start[keys["batch"]]))  # fmt: skip
        self.factors = probe_factors(settings.probe_factor, settings.probe_points)
        self.probe = ProbeTally.empty(settings.probe_points) if settings.probe_rounds > 0 else None
        self.slots: dict[int, int] = {}  # a probe round's partition -> slot
        self.best_model: list[np.ndarray] | None = None  # the global model of the lowest loss (safe ascent)
        self._restore: list[np.ndarray] | None = None  # the model a fall-back puts back, until taken

    @property
    def probing(self) -> bool:
        """Whether the next round is a probe round (``fathom-probe-rounds`` > 0 and not all run yet)."""
        return self.probe is not None and self.probe.rounds < self.settings.probe_rounds

    def configs(self, server_round: int, partitions: list[int], config: dict[str, Scalar]) -> dict[int, dict]:
        """Each sampled partition's fit config: ``config``, or in a probe round its slot's step size."""
        if not self.probing:
            return {partition: config for partition in partitions}
        self.slots = probe_slots(partitions, server_round, self.settings.probe_points)
        key = self.keys["step"]
        return {partition: {**config, key: self.slot_step(slot)} for partition, slot in self.slots.items()}

    def slot_step(self, slot: int) -> float:
        """The step size probe slot ``slot`` tries: the start times its factor, within the step's bounds."""
        return clipped(self.state.lr * self.factors[slot], self.settings.lr_bounds)

    def model_replies(self, replies: list[Reply]) -> list[Reply]:
        """The replies the global model combines: in a probe round the middle slot's alone."""
        if not self.probing:
            return replies
        middle = self.settings.probe_points // 2
        return [reply for reply in replies if self.slots.get(reply.partition) == middle]

    def values(self) -> dict[str, Scalar]:
        """The values in force, by run-config key, for the next fit config (reals; clients round int keys)."""
        state = self.state
        return {self.keys["step"]: state.lr, self.keys["work"]: state.epochs, self.keys["batch"]: state.batch_size}

    def update(
        self, previous: list[np.ndarray], combined: list[np.ndarray] | None, replies: list[Reply]
    ) -> dict[str, float]:
        """Move the values after a round from the global update and the replies' ``phi``; the round's signals.

        A probe round tallies its replies' local progress instead, and the last one sets the start.
        """
        if self.probing:
            return self.probe_update(replies)
        if combined is None or not replies:
            return {}
        aggregate = RoundAggregate(
            update=flatten(combined, np.float64) - flatten(previous, np.float64),
            examples=np.array([reply.num_examples for reply in replies], dtype=np.float64),
            phis=np.array([float(reply.metrics[PHI]) for reply in replies]),
            start_loss=mean_start_loss(replies),
        )
        decays, armed, setbacks = self.state.decays, self.state.armed, self.state.setbacks
        lowest, fallbacks = self.state.lowest_loss, self.state.fallbacks
        if self.settings.safe_ascent > 0 and new_lowest(aggregate.start_loss, lowest):
            self.best_model = [np.array(a, copy=True) for a in previous]  # start-loss is this model's loss
        self.state, hg = fathom_update(self.state, aggregate, self.settings, work_bounds=self.work_bounds)
        signals = {"H": hg.global_term, "G": hg.local_term, "phi-mean": float(np.mean(aggregate.phis))}
        if self.settings.safe_ascent > 0:
            signals["fathom-fallbacks"] = float(self.state.fallbacks)
            if self.state.fallbacks > fallbacks:
                self._fell_back(f"the global loss {aggregate.start_loss:.4g} gave back over "
                                f"{self.settings.safe_ascent:g} of its progress ({self.state.first_loss:.4g} -> "
                                f"{lowest:.4g})")  # fmt: skip
        if self.settings.setback > 0:
            signals["lr-setbacks"] = float(self.state.setbacks)
            if self.state.setbacks > setbacks:
                log(INFO, "setback test: the global loss %.4g gave back over %s of its progress (%.4g -> %.4g); "
                    "%s divided by %s to %.4g", aggregate.start_loss, self.settings.setback, self.state.first_loss,
                    self.state.lowest_loss, self.keys["step"], self.settings.decay_factor, self.state.lr)  # fmt: skip
        if self.settings.decay_window > 0 or self.settings.setback > 0:
            if self.settings.decay_window > 0:
                signals["lr-decays"] = float(self.state.decays)
            if self.settings.decay_arm < 1:
                signals["decay-armed"] = float(self.state.armed)
                if self.state.armed and not armed:
                    log(INFO, "loss gate open, the decay tests armed: the global loss %.4g is at most %s of the "
                        "first round's %.4g", aggregate.start_loss, self.settings.decay_arm,
                        self.state.first_loss)  # fmt: skip
            if self.state.decays > decays:
                reading = "say the step is too large" if self.settings.decay_test == "overshoot" else "show no progress"
                log(INFO, "%s test: H's last %d values %s; %s divided by %s to %.4g", self.settings.decay_test,
                    decay_window(self.settings.decay_window, decays), reading, self.keys["step"],
                    self.settings.decay_factor, self.state.lr)  # fmt: skip
        return signals

    def nonfinite_round(self) -> dict[str, float]:
        """A round whose every fit reply was non-finite: safe ascent falls back (nothing else moves)."""
        if self.settings.safe_ascent <= 0 or self.probing:
            return {}
        self.state = fell_back(self.state, self.settings)
        self._fell_back("every fit reply was non-finite")
        return {"fathom-fallbacks": float(self.state.fallbacks)}

    def restored_model(self) -> list[np.ndarray] | None:
        """The global model a fall-back put back this round (``None``: none), once."""
        model, self._restore = self._restore, None
        return model

    def _fell_back(self, why: str) -> None:
        self._restore = self.best_model
        values = ", ".join(f"{key} = {value:.4g}" for key, value in self.values().items())
        where = "the model of the lowest loss is put back" if self.best_model is not None else "the model stays"
        log(WARNING, "safe ascent: %s; back to the values of the lowest loss, the step divided by %s: %s; %s",
            why, self.settings.decay_factor, values, where)  # fmt: skip

    def probe_update(self, replies: list[Reply]) -> dict[str, float]:
        """Tally a probe round; after the last, start from the slot whose clients' loss fell most."""
        progress = {reply.partition: local_progress(float(reply.metrics.get(TRAIN_LOSS, np.nan)),
                                                    float(reply.metrics.get(START_LOSS, np.nan)))
                    for reply in replies}  # fmt: skip
        self.probe = tallied(self.probe, self.slots, progress)
        self.slots = {}
        signals = {"probe-round": float(self.probe.rounds)}
        if self.probing:
            return signals
        means, slot = self.probe.means(), probe_choice(self.probe)
        start = self.state.lr
        self.state = replace(self.state, lr=self.slot_step(slot))
        if not np.isfinite(means).any():
            log(WARNING, "start probe: no reply carried both train-loss and start-loss; %s stays at %s",
                self.keys["step"], start)  # fmt: skip
        tried = ", ".join(f"{start * f:.4g}: {m:.4f}{' (failed)' if bad else ''}"
                          for f, m, bad in zip(self.factors, means, self.probe.failed, strict=True))  # fmt: skip
        log(INFO, "start probe: mean train-loss / start-loss by %s: %s; starting from %s = %.4g", self.keys["step"],
            tried, self.keys["step"], self.state.lr)  # fmt: skip
        return signals | {"probe-factor": float(self.factors[slot]), "probe-rho": float(means[slot])}

    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays and scalars a checkpoint keeps: the values in force, the update count, the smoothed update.

        Safe ascent's values of the lowest loss and its count are kept, its model of the
        lowest loss is not: a resumed run's first new lowest loss sets it again (until then
        a fall-back puts back the values alone).
        """
        state = self.state
        scalars = {"lr": state.lr, "epochs": state.epochs, "batch-size": state.batch_size, "round": state.round,
                   "decays": state.decays}  # fmt: skip
        smoothed = state.smoothed_update
        arrays = {"fathom/smoothed-update": smoothed} if smoothed is not None else {}
        arrays["fathom/recent-h"] = np.array(state.recent_h, dtype=np.float64)
        arrays["fathom/loss-gate"] = np.array([state.first_loss, float(state.armed)])
        arrays["fathom/setback"] = np.array([state.lowest_loss, state.setback_floor, float(state.setbacks)])
        arrays["fathom/safe-ascent"] = np.array([*state.best, float(state.fallbacks)])
        if self.probe is not None:
            probe = self.probe
            arrays |= {"fathom/probe-sums": probe.sums, "fathom/probe-counts": probe.counts.astype(np.float64),
                       "fathom/probe-failed": probe.failed.astype(np.float64)}  # fmt: skip
            scalars["probe-rounds"] = self.probe.rounds
        return arrays, scalars

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        """The inverse of :meth:`checkpoint_state`."""
        self.state = FathomState(
            lr=float(state["lr"]), epochs=float(state["epochs"]), batch_size=float(state["batch-size"]),
            smoothed_update=arrays.get("fathom/smoothed-update"), round=int(state["round"]),
            recent_h=tuple(float(h) for h in arrays.get("fathom/recent-h", ())), decays=int(state.get("decays", 0)),
        )  # fmt: skip
        if "fathom/loss-gate" in arrays:  # checkpoints from before the gate have none: it stays as built
            first_loss, armed = (float(v) for v in arrays["fathom/loss-gate"])
            self.state = replace(self.state, first_loss=first_loss, armed=bool(armed))
        if "fathom/setback" in arrays:
            lowest, floor, setbacks = (float(v) for v in arrays["fathom/setback"])
            self.state = replace(self.state, lowest_loss=lowest, setback_floor=floor, setbacks=int(setbacks))
        if "fathom/safe-ascent" in arrays:  # its model of the lowest loss is not kept: the next new lowest sets it
            *best, fallbacks = (float(v) for v in arrays["fathom/safe-ascent"])
            whole = math.isfinite(fallbacks) and fallbacks >= 0 and fallbacks == int(fallbacks)
            if len(best) != 3 or not all(math.isnan(v) or v > 0 for v in best) or not whole:
                raise ValueError(f"fathom/safe-ascent holds {[*best, fallbacks]}: three values in force (positive "
                                 "or nan) and a whole count")  # fmt: skip
            self.state = replace(self.state, best=tuple(best), fallbacks=int(fallbacks))
        if self.probe is not None:
            self.probe = ProbeTally(sums=np.asarray(arrays["fathom/probe-sums"], dtype=np.float64),
                                    counts=np.asarray(arrays["fathom/probe-counts"], dtype=np.int64),
                                    failed=np.asarray(arrays["fathom/probe-failed"], dtype=bool),
                                    rounds=int(state["probe-rounds"]))  # fmt: skip
