"""Parse ``context.run_config`` once into typed, checked :class:`Settings`.

The keys are declared in the contracts (``strategies/contracts/``): the shared groups
in ``common.py``, each method's own keys in its contract. This module only collects
them, so adding a method changes nothing here. Every error names the key, the bad
value and what is allowed, before any data is loaded or any model is built.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

from app.registry import CONTRACTS
from strategies.contracts.common import (
    SHARED_GROUPS,
    DataSettings,
    ExecutionSettings,
    RunSettings,
    Settings,
    TrainingSettings,
)
from strategies.contracts.contract import Contract
from strategies.contracts.keys import ConfigError, KeyedSettings, KeySpec

__all__ = ["ConfigError", "Settings", "check_on_server", "key_specs", "parse_settings"]


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


def parse_settings(run_config: Mapping[str, object], contracts: Mapping[str, Contract] = CONTRACTS) -> Settings:
    """Check ``run_config`` and return the typed settings of the run.

    Parameters
    ----------
    run_config
        ``context.run_config`` (kebab-case keys); missing keys take their defaults.
    contracts
        The methods known, by name (the registry's).

    Raises
    ------
    ConfigError
        For an unknown key, a value of the wrong type, out of range or not among
        the allowed choices, or values that do not go together.

    """
    known = key_specs(contracts)
    unknown = sorted(set(run_config) - set(known))
    if unknown:
        # a method's key without its prefix ('alpha' for 'perfedavg-alpha'), else a near spelling
        hints = {k: [n for n in known if n.endswith(f"-{k}")] or difflib.get_close_matches(k, known, n=2)
                 for k in unknown}  # fmt: skip
        shown = "; ".join(f"{k!r} (did you mean {' or '.join(map(repr, h))}?)" if h else repr(k)
                          for k, h in hints.items())  # fmt: skip
        raise ConfigError(f"unknown run config key(s) {shown}; known keys: {sorted(known)}")
    run = RunSettings.from_config(run_config)
    if run.strategy not in contracts:
        raise ConfigError(f"run config key 'strategy': {run.strategy!r} is not allowed; choose one of "
                          f"{list(contracts)}")  # fmt: skip
    shared = {"data": DataSettings.from_config(run_config), "training": TrainingSettings.from_config(run_config),
              "execution": ExecutionSettings.from_config(run_config)}  # fmt: skip
    # every method's values are checked, the chosen one's are kept
    methods = {name: contract.settings.from_config(run_config) for name, contract in contracts.items()}
    return Settings(run=run, **shared, method=methods[run.strategy])


def check_on_server(settings: Settings) -> None:
    """Checks only the server makes, once, before any work: the method's files and ``resume-from``.

    ``parse_settings`` runs on every SuperNode too, where the server's files need not exist.
    """
    settings.method.check_on_server()
    resume_from = settings.execution.resume_from
    if resume_from and not Path(resume_from).expanduser().exists():
        raise ConfigError(f"run config key 'resume-from': {resume_from!r} does not exist")
