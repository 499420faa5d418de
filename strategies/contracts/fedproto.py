"""FedProto's contract: no model travels; class prototypes of the representation go out and come back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.keys import ConfigError, key
from strategies.contracts.models import ModelLayout
from strategies.contracts.payload import ArraySet
from strategies.contracts.personal import WholeModel

PROTOTYPES, COUNTS = "prototypes", "prototype-counts"


@dataclass(frozen=True, kw_only=True)
class FedProtoSettings(MethodSettings):
    """FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, AAAI 2022): federated prototype learning.

    Each client keeps its whole model. It trains on ``CE + lambda * MSE(z, C^y)``, the
    representation ``z = features(x)`` pulled towards the global prototype of its label
    (for the labels that have one), and returns its class prototypes (mean ``z`` per
    class) with its class counts; the server averages them per class, weighted by counts.
    """

    prefix: ClassVar[str] = "fedproto"

    lambda_: float = key(1.0, "lambda: the weight of the distance of the representations to their class's global "
                         "prototype (the paper's 1)", at_least=0)  # fmt: skip


def prototype_shape(layout: ModelLayout) -> tuple[int, int]:
    """(classes, representation size): the shape of the head's first weight matrix, read from the model's split.

    Raises
    ------
    ConfigError
        If the model declares no head with a weight matrix.

    """
    shapes = layout.shapes or ((),) * len(layout.names)  # a layout of names alone knows no head
    for name, shape in zip(layout.names, shapes, strict=True):
        if name in layout.head and len(shape) == 2:
            return shape[0], shape[1]
    raise ConfigError("run config key 'model': fedproto needs a model whose head is a linear classifier on its "
                      "representation (a SplitModel: docs/models.md)")  # fmt: skip


CONTRACT = Contract(
    robust_aggregation=False,  # no model travels: FedProto averages prototypes by their class counts
    name="fedproto",
    adapts_at_test=False,
    summary="FedProto: no model travels; clients share class prototypes of their representation and pull their "
            "own representations towards the global ones",
    settings=FedProtoSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    representation=True,  # it trains on features(x): a model with the split
    personal=WholeModel(),
    sends=(ArraySet(PROTOTYPES, "the global prototype C^j of each class, a row each (zeros where none)"),
           ArraySet(COUNTS, "the training examples behind each global prototype (0: none this round)")),
    returns=(ArraySet(PROTOTYPES, "the client's class prototypes c_k^j, a row each (zeros for classes it lacks)",
                      kind="values"),
             ArraySet(COUNTS, "its training examples of each class", kind="counts")),
    example={"strategy": "fedproto", "fraction-fit": 0.5},
    # not tunable: FATHOM's hypergradient reads the global model's update, and no model travels here
)
