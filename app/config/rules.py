"""Every rule between keys of different groups, each a small function naming the keys it reads.

A key's own range and choices, and the rules among one group's keys, are declared with
the key (``strategies/contracts/``). What spans groups is :data:`RULES`, in the order it
is checked, on every process that parses the run config (:func:`app.config.parse_settings`,
so the server and every SuperNode), before any data is loaded or any model is built.

Beside them, :mod:`app.config.server_rules` holds what only the server checks, once,
before the run's folder exists: the files only it reads, the rules against the run's
model (``MODEL_RULES``), ``resume-from``.

Every rule raises :class:`ConfigError` naming a key, the bad value and what is allowed. A
method's own rules against the shared keys are its settings' ``check_in``, its rules
against the model its ``check_model``, its server-only files its ``check_on_server``; a
tuner declares its own bounds (:class:`strategies.contracts.contract.TunerSettings`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.config.keys import key_specs
from app.registry import CONTRACTS
from app.results.run_folder import run_name_problem
from datasets import APP_DATA, GENERATED, USER_DATASETS
from strategies.contracts.common import AVERAGES, REGRESSION_DATASETS, ROBUST
from strategies.contracts.contract import Contract, TunerSettings
from strategies.contracts.keys import ConfigError
from strategies.contracts.personal import WholeModel
from strategies.contracts.settings import Settings


@dataclass(frozen=True)
class Rule:
    """A rule between groups: the run-config keys it reads, and its check (which raises ``ConfigError``)."""

    keys: tuple[str, ...]
    check: Callable[..., None]


# RULES: check(settings, contracts), on every process that parses the run config


def model_takes_the_inputs(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """A model that needs images is refused on generated data (feature vectors)."""
    card, data = settings.model_card, settings.data
    if card.inputs == "image" and data.dataset in GENERATED:
        raise ConfigError(f"run config key 'model': {settings.training.model!r} needs images; dataset "
                          f"{data.dataset!r} has feature vectors")  # fmt: skip


def model_task_fits_the_targets(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """Real targets need a regression model, class labels a classifier."""
    card, dataset = settings.model_card, settings.data.dataset
    if (card.task == "regression") != (dataset in REGRESSION_DATASETS):
        raise ConfigError(f"run config key 'model': dataset {dataset!r} and model {settings.training.model!r} "
                          f"({card.task}) do not go together: real targets ({list(REGRESSION_DATASETS)}) need "
                          "a regression model ('linear'), class labels a classifier")  # fmt: skip


def batch_sizes_fit_the_model(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """Every ``*batch-size`` key (shared or the method's) at least the model's ``min_batch`` (BatchNorm: 2)."""
    low = settings.model_card.min_batch
    values = {**settings.training.values(), **settings.method.values()}
    for name, value in values.items():
        # adapt-batch-size 0 means the whole training set, checked per client in the preflight
        if name.endswith("batch-size") and 0 < int(value) < low:
            raise ConfigError(f"run config key {name!r}: {value} is below {low}, the smallest batch model "
                              f"{settings.training.model!r} trains on ({settings.model_card.norm} norm: a batch of "
                              "1 has no batch statistics)")  # fmt: skip


def central_eval_has_a_test_set(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """``central-eval`` needs a dataset with a test set the server can load."""
    data = settings.data
    if not settings.run.central_eval:
        return
    if data.dataset in GENERATED:
        raise ConfigError(f"run config key 'central-eval': needs a dataset with its own test set; "
                          f"{data.dataset!r} has none")  # fmt: skip
    if data.dataset == APP_DATA:
        raise ConfigError("run config key 'central-eval': the data is the app's own, which only its clients "
                          "load, so the server has no test set; evaluation runs on the clients "
                          "(fraction-evaluate > 0)")  # fmt: skip
    if data.dataset in USER_DATASETS and not data.data_dir:
        raise ConfigError(f"run config key 'central-eval': the server tests on the run config's data-dir, which "
                          f"is empty (dataset {data.dataset!r}: the devices hold the data)")  # fmt: skip


def method_rules(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """The chosen method's own rules against the shared keys (its settings' ``check_in``)."""
    settings.method.check_in(settings)


def tune_a_tunable_strategy(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """A tuner (``tune``) wraps only a strategy that declares what it may move (its contract's ``tunable``)."""
    strategy, tune = settings.run.strategy, settings.run.tune
    if settings.tuner is not None and contracts[strategy].tunable is None:
        tunable = [name for name, contract in contracts.items() if contract.tunable is not None and name != tune]
        raise ConfigError(f"run config key 'tune': strategy {strategy!r} declares nothing tunable; tune one of "
                          f"{tunable}")  # fmt: skip


def tune_another_strategy(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """A tuner that is also a strategy (``fathom``) does not tune itself."""
    strategy = settings.run.strategy
    if settings.tuner is not None and strategy == settings.run.tune:
        raise ConfigError(f"run config key 'tune': strategy {strategy!r} is already tuned by {strategy}; use "
                          f"tune = 'none', or tune = {strategy!r} over another strategy")  # fmt: skip


def tuner_step_is_the_methods(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """The tuner's step key (``fathom-step``) names a step size the method lets it move."""
    tuner: TunerSettings | None = settings.tuner
    if tuner is None:
        return
    strategy = settings.run.strategy
    declared = contracts[strategy].tunable
    allowed = ("", declared.step, *declared.other_steps)
    if tuner.step not in allowed:
        raise ConfigError(f"run config key {tuner.step_key!r}: {tuner.step!r} is not a step size {strategy} lets "
                          f"the tuner move; choose one of {list(allowed)}")  # fmt: skip


def tuner_bounds_fit_the_keys(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """Each dimension the tuner moves: its bounds within the moved key's range, the start between them.

    The bounds are the tuner's (``bounds_of``); a dimension whose hyper-step (``gamma_of``)
    is 0 is held at the method's own value and not checked.
    """
    tuner: TunerSettings | None = settings.tuner
    if tuner is None:
        return
    known = key_specs(contracts)
    values = settings.as_run_config()
    for dimension, name in tuned_keys(settings, contracts).items():
        gamma_key, gamma = tuner.gamma_of(dimension)
        if gamma == 0:
            continue
        (low_key, high_key), (low, high) = tuner.bounds_of(dimension, name)
        spec = known[name][1]
        for bound_key, bound in ((low_key, low), (high_key, high)):
            above_low = bound > spec.low or (bound == spec.low and not spec.low_open)
            below_high = bound < spec.high or (bound == spec.high and not spec.high_open)
            if not (above_low and below_high):
                raise ConfigError(
                    f"run config key {bound_key!r}: {bound:g} is outside the range of {name!r}, "
                    f"{spec.allowed()}, which the tuner moves; set it within that range, or {gamma_key} = 0 "
                    f"to hold {name} fixed"
                )
        if dimension == "batch" and low < settings.model_card.min_batch:
            raise ConfigError(f"run config key {low_key!r}: {low:g} is below {settings.model_card.min_batch}, the "
                              f"smallest batch model {settings.training.model!r} trains on (BatchNorm)")  # fmt: skip
        if not low <= float(values[name]) <= high:
            raise ConfigError(f"run config key {name!r}: the tuner starts at {values[name]}, outside "
                              f"[{low_key}, {high_key}] = [{low:g}, {high:g}]")  # fmt: skip


def tuned_keys(settings: Settings, contracts: Mapping[str, Contract] = CONTRACTS) -> dict[str, str]:
    """Dimension (``step``, ``work``, ``batch``) -> the run-config key the tuner moves, for a tuned run."""
    tunable = contracts[settings.run.strategy].tunable
    return tunable.keys(settings.as_run_config())


def aggregation_fits_the_method(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """A robust ``aggregation`` only for a method whose server averages the replies' models."""
    rule, contract = settings.run.aggregation, contracts[settings.run.strategy]
    if rule in ROBUST and not contract.robust_aggregation:
        raise ConfigError(f"run config key 'aggregation': {rule!r} is a rule for methods whose server averages the "
                          f"replies' models; {contract.name} combines them by its own maths, so it takes "
                          f"{' or '.join(repr(a) for a in AVERAGES)}")  # fmt: skip


def robust_keys_need_their_rule(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """``bucket-size`` only with a robust rule (buckets change no mean), ``clip-radius`` only with centered-clip."""
    run = settings.run
    if run.bucket_size > 1 and run.aggregation not in ROBUST:
        raise ConfigError(f"run config key 'bucket-size': {run.bucket_size} buckets the replies for a robust rule; "
                          f"aggregation = {run.aggregation!r} averages them all anyway: set aggregation to one of "
                          f"{', '.join(ROBUST)}, or bucket-size = 1")  # fmt: skip
    if run.clip_radius > 0 and run.aggregation != "centered-clip":
        raise ConfigError(f"run config key 'clip-radius': it sets centered-clip's radius, and aggregation is "
                          f"{run.aggregation!r}: set aggregation = \"centered-clip\", or drop the key")  # fmt: skip


def server_model_keys_need_one(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """A method whose model never travels (``WholeModel``) refuses the keys that need a model on the server.

    A checkpoint could not hold the clients' models. ``max-update-ratio`` applies to it
    still: it screens the array sets its clients return (FedProto's prototypes).
    """
    contract, execution = contracts[settings.run.strategy], settings.execution
    if not isinstance(contract.personal, WholeModel):
        return
    for name, value, used in (("checkpoint-every", execution.checkpoint_every, execution.checkpoint_every > 0),
                              ("resume-from", execution.resume_from, bool(execution.resume_from))):  # fmt: skip
        if used:
            raise ConfigError(f"run config key {name!r}: {value!r} needs a model on the server; {contract.name}'s "
                              "model never travels (each client keeps its own whole model in Context.state), "
                              "so leave it at its default")  # fmt: skip


def central_eval_reads_no_held_out_test(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """``central-eval`` reads the test set, which ``validation-fraction`` > 0 keeps out of the run."""
    fraction = settings.data.validation_fraction
    if settings.run.central_eval and fraction > 0:
        raise ConfigError("run config key 'central-eval': it tests the global model on the dataset's test set, which "
                          f"validation-fraction = {fraction:g} keeps out of the run (every "
                          "evaluation reads the clients' validation splits); leave one of them off")  # fmt: skip


def central_eval_has_a_whole_model(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """``central-eval`` is refused for a method that keeps part of the model on its clients."""
    contract = contracts[settings.run.strategy]
    if contract.personal is not None and settings.run.central_eval:
        kept = contract.personal.describe(settings.method.values())
        raise ConfigError(
            f"run config key 'central-eval': {contract.name} keeps {kept} on the clients, so the server's model "
            "holds only their initial values and testing it would measure nothing; its evaluation runs on the "
            "clients, each with its own layers (fraction-evaluate > 0)"
        )


def run_name_is_a_name(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """``run-name`` is one folder name under ``results-dir`` (:func:`app.results.run_folder.run_name_problem`)."""
    if problem := run_name_problem(settings.execution.run_name):  # before any folder, data or node
        raise ConfigError(problem)


def pace_fits_the_method(settings: Settings, contracts: Mapping[str, Contract]) -> None:
    """``pace = "buffered"`` only for a method that says how a stale reply joins an update; never under a tuner.

    Deadline rounds are rounds whose late replies count as failures, which every method takes.
    """
    fleet, contract = settings.fleet, contracts[settings.run.strategy]
    if fleet.pace != "buffered":
        if fleet.bias_correction != "none":
            raise ConfigError(f"run config key 'bias-correction': {fleet.bias_correction!r} corrects the buffered "
                              f"pace's participation; pace is {fleet.pace!r} (set pace = \"buffered\" or leave "
                              "bias-correction at \"none\")")  # fmt: skip
        return
    if not contract.asynchronous:
        raise ConfigError(f"run config key 'pace': 'buffered' is refused for strategy {contract.name!r}: its server "
                          "state assumes rounds (a stale reply has no defined place in it); use pace = \"lockstep\" "
                          "or \"deadline\" (docs/fleets.md)")  # fmt: skip
    if contract.asynchronous == "own" and fleet.bias_correction != "none":
        raise ConfigError(f"run config key 'bias-correction': {fleet.bias_correction!r} is refused for "
                          f"{contract.name!r}: an agent that finishes rarely is a stubborn neighbour the others keep "
                          "averaging with, so its limit does not lean to the fast agents, and the correction would "
                          "lean it to the slow ones (least squares: 0.014 from the limit uncorrected, 1.76 corrected; "
                          "docs/fleets.md)")  # fmt: skip
    if settings.run.tune != "none":
        raise ConfigError(f"run config key 'pace': 'buffered' is refused with tune = {settings.run.tune!r}: the "
                          "tuner's hypergradient compares whole rounds; use pace = \"lockstep\" or "
                          "\"deadline\"")  # fmt: skip


RULES: tuple[Rule, ...] = (
    Rule(("model", "dataset"), model_takes_the_inputs),
    Rule(("model", "dataset"), model_task_fits_the_targets),
    Rule(("model", "batch-size", "adapt-batch-size", "<method>-*batch-size"), batch_sizes_fit_the_model),
    Rule(("central-eval", "dataset", "data-dir"), central_eval_has_a_test_set),
    Rule(("<method>-*", "shared keys"), method_rules),
    Rule(("tune", "strategy"), tune_a_tunable_strategy),
    Rule(("tune", "strategy"), tune_another_strategy),
    Rule(("<tuner>-step", "strategy"), tuner_step_is_the_methods),
    Rule(("<tuner>-*-min", "<tuner>-*-max", "model", "the keys tuned"), tuner_bounds_fit_the_keys),
    Rule(("aggregation", "strategy"), aggregation_fits_the_method),
    Rule(("bucket-size", "clip-radius", "aggregation"), robust_keys_need_their_rule),
    Rule(("checkpoint-every", "resume-from", "strategy"), server_model_keys_need_one),
    Rule(("central-eval", "validation-fraction"), central_eval_reads_no_held_out_test),
    Rule(("central-eval", "strategy"), central_eval_has_a_whole_model),
    Rule(("run-name",), run_name_is_a_name),
    Rule(("pace", "bias-correction", "strategy", "tune"), pace_fits_the_method),
)


def check_settings(settings: Settings, contracts: Mapping[str, Contract] = CONTRACTS) -> None:
    """Every rule of :data:`RULES`, in order; the first broken raises."""
    for rule in RULES:
        rule.check(settings, contracts)
