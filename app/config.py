"""Parse ``context.run_config`` once into typed, checked :class:`Settings`.

The keys are declared in the contracts (``strategies/contracts/``): the shared groups
in ``common.py``, each method's own keys in its contract. This module only collects
them, so adding a method changes nothing here. Every error names the key, the bad
value and what is allowed, before any data is loaded or any model is built.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.registry import CONTRACTS
from app.results import run_name_problem
from app.workdir import resolved
from clients.models import build_model, layout_of, model_cards
from datasets import APP_DATA, dataset_shape
from strategies.contracts.common import (
    AVERAGES,
    DATA_KEY_SCOPES,
    LOCAL_TRAINING_KEYS,
    ROBUST,
    SHARED_GROUPS,
    DataSettings,
    ExecutionSettings,
    RunSettings,
    Settings,
    TrainingSettings,
)
from strategies.contracts.contract import Contract
from strategies.contracts.keys import ConfigError, KeyedSettings, KeySpec
from strategies.contracts.models import ModelCard, ModelLayout
from strategies.contracts.personal import WholeModel

__all__ = ["ConfigError", "Settings", "app_keys", "check_model", "check_on_server", "ignored_keys", "key_specs",
           "looks_like_stamen_key", "parse_settings"]


def key_specs(contracts: Mapping[str, Contract] = CONTRACTS) -> dict[str, tuple[type[KeyedSettings], KeySpec]]:
    """Every run-config key -> (the settings class declaring it, its spec), in declaration order.

    Raises
    ------
    ValueError
        If two classes declare one key, or a method declares a key without its name as prefix.

    """
    table: dict[str, tuple[type[KeyedSettings], KeySpec]] = {}
    groups = [*SHARED_GROUPS, *(contract.settings for contract in contracts.values())]
    for group in groups:
        for spec in group.key_specs():
            if group.prefix and not spec.name.startswith(f"{group.prefix}-"):
                raise ValueError(f"{group.__name__} declares {spec.name!r} without its prefix {group.prefix!r}")
            if spec.name in table:
                raise ValueError(f"run config key {spec.name!r} is declared by both {table[spec.name][0].__name__} "
                                 f"and {group.__name__}")  # fmt: skip
            table[spec.name] = (group, spec)
    return table


def did_you_mean(candidates: Sequence[str]) -> str:
    """`` (did you mean 'a' or 'b'?)`` for the ``candidates``, or ``""`` when there are none."""
    return f" (did you mean {' or '.join(map(repr, candidates))}?)" if candidates else ""


# How alike (difflib's ratio) an app's key may be to one of stamen's before it is taken for a misspelling of it:
# 'perfedavg-alhpa', 'num-server-round', 'local-epoch' are refused; 'fraction-train', 'partition-seed', 'lrr' pass.
NEAR_MISS_RATIO = 0.85


def looks_like_stamen_key(
    name: str, known: Mapping[str, object], contracts: Mapping[str, Contract] = CONTRACTS
) -> bool:
    """Whether an app's key ``name`` is more likely a misspelt stamen key than the app's own.

    It is when it starts with a method's prefix (``perfedavg-``, ``fathom-``: stamen's
    namespaces) or is within :data:`NEAR_MISS_RATIO` of a key stamen declares.
    """
    if any(name.startswith(f"{method}-") for method in contracts):
        return True
    return bool(difflib.get_close_matches(name, list(known), n=1, cutoff=NEAR_MISS_RATIO))


def app_keys(run_config: Mapping[str, object], contracts: Mapping[str, Contract] = CONTRACTS) -> dict[str, object]:
    """The keys of ``run_config`` that stamen does not declare: an outside app's own, with their values."""
    known = key_specs(contracts)
    return {name: value for name, value in run_config.items() if name not in known}


def model_card(name: str, models: Mapping[str, ModelCard]) -> ModelCard:
    """The card of the registered model ``name``.

    Raises
    ------
    ConfigError
        Naming the ``model`` key and the registered models.

    """
    if name not in models:
        close = did_you_mean(difflib.get_close_matches(name, list(models), n=2))
        raise ConfigError(f"run config key 'model': {name!r} is not a registered model{close}; "
                          f"choose one of {list(models)} (a model of your own: docs/adding-a-model.md)")  # fmt: skip
    return models[name]


