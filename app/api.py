"""stamen's public surface: what an outside Flower app may use, in one place.

Installed (``pip install .``), this is the top-level ``stamen`` package: ``import stamen``
then ``stamen.build_server_app(...)``. In a clone it is ``app.api``. docs/own-app.md
documents it with a complete app (``examples/own-app``).

The two entry points build a Flower ``ServerApp`` and ``ClientApp`` for any registered
method from the app's own network and data; stamen's own app is built with them too.
On Flower's Message API, ``stamen.PerFedAvg`` (and a class per method, by its strategy's
name; :func:`message_strategy` by method name) is a ``flwr.serverapp.strategy.Strategy``
a ``flwr new`` app swaps for ``FedAvg``; ``build_client_app``'s ClientApp answers them
(:func:`serving` makes one from an app's own function that builds a stamen client).
``METHODS`` maps each method's name (the ``strategy`` key's value) to its ``Method``: its
server class, its client class and its keys (:func:`method` looks one up by name).
"""

from __future__ import annotations

from app.client_app import build_client_app
from app.config import ConfigError, app_keys, parse_settings
from app.message_client import serving
from app.message_methods import (
    Apfl,
    Diffusion,
    Ditto,
    Fathom,
    FedAmp,
    FedAvg,
    FedBN,
    FedPer,
    FedProto,
    FedProx,
    FedRep,
    MethodStrategy,
    Moon,
    PerFedAvg,
    PFedMe,
    Scaffold,
    message_strategy,
)
from app.registry import METHODS, Method, method_named
from app.server_app import build_server_app
from clients.app_data import AppDataError
from clients.models import Model, SplitModel, build_model, card_of, register_model, split_at
from datasets import ClientData
from strategies.contracts.models import ModelCard
from strategies.contracts.settings import Settings

__all__ = [
    "METHODS",
    "Apfl",
    "AppDataError",
    "ClientData",
    "ConfigError",
    "Diffusion",
    "Ditto",
    "Fathom",
    "FedAmp",
    "FedAvg",
    "FedBN",
    "FedPer",
    "FedProto",
    "FedProx",
    "FedRep",
    "Method",
    "MethodStrategy",
    "Model",
    "ModelCard",
    "Moon",
    "PFedMe",
    "PerFedAvg",
    "Scaffold",
    "Settings",
    "SplitModel",
    "app_keys",
    "build_client_app",
    "build_model",
    "build_server_app",
    "card_of",
    "message_strategy",
    "method",
    "parse_settings",
    "register_model",
    "serving",
    "split_at",
]


def method(name: str) -> Method:
    """The registered method ``name`` (the ``strategy`` key's value): its ``server`` and ``client`` classes, ``keys``.

    Raises
    ------
    ConfigError
        For a name no method has, listing those that exist.

    """
    return method_named(name)
