"""Flower strategies (server side) and the pure maths they rely on."""

from strategies.fedavg import PersonalisedFedAvg
from strategies.perfedavg import PerFedAvg
from strategies.recorder import NullRecorder, Recorder

__all__ = ["NullRecorder", "PerFedAvg", "PersonalisedFedAvg", "Recorder"]