def parse_settings(
    run_config: Mapping[str, object],
    contracts: Mapping[str, Contract] = CONTRACTS,
    models: Mapping[str, ModelCard] | None = None,
    *,
    allow_app_keys: bool = False,
) -> Settings:
    """Check ``run_config`` and return the typed settings of the run.

    Parameters
    ----------
    run_config
        ``context.run_config`` (kebab-case keys); missing keys take their defaults.
    contracts
        The methods known, by name (the registry's).
    models
        The models known, by name; default: the model registry's cards at the time of the
        call (so a model registered at run time counts).
    allow_app_keys
        ``True`` in an outside app: keys stamen does not declare are the app's own and
        are left to it (:func:`app_keys`), except those that look like a misspelt stamen
        key (:func:`looks_like_stamen_key`), which are refused naming the key meant.
        ``False`` (stamen's own app): every unknown key is refused.

    Raises
    ------
    ConfigError
        For an unknown key, a value of the wrong type, out of range or not among
        the allowed choices, or values that do not go together.

    """
    known = key_specs(contracts)
    unknown = sorted(set(run_config) - set(known))
    if allow_app_keys:  # an outside app's own keys pass; what looks like a misspelt stamen key does not
        unknown = [k for k in unknown if looks_like_stamen_key(k, known, contracts)]
    if unknown:
        # a method's key without its prefix ('alpha' for 'perfedavg-alpha'), else a near spelling
        hints = {k: [n for n in known if n.endswith(f"-{k}")] or difflib.get_close_matches(k, known, n=2)
                 for k in unknown}  # fmt: skip
        shown = "; ".join(f"{k!r}{did_you_mean(h)}" for k, h in hints.items())
        listing = "" if all(hints.values()) else f"; known keys: {sorted(known)}"
        raise ConfigError(f"unknown run config key(s) {shown}{listing} (every key: docs/configuration.md)")
    run = RunSettings.from_config(run_config)
    if run.strategy not in contracts:
        raise ConfigError(f"run config key 'strategy': {run.strategy!r} is not allowed; choose one of "
                          f"{list(contracts)}")  # fmt: skip
    shared = {"data": DataSettings.from_config(run_config), "training": TrainingSettings.from_config(run_config),
              "execution": ExecutionSettings.from_config(run_config)}  # fmt: skip
    # every method's values are checked, the chosen one's are kept
    methods = {name: contract.settings.from_config(run_config) for name, contract in contracts.items()}
    card = model_card(shared["training"].model, model_cards() if models is None else models)
    settings = Settings(run=run, **shared, method=methods[run.strategy], model_card=card,
                        tuner=methods[run.tune] if run.tune != "none" else None)  # fmt: skip
    if settings.tuner is not None:
        check_tuning(settings, contracts)
    check_central_evaluation(settings, contracts[run.strategy])
    if problem := run_name_problem(settings.execution.run_name):  # before any folder, data or node
        raise ConfigError(problem)
    return settings


def check_central_evaluation(settings: Settings, contract: Contract) -> None:
    """Refuse ``central-eval`` for a method that keeps part of the model on its clients: there is no whole model.

    A method whose model never travels (``WholeModel``) also refuses the keys that need a
    server-side model: ``checkpoint-every`` and ``resume-from`` (a checkpoint could not hold
    the clients' models). ``max-update-ratio`` applies to it still: it screens the array
    sets its clients return (FedProto's prototypes).
    """
    check_aggregation(settings, contract)
    if isinstance(contract.personal, WholeModel):
        execution = settings.execution
        for name, value, used in (("checkpoint-every", execution.checkpoint_every, execution.checkpoint_every > 0),
                                  ("resume-from", execution.resume_from, bool(execution.resume_from))):  # fmt: skip
            if used:
                raise ConfigError(f"run config key {name!r}: {value!r} needs a model on the server; {contract.name}'s "
                                  "model never travels (each client keeps its own whole model in Context.state), "
                                  "so leave it at its default")  # fmt: skip
    if settings.run.central_eval and settings.data.validation_fraction > 0:
        raise ConfigError("run config key 'central-eval': it tests the global model on the dataset's test set, which "
                          f"validation-fraction = {settings.data.validation_fraction:g} keeps out of the run (every "
                          "evaluation reads the clients' validation splits); leave one of them off")  # fmt: skip
    if contract.personal is not None and settings.run.central_eval:
        kept = contract.personal.describe(settings.method.values())
        raise ConfigError(
            f"run config key 'central-eval': {contract.name} keeps {kept} on the clients, so the server's model "
            "holds only their initial values and testing it would measure nothing; its evaluation runs on the "
            "clients, each with its own layers (fraction-evaluate > 0)"
        )


