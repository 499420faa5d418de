"""A model card read from a network itself: what stamen's checks need to know about a model it did not register.

A user's own app hands stamen a ``torch.nn.Module`` instead of a registry name. The
checks and advice that a registered model's card drives (BatchNorm and the smallest
batch, Per-FedAvg's Hessian advice for ReLU networks) then come from the network:
its modules, and, when torch.fx can trace its ``forward``, the functions it calls
(``F.relu`` in a ``forward`` has no module to find).
"""

from __future__ import annotations

from torch import nn

from clients.models.registry import kind_of
from strategies.contracts.models import BATCH_NORM, GROUP_NORM, ModelCard

# Modules whose output is not twice differentiable in their input: the gradient of a network built with them
# is piecewise constant in the weights, so a finite difference of it estimates no Hessian (ModelCard.smooth).
NON_SMOOTH_MODULES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.Hardtanh, nn.Hardswish,
                      nn.Hardsigmoid, nn.Hardshrink, nn.Softshrink, nn.Threshold, nn.MaxPool1d, nn.MaxPool2d,
                      nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)  # fmt: skip
NON_SMOOTH_FUNCTIONS = frozenset({"relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "prelu", "rrelu", "hardtanh",
                                  "hardswish", "hardsigmoid", "hardshrink", "softshrink", "threshold", "max_pool1d",
                                  "max_pool2d", "max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
                                  "adaptive_max_pool3d", "clamp", "clip", "abs"})  # fmt: skip
IMAGE_MODULES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def non_smooth_parts(model: nn.Module) -> list[str]:
    """The names of the model's non-smooth modules, and of the non-smooth functions its traced ``forward`` calls.

    Tracing is best effort: a ``forward`` with data-dependent control flow cannot be
    traced, and then only the modules count (declare ``smooth`` on the card instead).
    """
    found = [f"{name} ({type(module).__name__})" for name, module in model.named_modules()
             if isinstance(module, NON_SMOOTH_MODULES)]  # fmt: skip
    try:
        from torch import fx

        graph = fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - any forward torch.fx cannot trace leaves the module scan alone
        return found
    for node in graph.nodes:
        called = getattr(node.target, "__name__", node.target) if node.op in ("call_function", "call_method") else ""
        if isinstance(called, str) and called in NON_SMOOTH_FUNCTIONS:
            found.append(f"{node.name} ({called})")
    return found


def card_of(model: nn.Module, *, name: str, summary: str = "") -> ModelCard:
    """The :class:`ModelCard` of ``model``, read from its layers (see :func:`non_smooth_parts`).

    ``norm`` is ``batch`` when any layer is a BatchNorm (a batch of one is then refused),
    ``group`` for GroupNorm; ``inputs`` is ``image`` when it has a convolution; the task is
    classification. A card passed to the app's entry points instead overrides all of this.
    """
    kinds = {kind_of(module) for module in model.modules()}
    norm = "batch" if BATCH_NORM in kinds else "group" if GROUP_NORM in kinds else "none"
    image = any(isinstance(module, IMAGE_MODULES) for module in model.modules())
    return ModelCard(name=name, summary=summary or f"the app's own {type(model).__name__}",
                     inputs="image" if image else "flat", smooth=not non_smooth_parts(model), norm=norm)  # fmt: skip
