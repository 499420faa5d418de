"""An outside app's own pieces (its network, its data) turned into stamen's settings, on the server and the clients.

:func:`app.server_app.build_server_app` and :func:`app.client_app.build_client_app` take
them; both read the run config through :meth:`OwnParts.settings`, so the server and every
client agree on the model's name and card and on which keys are the app's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import nn

from app.config import ConfigError, Settings, app_keys, parse_settings
from clients.models import card_of, model_cards, seeded
from datasets import APP_DATA
from strategies.contracts.common import RunSettings
from strategies.contracts.models import ModelCard

ModelFn = Callable[[Mapping[str, object]], nn.Module]
"""The app's network from the run config (every key, the app's own included)."""
DataFn = Callable[[int, int, Mapping[str, object]], tuple[object, object]]
"""``(partition_id, num_partitions, run_config) -> (train, test)``: one client's data (forms: clients.app_data)."""


@dataclass(frozen=True)
class OwnParts:
    """What an app brings of its own; every field empty is stamen's own app.

    Attributes
    ----------
    model
        Builds the app's network; ``None``: the registered model named by ``model``.
    model_name
        The name runs record for it (``summary.json``'s ``model``); default: its class name.
    model_card
        Its traits as stamen's checks read them; default: read from the network
        (:func:`clients.models.card_of`).
    data_name
        The name runs record for the app's own data (the server has no data function);
        non-empty means the clients' data comes from the app (dataset ``app``).
    allow_app_keys
        Let the app's own run-config keys through (``False`` in stamen's own app).

    """

    model: ModelFn | None = None
    model_name: str = ""
    model_card: ModelCard | None = None
    data_name: str = ""
    allow_app_keys: bool = True

    def settings(self, run_config: Mapping[str, object], *, own_data: bool) -> tuple[Settings, nn.Module | None]:
        """The run's checked settings, and the app's network built from the run's seed (``None`` without one).

        Raises
        ------
        ConfigError
            As :func:`app.config.parse_settings`, and for dataset ``app`` in an app
            without its own data.

        """
        config = dict(run_config)
        models = None
        network = None
        if self.model is not None:
            seed = RunSettings.from_config(run_config).seed
            network = seeded(lambda: self.model(run_config), seed=seed)
            if not isinstance(network, nn.Module):
                raise TypeError(f"the app's model function returned a {type(network).__name__}, not a torch.nn.Module")
            name = self.model_name or type(network).__name__
            card = self.model_card or card_of(network, name=name)
            if card.name != name:
                raise ValueError(f"the app's model card is named {card.name!r}, its model {name!r}")
            config["model"] = name  # in an own app, stamen's `model` key names the app's network
            models = {**model_cards(), name: card}
        if own_data:
            config["dataset"] = APP_DATA
        elif config.get("dataset") == APP_DATA:
            raise ConfigError(f"run config key 'dataset': {APP_DATA!r} is an app's own data; only an app built with "
                              "build_client_app(data=...) and build_server_app(data_name=...) has it "
                              "(docs/own-app.md)")  # fmt: skip
        return parse_settings(config, models=models, allow_app_keys=self.allow_app_keys), network

    def record(self, run_config: Mapping[str, object], settings: Settings) -> dict[str, object]:
        """What ``summary.json`` and ``run.json`` say about the app's own pieces (empty for stamen's own app)."""
        if self.model is None and not self.data_name and not app_keys(run_config):
            return {}
        card = settings.model_card
        return {"app": {"model": settings.training.model, "model-card": {"smooth": card.smooth, "norm": card.norm,
                                                                         "inputs": card.inputs},
                        "data": self.data_name or settings.data.dataset, "keys": app_keys(run_config)}}  # fmt: skip