def check_aggregation(settings: Settings, contract: Contract) -> None:
    """Refuse a robust ``aggregation`` for a method whose server combines replies by its own maths."""
    rule = settings.run.aggregation
    if rule in ROBUST and not contract.robust_aggregation:
        raise ConfigError(f"run config key 'aggregation': {rule!r} is a rule for methods whose server averages the "
                          f"replies' models; {contract.name} combines them by its own maths, so it takes "
                          f"{' or '.join(repr(a) for a in AVERAGES)}")  # fmt: skip


def model_layout(settings: Settings) -> ModelLayout:
    """The run's model, built from its settings as the server builds it: its arrays' names, shapes, kinds and head.

    Raises
    ------
    ConfigError
        If the model cannot be built for the run's data (a CNN on images that are not square),
        or the data has no shape stamen can read (dataset ``app``: only an app's clients have it).

    """
    try:
        input_shape, num_classes = dataset_shape(settings.data_spec())
    except ValueError as err:
        raise ConfigError(f"run config key 'dataset': {err}") from err
    check_inputs(settings, input_shape)
    try:
        model = build_model(settings.training.model, input_shape=input_shape, num_classes=num_classes)
    except ValueError as err:
        raise ConfigError(f"run config key 'model': {err}") from err
    return layout_of(model)


def check_inputs(settings: Settings, input_shape: tuple[int, ...]) -> None:
    """``feature-shift`` and ``input-mean``/``input-std`` against the data's input shape (channels first).

    Raises
    ------
    ConfigError
        Naming the key: a colour shift of images that are not RGB, or another number of
        channel values than the inputs have channels.

    """
    data = settings.data
    channels = input_shape[0] if input_shape else 0
    if data.feature_shift == "colour" and (len(input_shape) != 3 or channels != 3):
        raise ConfigError(f"run config key 'feature-shift': 'colour' needs RGB images (3xHxW); dataset "
                          f"{data.dataset!r} has inputs of shape {'x'.join(map(str, input_shape))}")  # fmt: skip
    means, _ = data.normalisation()
    if means and len(means) != channels:
        raise ConfigError(f"run config key 'input-mean': {len(means)} values, but dataset {data.dataset!r} has "
                          f"{channels} channels (inputs of shape {'x'.join(map(str, input_shape))})")  # fmt: skip


def check_model(
    settings: Settings, contracts: Mapping[str, Contract] = CONTRACTS, layout: ModelLayout | None = None
) -> None:
    """The method's rules against the run's model: its personal arrays, and its own ``check_model``.

    Runs on the server before the run's folder exists, and in ``python -m app.config``.
    ``layout`` is the model's (an outside app's own network); default: the registered
    model's, built for the run's data.
    """
    layout = layout if layout is not None else model_layout(settings)
    contract = contracts[settings.run.strategy]
    if contract.representation and not layout.head:
        raise ConfigError(f"run config key 'model': {contract.name} trains on the model's representation "
                          f"features(x), and {settings.training.model!r} is not split into features and a head; "
                          "derive it from clients.models.SplitModel (stamen.clients.models.SplitModel installed: "
                          "docs/adding-a-model.md)")  # fmt: skip
    contract.personal_arrays(settings.method, layout)
    settings.method.check_model(dict(zip(layout.names, layout.shapes, strict=True)))


