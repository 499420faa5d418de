"""Run configs from outside stamen: ``flwr run``'s ``--run-config`` text and a Flower app's ``pyproject.toml``."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

from app.config.keys import did_you_mean, key_specs
from strategies.contracts.keys import ConfigError


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
