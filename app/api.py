"""stamen's public surface: what an outside Flower app may use, in one place.

Installed (``pip install .``), this is the top-level ``stamen`` package: ``import stamen``
then ``stamen.build_server_app(...)``. In a clone it is ``app.api``. docs/own-app.md
documents it with a complete app (``examples/own-app``).

The two entry points build a Flower ``ServerApp`` and ``ClientApp`` for any registered
method from the app's own network and data; stamen's own app is built with them too.
``METHODS`` maps each method's name (the ``strategy`` key's value) to its ``Method``: its
strategy class, its client class and its keys (:func:`method` looks one up by name).
"""

from __future__ import annotations

from app.client_app import build_client_app
from app.config import ConfigError, app_keys, parse_settings
from app.registry import METHODS, Method
from app.server_app import build_server_app
from clients.app_data import AppDataError
from clients.models import Model, SplitModel, build_model, card_of, register_model, split_at
from datasets import ClientData
from strategies.contracts.models import ModelCard
from strategies.contracts.settings import Settings
from strategies.server import RoundServer

__all__ = [
    "METHODS",
    "AppDataError",
    "ClientData",
    "ConfigError",
    "Method",
    "Model",
    "ModelCard",
    "RoundServer",
    "Settings",
    "SplitModel",
    "app_keys",
    "build_client_app",
    "build_model",
    "build_server_app",
    "card_of",
    "method",
    "parse_settings",
    "register_model",
    "split_at",
]


def method(name: str) -> Method:
    """The registered method ``name`` (the ``strategy`` key's value): its ``strategy`` and ``client`` classes, ``keys``.

    Raises
    ------
    ConfigError
        For a name no method has, listing those that exist.

    """
    if name not in METHODS:
        raise ConfigError(f"run config key 'strategy': {name!r} is not a method; choose one of {list(METHODS)}")
    return METHODS[name]