def tuned_keys(settings: Settings, contracts: Mapping[str, Contract] = CONTRACTS) -> dict[str, str]:
    """Dimension (``step``, ``work``, ``batch``) -> the run-config key the tuner moves, for a tuned run."""
    tunable = contracts[settings.run.strategy].tunable
    return tunable.keys(settings.as_run_config())


def check_tuning(settings: Settings, contracts: Mapping[str, Contract] = CONTRACTS) -> None:
    """Refuse a tuner over a method that declares nothing tunable, or bounds the method's keys cannot take.

    A dimension whose hyper-step is 0 is held at the method's own value and not checked.
    """
    strategy, tuner = settings.run.strategy, settings.tuner
    if contracts[strategy].tunable is None:
        tunable = [name for name, contract in contracts.items() if contract.tunable is not None and name != "fathom"]
        raise ConfigError(f"run config key 'tune': strategy {strategy!r} declares nothing tunable; tune one of "
                          f"{tunable}")  # fmt: skip
    if strategy == settings.run.tune:
        raise ConfigError(f"run config key 'tune': strategy {strategy!r} is already tuned by {strategy}; use "
                          f"tune = 'none', or tune = {strategy!r} over another strategy")  # fmt: skip
    declared = contracts[strategy].tunable
    allowed = ("", declared.step, *declared.other_steps)
    if tuner.step not in allowed:
        raise ConfigError(f"run config key 'fathom-step': {tuner.step!r} is not a step size {strategy} lets the tuner "
                          f"move; choose one of {list(allowed)}")  # fmt: skip
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


def check_on_server(settings: Settings, layout: ModelLayout | None = None) -> None:
    """Checks only the server makes, once, before any work: the method's files, its model rules, ``resume-from``.

    ``parse_settings`` runs on every SuperNode too, where the server's files need not exist.
    ``layout``: the model's, when it is an outside app's own (see :func:`check_model`).
    """
    settings.method.check_on_server()
    check_model(settings, layout=layout)
    resume_from = settings.execution.resume_from
    if resume_from and not resolved(resume_from).exists():
        raise ConfigError(f"run config key 'resume-from': {resume_from!r} ({resolved(resume_from)}) does not exist; "
                          "a relative path is taken under ~/stamen/, like results-dir")  # fmt: skip


def ignored_keys(
    run_config: Mapping[str, object], settings: Settings, contracts: Mapping[str, Contract] = CONTRACTS
) -> dict[str, str]:
    """The keys set away from their defaults that this run never reads, each with the reason.

    Flower's run config holds every key of ``pyproject.toml``, so a key counts only when
    its value differs from the declared default: another method's key, a local-training
    key the chosen method does not use (its contract's ``uses``), or a data key for
    another dataset or partitioner.
    """
    known = key_specs(contracts)
    strategy = settings.run.strategy
    contract = contracts[strategy]
    values = {**settings.data.values(), "strategy": strategy}
    ignored: dict[str, str] = {}
    for name, value in run_config.items():
        if name not in known or value == known[name][1].default:
            continue
        group = known[name][0]
        if group.prefix and group.prefix not in (strategy, settings.run.tune):
            ignored[name] = f"a {group.prefix} key; strategy is {strategy!r}"
        elif name in LOCAL_TRAINING_KEYS and name not in contract.uses:
            ignored[name] = f"{strategy} reads {', '.join(contract.uses)} of the local-training keys"
        elif name in DATA_KEY_SCOPES and settings.data.dataset != APP_DATA:  # an own app's data keys are its own
            owner, applies_to = DATA_KEY_SCOPES[name]
            if values[owner] not in applies_to:
                ignored[name] = f"only for {owner} {' or '.join(applies_to)}; {owner} is {values[owner]!r}"
    return ignored


def ignored_keys_line(ignored: Mapping[str, str]) -> str:
    """One warning line for :func:`ignored_keys`."""
    shown = "; ".join(f"{name!r} ({why})" for name, why in ignored.items())
    return f"run config key(s) set but unused by this run, so they change nothing: {shown}"


