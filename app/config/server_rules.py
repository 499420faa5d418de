"""The checks only the server makes, once, before the run's folder exists: beside :mod:`app.config.rules`.

``parse_settings`` runs on every SuperNode too, where the server's files need not exist
and no model need be built. Here, in order (:func:`check_on_server`): the files only the
server reads (the method's ``check_on_server``), the inputs against the data's shape
(:func:`check_inputs`, as the model is built), :data:`MODEL_RULES` (the method against
the run's model), and ``resume-from``. ``python -m app.config`` runs them too.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.config.rules import Rule
from app.registry import CONTRACTS
from app.workdir import resolved
from clients.models import build_model, layout_of
from datasets import dataset_shape
from strategies.contracts.contract import Contract
from strategies.contracts.keys import ConfigError
from strategies.contracts.models import ModelLayout
from strategies.contracts.settings import Settings


def check_inputs(settings: Settings, input_shape: tuple[int, ...]) -> None:
    """``feature-shift`` and ``input-mean``/``input-std`` against the data's input shape (channels first).

    Raises
    ------
    ConfigError
        Naming the key: a colour shift of images that are not RGB, or another number of
        channel values than the inputs have channels.

    """
    data = settings.data
    channels = input_shape[0] if input_shape else 0
    if data.feature_shift == "colour" and (len(input_shape) != 3 or channels != 3):
        raise ConfigError(f"run config key 'feature-shift': 'colour' needs RGB images (3xHxW); dataset "
                          f"{data.dataset!r} has inputs of shape {'x'.join(map(str, input_shape))}")  # fmt: skip
    means, _ = data.normalisation()
    if means and len(means) != channels:
        raise ConfigError(f"run config key 'input-mean': {len(means)} values, but dataset {data.dataset!r} has "
                          f"{channels} channels (inputs of shape {'x'.join(map(str, input_shape))})")  # fmt: skip


def model_layout(settings: Settings) -> ModelLayout:
    """The run's model, built from its settings as the server builds it: its arrays' names, shapes, kinds and head.

    Raises
    ------
    ConfigError
        If the model cannot be built for the run's data (a CNN on images that are not square),
        or the data has no shape stamen can read (dataset ``app``: only an app's clients have it).

    """
    try:
        input_shape, num_classes = dataset_shape(settings.data_spec())
    except ValueError as err:
        raise ConfigError(f"run config key 'dataset': {err}") from err
    check_inputs(settings, input_shape)
    try:
        model = build_model(settings.training.model, input_shape=input_shape, num_classes=num_classes)
    except ValueError as err:
        raise ConfigError(f"run config key 'model': {err}") from err
    return layout_of(model)


def representation_has_a_head(settings: Settings, contract: Contract, layout: ModelLayout) -> None:
    """A method that trains on the representation needs a model split into features and a head."""
    if contract.representation and not layout.head:
        raise ConfigError(f"run config key 'model': {contract.name} trains on the model's representation "
                          f"features(x), and {settings.training.model!r} is not split into features and a head; "
                          "name its head: split_at(network, head='<its last layer>') (stamen.split_at, "
                          "docs/own-app.md), or derive it from stamen.SplitModel (docs/adding-a-model.md)")  # fmt: skip


def personal_arrays_exist(settings: Settings, contract: Contract, layout: ModelLayout) -> None:
    """The method's personal arrays (``fedrep-personal-layers``, ...) are arrays of this model."""
    contract.personal_arrays(settings.method, layout)


def method_model_rules(settings: Settings, contract: Contract, layout: ModelLayout) -> None:
    """The method's own rules against the model's arrays (its settings' ``check_model``)."""
    settings.method.check_model(dict(zip(layout.names, layout.shapes, strict=True)))


MODEL_RULES: tuple[Rule, ...] = (
    Rule(("model", "strategy"), representation_has_a_head),
    Rule(("model", "<method>-personal-*"), personal_arrays_exist),
    Rule(("model", "<method>-*"), method_model_rules),
)


def check_model(
    settings: Settings, contracts: Mapping[str, Contract] = CONTRACTS, layout: ModelLayout | None = None
) -> None:
    """The method's rules against the run's model: every rule of :data:`MODEL_RULES`, in order.

    Runs on the server before the run's folder exists, and in ``python -m app.config``.
    ``layout`` is the model's (an outside app's own network); default: the registered
    model's, built for the run's data.
    """
    layout = layout if layout is not None else model_layout(settings)
    contract = contracts[settings.run.strategy]
    for rule in MODEL_RULES:
        rule.check(settings, contract, layout)


def resume_from_exists(settings: Settings) -> None:
    """``resume-from`` names a file or folder there is (relative: under ~/stamen/)."""
    resume_from = settings.execution.resume_from
    if resume_from and not resolved(resume_from).exists():
        raise ConfigError(f"run config key 'resume-from': {resume_from!r} ({resolved(resume_from)}) does not exist; "
                          "a relative path is taken under ~/stamen/, like results-dir")  # fmt: skip


def check_on_server(settings: Settings, layout: ModelLayout | None = None) -> None:
    """Checks only the server makes, once, before any work: the method's files, its model rules, ``resume-from``.

    ``parse_settings`` runs on every SuperNode too, where the server's files need not exist.
    ``layout``: the model's, when it is an outside app's own (see :func:`check_model`).
    """
    settings.method.check_on_server()  # the files only the server reads (diffusion's graph, ...)
    check_model(settings, layout=layout)
    resume_from_exists(settings)
