"""The run-config keys stamen declares, collected, and the advice about keys: misspelt, an app's own, or unused.

The keys are declared in the contracts (``strategies/contracts/``): the shared groups
in ``common.py``, each method's own keys in its contract. This module only collects
them, so adding a method changes nothing here.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from app.registry import CONTRACTS
from datasets import APP_DATA
from strategies.contracts.common import DATA_KEY_SCOPES, LOCAL_TRAINING_KEYS, SHARED_GROUPS
from strategies.contracts.contract import Contract
from strategies.contracts.keys import KeyedSettings, KeySpec
from strategies.contracts.settings import Settings


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


# keys stamen no longer reads, with what replaced them: refused by name, even where an app's own keys pass
REMOVED_KEYS = {
    "api": "stamen runs on Flower's Message API only since the legacy Strategy path was removed (a round engine, "
           "strategies/flower/rounds.py); drop the key",
    "server-threads": "the legacy API's thread pool is gone: the round engine waits for every message of a phase in "
                      "one pull loop (pull-interval); drop the key",
}


def removed_keys_problem(run_config: Mapping[str, object]) -> str | None:
    """The line refusing a key of ``run_config`` that stamen no longer reads, saying what replaced it; else ``None``."""
    removed = [k for k in REMOVED_KEYS if k in run_config]
    if not removed:
        return None
    return "; ".join(f"run config key {k!r} was removed: {REMOVED_KEYS[k]}" for k in removed)


def unknown_keys_problem(
    run_config: Mapping[str, object], contracts: Mapping[str, Contract], *, allow_app_keys: bool
) -> str | None:
    """The line refusing the keys of ``run_config`` stamen does not declare, with the key meant; ``None``: none.

    With ``allow_app_keys`` (an outside app) only those that look like a misspelt stamen
    key (:func:`looks_like_stamen_key`) count; the others are the app's own.
    """
    if problem := removed_keys_problem(run_config):
        return problem
    known = key_specs(contracts)
    unknown = sorted(set(run_config) - set(known))
    if allow_app_keys:  # an outside app's own keys pass; what looks like a misspelt stamen key does not
        unknown = [k for k in unknown if looks_like_stamen_key(k, known, contracts)]
    if not unknown:
        return None
    # a method's key without its prefix ('alpha' for 'perfedavg-alpha'), else a near spelling
    hints = {k: [n for n in known if n.endswith(f"-{k}")] or difflib.get_close_matches(k, known, n=2)
             for k in unknown}  # fmt: skip
    shown = "; ".join(f"{k!r}{did_you_mean(h)}" for k, h in hints.items())
    listing = "" if all(hints.values()) else f"; known keys: {sorted(known)}"
    return f"unknown run config key(s) {shown}{listing} (every key: docs/configuration.md)"


def app_keys(run_config: Mapping[str, object], contracts: Mapping[str, Contract] = CONTRACTS) -> dict[str, object]:
    """The keys of ``run_config`` that stamen does not declare: an outside app's own, with their values."""
    known = key_specs(contracts)
    return {name: value for name, value in run_config.items() if name not in known}


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
