"""The models stamen knows: one registry line each, a card (name and traits) and a builder.

Add a model with a file beside this one that defines its network (a
:class:`~clients.models.split.SplitModel`) and a builder ``(input_shape, num_classes) ->
nn.Module``, and one line in :data:`MODELS` (docs/adding-a-model.md). Everything else
follows from the registry: the ``model`` key's choices, the checks of the run config
against the model's traits, the docs' table (``python -m app.reference``). A model may
also be registered at run time with :func:`register_model` (a test's throwaway model, a
user's app), in every process that builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from clients.models.fedavg_cnn import build_fedavg_cnn, build_fedavg_cnn_bn
from clients.models.leaf_cnn import build_cnn, build_cnn_small
from clients.models.linear import build_linear, build_logreg
from clients.models.mlp import build_mlp
from clients.models.resnet import build_resnet18, build_resnet18_gn
from clients.models.split import head_names
from strategies.contracts.models import BATCH_NORM, GROUP_NORM, OTHER, ModelCard, ModelLayout
from strategies.contracts.naming import named_once

Builder = Callable[[tuple[int, ...], int], nn.Module]


@dataclass(frozen=True)
class Model:
    """A registered model: its card (what the settings checks read) and its builder (input shape, classes -> net)."""

    card: ModelCard
    build: Builder


def by_name(*models: Model) -> dict[str, Model]:
    """``{card name: model}``, refusing two models of one name."""
    return named_once(models, lambda model: model.card.name, "models")


def card(name: str, summary: str, inputs: str, *, smooth: bool, norm: str = "none", task: str = "classification"):
    """A :class:`ModelCard`, positionally for the registry's one-line entries."""
    return ModelCard(name=name, summary=summary, inputs=inputs, smooth=smooth, norm=norm, task=task)


MODELS: dict[str, Model] = by_name(
    Model(card("mlp", "784-80-60-C with ELU: the Per-FedAvg paper's network", "flat", smooth=True), build_mlp),
    Model(card("cnn", "LEAF's FEMNIST CNN: 2 x (5x5 conv, pool), 32/64 channels, 512 hidden, ReLU", "image",
               smooth=False), build_cnn),  # fmt: skip
    Model(card("cnn-small", "LEAF's CNN at CPU size: 8/16 channels, 64 hidden, ReLU", "image", smooth=False),
          build_cnn_small),  # fmt: skip
    Model(card("logreg", "multinomial logistic regression (convex)", "flat", smooth=True), build_logreg),
    Model(card("linear", "least squares, no bias (dataset least-squares)", "flat", smooth=True, task="regression"),
          build_linear),  # fmt: skip
    Model(card("fedavg-cnn", "PFLlib's 4-layer FedAvgCNN: 2 x (5x5 conv, pool), 32/64 channels, 512 hidden, ReLU",
               "image", smooth=False), build_fedavg_cnn),  # fmt: skip
    Model(card("fedavg-cnn-bn", "FedAvgCNN with BatchNorm after both convolutions and the hidden layer", "image",
               smooth=False, norm="batch"), build_fedavg_cnn_bn),  # fmt: skip
    Model(card("resnet18", "ResNet-18 for 32x32 images (3x3 stem), BatchNorm, 11.2 M parameters", "image",
               smooth=False, norm="batch"), build_resnet18),  # fmt: skip
    Model(card("resnet18-gn", "ResNet-18 for 32x32 images with GroupNorm (2 groups) for non-IID data", "image",
               smooth=False, norm="group"), build_resnet18_gn),  # fmt: skip
)


def register_model(model: Model) -> Model:
    """Add ``model`` to :data:`MODELS` at run time (in this process), refusing a name already taken."""
    if model.card.name in MODELS:
        raise ValueError(f"a model named {model.card.name!r} is registered already")
    MODELS[model.card.name] = model
    return model


def model_cards() -> dict[str, ModelCard]:
    """Every registered model's card, by name (what ``app.config.parse_settings`` checks ``model`` against)."""
    return {name: model.card for name, model in MODELS.items()}


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> nn.Module:
    """Build model ``name`` with a seeded initialisation, so server and clients agree.

    Raises
    ------
    ValueError
        For an unknown name, or inputs the model cannot take (a CNN on feature vectors).

    """
    if name not in MODELS:
        raise ValueError(f"model {name!r} is not one of {list(MODELS)}")
    return seeded(lambda: MODELS[name].build(tuple(input_shape), num_classes), seed=seed)


def seeded(build: Callable[[], nn.Module], *, seed: int) -> nn.Module:
    """``build()`` under torch's generator seeded with ``seed``, leaving the caller's generator as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def parameter_count(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters())


def kind_of(module: nn.Module) -> str:
    """The kind of layer ``module`` is, as a personal-array rule selects by (``ModelLayout.kinds``)."""
    batch_norm = nn.modules.batchnorm._NormBase  # BatchNorm1d/2d/3d and SyncBatchNorm (instance norm derives too)
    if isinstance(module, batch_norm) and not isinstance(module, nn.modules.instancenorm._InstanceNorm):
        return BATCH_NORM
    if isinstance(module, nn.GroupNorm):
        return GROUP_NORM
    return OTHER


def layout_of(model: nn.Module) -> ModelLayout:
    """The model's arrays as the rules and the server see them: names, shapes, dtypes, owners' kinds, head."""
    owners = dict(model.named_modules())
    state = model.state_dict()
    names = tuple(state)
    kinds = tuple(kind_of(owners[name.rpartition(".")[0]]) for name in names)
    # torch names its dtypes as numpy does (torch.float32 -> float32); read them without copying a tensor to the host
    return ModelLayout(names=names, shapes=tuple(tuple(v.shape) for v in state.values()),
                       dtypes=tuple(str(v.dtype).removeprefix("torch.") for v in state.values()), kinds=kinds,
                       head=head_names(model))  # fmt: skip