def run_config_from_text(text: str) -> dict[str, object]:
    """A ``--run-config`` string (``key=value ...``, flwr run's syntax) as a dict, parsed by Flower's own parser.

    Raises
    ------
    ConfigError
        If the text is not in that syntax (Flower's parser raises click's
        ``ClickException``, whose message names no key).

    """
    from flwr.common.config import parse_config_args

    try:
        return parse_config_args([text]) if text.strip() else {}
    except Exception as err:
        raise ConfigError(f"--run-config is not in flwr run's `key=value ...` syntax: {text!r}") from err


def app_run_config(app_dir: Path) -> dict[str, object]:
    """The ``[tool.flwr.app.config]`` of the Flower app in ``app_dir`` (flattened as Flower does)."""
    from flwr.common.config import flatten_dict

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, as flwr's dependency tomli
        import tomli as tomllib

    pyproject = app_dir / "pyproject.toml"
    if not pyproject.is_file():
        raise ConfigError(f"--app {app_dir}: no pyproject.toml there")
    table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    return flatten_dict(table)


def check_overrides(overrides: Mapping[str, object], app_config: Mapping[str, object], app_dir: Path) -> None:
    """What Flower checks before a run starts (its ``[code: 15]``), with the key meant named.

    Raises
    ------
    ConfigError
        For an override key the app's ``pyproject.toml`` does not declare: the closest
        key it declares, or the stamen key it would have to add.

    """
    for name in overrides:
        if name in app_config:
            continue
        close = difflib.get_close_matches(name, list(app_config), n=2, cutoff=0.7)
        hint = did_you_mean(close)
        if not close:
            stamen_close = difflib.get_close_matches(name, list(key_specs()), n=1, cutoff=0.7)
            hint = (f" (stamen's key {stamen_close[0]!r} can be set once the app declares it there)"
                    if stamen_close else "")  # fmt: skip
        raise ConfigError(f"run config key {name!r} is not declared in {app_dir / 'pyproject.toml'}'s "
                          f"[tool.flwr.app.config]{hint}; `flwr run` refuses it with `[code: 15] Invalid run "
                          "configuration.`")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m app.config "lr=0.1 strategy='fedavg'"``: check a ``--run-config`` string before submitting it.

    ``flwr run`` refuses a key it does not know with ``[code: 15] Invalid run
    configuration`` and names the key only in the SuperLink's log; this prints
    stamen's own message (with a suggestion for a misspelt key), the warnings a run
    would log, and exits 1 when the run would be refused. With ``--app DIR`` it checks
    the string against that Flower app's ``pyproject.toml`` as Flower does, then reads it
    as an outside app's run config (its own keys pass).
    """
    import argparse

    module = __spec__.name if __spec__ is not None else "app.config"  # stamen.app.config when installed
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=main.__doc__.splitlines()[0])
    parser.add_argument("run_config", nargs="*", help="the --run-config string(s), in flwr run's syntax")
    parser.add_argument("--app", type=Path, default=None,
                        help="an outside Flower app's folder: check the keys against its pyproject.toml")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        overrides = run_config_from_text(" ".join(args.run_config))
        run_config = overrides
        if args.app is not None:
            app_config = app_run_config(args.app)
            check_overrides(overrides, app_config, args.app)
            run_config = {**app_config, **overrides}
        settings = parse_settings(run_config, allow_app_keys=args.app is not None)
        if args.app is None:
            check_on_server(settings)
    except ConfigError as err:
        print(f"error: {err}")
        return 1
    ignored = ignored_keys(run_config, settings)
    if ignored:
        print(f"warning: {ignored_keys_line(ignored)}")
    if args.app is not None:
        print(f"ok: {args.app} accepts this run config: strategy {settings.run.strategy!r}, the app's own keys "
              f"{sorted(app_keys(run_config))}")  # fmt: skip
    else:
        print(f"ok: strategy {settings.run.strategy!r} on {settings.data.dataset!r} accepts this run config")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
