"""The run config: its keys collected, parsed into typed :class:`Settings`, and checked by the run's rules.

- ``keys.py``: every declared key (from the contracts), typo advice, an app's own keys, keys set but unused;
- ``parse.py``: ``parse_settings``, ``context.run_config`` -> :class:`Settings`;
- ``rules.py``: every rule between groups of keys, as named functions in the order they run;
- ``server_rules.py``: beside them, the checks only the server makes (its files, the model, resume-from);
- ``run_config_text.py``: ``flwr run``'s ``--run-config`` text and a Flower app's ``pyproject.toml``;
- ``cli.py``: ``python -m app.config "key=value ..."``, which checks a run config before it is submitted.

The names below are what the rest of stamen imports from ``app.config``.
"""

from app.config.cli import main
from app.config.keys import app_keys, ignored_keys, ignored_keys_line, key_specs, looks_like_stamen_key
from app.config.parse import parse_settings
from app.config.rules import tuned_keys
from app.config.run_config_text import run_config_from_text
from app.config.server_rules import check_model, check_on_server, model_layout
from strategies.contracts.keys import ConfigError
from strategies.contracts.settings import Settings

__all__ = ["ConfigError", "Settings", "app_keys", "check_model", "check_on_server", "ignored_keys",
           "ignored_keys_line", "key_specs", "looks_like_stamen_key", "main", "model_layout", "parse_settings",
           "run_config_from_text", "tuned_keys"]  # fmt: skip
