"""The networks stamen trains, found by name through one registry (``registry.py``), one file per family."""

from clients.models.head_split import split_at
from clients.models.registry import (
    MODELS,
    Model,
    build_model,
    layout_of,
    model_cards,
    parameter_count,
    register_model,
    seeded,
)
from clients.models.split import SequentialSplit, SplitModel, has_representation, head_names
from clients.models.traits import card_of

__all__ = ["MODELS", "Model", "SequentialSplit", "SplitModel", "build_model", "has_representation", "head_names",
           "layout_of", "model_cards", "parameter_count", "register_model", "seeded", "card_of", "split_at"]
