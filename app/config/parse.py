"""Parse ``context.run_config`` once into typed, checked :class:`Settings`.

Every error names the key, the bad value and what is allowed, before any data is loaded
or any model is built: a key's own range and choices are checked as its group is read,
the rules between groups after (:mod:`app.config.rules`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from app.config.keys import did_you_mean, unknown_keys_problem
from app.config.rules import check_settings
from app.registry import CONTRACTS
from clients.models import model_cards
from strategies.contracts.common import (
    DataSettings,
    ExecutionSettings,
    FleetSettings,
    RunSettings,
    TrainingSettings,
)
from strategies.contracts.contract import Contract
from strategies.contracts.keys import ConfigError
from strategies.contracts.models import ModelCard
from strategies.contracts.settings import Settings


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
        are left to it (:func:`app.config.keys.app_keys`), except those that look like a misspelt stamen
        key (:func:`app.config.keys.looks_like_stamen_key`), which are refused naming the key meant.
        ``False`` (stamen's own app): every unknown key is refused.

    Raises
    ------
    ConfigError
        For an unknown key, a value of the wrong type, out of range or not among
        the allowed choices, or values that do not go together.

    """
    if problem := unknown_keys_problem(run_config, contracts, allow_app_keys=allow_app_keys):
        raise ConfigError(problem)
    run = RunSettings.from_config(run_config)
    if run.strategy not in contracts:
        raise ConfigError(f"run config key 'strategy': {run.strategy!r} is not allowed; choose one of "
                          f"{list(contracts)}")  # fmt: skip
    shared = {"data": DataSettings.from_config(run_config), "training": TrainingSettings.from_config(run_config),
              "execution": ExecutionSettings.from_config(run_config),
              "fleet": FleetSettings.from_config(run_config)}  # fmt: skip
    # every method's values are checked, the chosen one's are kept
    methods = {name: contract.settings.from_config(run_config) for name, contract in contracts.items()}
    card = model_card(shared["training"].model, model_cards() if models is None else models)
    settings = Settings(run=run, **shared, method=methods[run.strategy], model_card=card,
                        tuner=methods[run.tune] if run.tune != "none" else None)  # fmt: skip
    check_settings(settings, contracts)
    return settings
