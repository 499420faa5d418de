"""Flower clients (NumPyClient subclasses), models and the torch maths they run."""

from clients.base import TorchClient
from clients.models import MODELS, build_model
from clients.settings import ClientSettings

__all__ = ["MODELS", "ClientSettings", "TorchClient", "build_model"]
