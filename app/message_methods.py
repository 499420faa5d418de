"""stamen's methods as Flower Message API strategies, and the run that stamen's ServerApp plays with them.

A ``flwr new`` app swaps Flower's ``FedAvg(...)`` for one of these and keeps its
``strategy.start(grid=grid, ...)``::

    strategy = stamen.PerFedAvg(run_config=context.run_config, model=lambda config: Net())
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()))

Each class is :class:`MethodStrategy` fixed to one registered method
(:func:`message_strategy` builds it from the registry; the built-in ones have names
here, exported by ``stamen``); the app's ClientApp is ``stamen.build_client_app(...)``,
whose handlers answer them. Stamen's own ServerApp runs them (:func:`run_on_grid`), so an
app gets what stamen's own run gets: the checks before any work, the preflight, the
results folder, checkpoints, resuming and the divergence stop. Each is the round engine
(:class:`strategies.flower.rounds.Rounds`) over the method :func:`app.server_run.run_method` builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import ClassVar

from flwr.serverapp import Grid

from app.config import ConfigError
from app.own_parts import ModelFn, OwnParts
from app.registry import method_named
from app.server_run import refused, run_method
from strategies.contracts.common import RunSettings
from strategies.contracts.models import ModelCard
from strategies.flower.rounds import Rounds


class MethodStrategy(Rounds):
    """A stamen method as a Flower Message API strategy, built from a run config (see the module's docstring).

    Parameters
    ----------
    run_config
        The run config (``context.run_config``): stamen's keys (docs/configuration.md),
        defaults for those it lacks, and the app's own keys beside them. Its
        ``strategy`` key, if given, must name this class's method.
    model, model_name, model_card, data_name, allow_app_keys
        The app's own parts, as for :func:`app.server_app.build_server_app`.

    Raises
    ------
    ConfigError
        For a run config stamen refuses (a bad value, a misspelt key, a model the
        method cannot use), before any work; the reason is logged in one line.

    """

    method: ClassVar[str] = ""

    def __init__(
        self,
        *,
        run_config: Mapping[str, object] | None = None,
        model: ModelFn | None = None,
        model_name: str = "",
        model_card: ModelCard | None = None,
        data_name: str = "",
        allow_app_keys: bool = True,
    ) -> None:
        config = dict(run_config or {})
        parts = OwnParts(model=model, model_name=model_name, model_card=model_card, data_name=data_name,
                         allow_app_keys=allow_app_keys)  # fmt: skip
        try:
            if self.method:
                named = str(config.setdefault("strategy", self.method))
                if named != self.method:
                    raise ConfigError(f"run config key 'strategy': {named!r} given to {type(self).__name__}, "
                                      f"which runs {self.method!r}; drop the key or build message_strategy({named!r})")
            method, checkpoint, settings = run_method(config, parts)
        except ConfigError as err:
            refused(err, config, parts)
            raise
        super().__init__(method=method, checkpoint=checkpoint, pull_interval=settings.execution.pull_interval,
                         overlap_rounds=settings.execution.overlap_rounds)  # fmt: skip


def run_on_grid(grid: Grid, run_config: Mapping[str, object], parts: OwnParts) -> None:
    """The run ``run_config`` names: its method's strategy started on ``grid`` (what stamen's ServerApp runs)."""
    try:
        strategy_class = message_strategy(str(RunSettings.from_config(run_config).strategy))
    except ConfigError as err:
        refused(err, run_config, parts)
        raise
    strategy = strategy_class(run_config=run_config, model=parts.model, model_name=parts.model_name,
                              model_card=parts.model_card, data_name=parts.data_name,
                              allow_app_keys=parts.allow_app_keys)  # fmt: skip
    strategy.start(grid=grid)


@cache
def message_strategy(name: str) -> type[MethodStrategy]:
    """The Message API strategy class of the registered method ``name`` (the ``strategy`` key's value).

    Raises
    ------
    ConfigError
        For a name no method has, listing those that exist.

    """
    method = method_named(name)
    server = method.server
    doc = (f"stamen's ``{name}`` as a Flower Message API strategy (:class:`MethodStrategy`); the server's maths "
           f"is :class:`{server.__module__}.{server.__name__}` with {name}'s contract.")  # fmt: skip
    return type(method.class_name, (MethodStrategy,), {"method": name, "__doc__": doc, "__module__": __name__})


# the built-in methods by their class names (stamen.PerFedAvg, ...); a method added to the registry has its class
# from message_strategy(name)
FedAvg = message_strategy("fedavg")
PerFedAvg = message_strategy("perfedavg")
Fathom = message_strategy("fathom")
Diffusion = message_strategy("diffusion")
FedProx = message_strategy("fedprox")
Ditto = message_strategy("ditto")
Scaffold = message_strategy("scaffold")
FedRep = message_strategy("fedrep")
FedPer = message_strategy("fedper")
PFedMe = message_strategy("pfedme")
Apfl = message_strategy("apfl")
FedBN = message_strategy("fedbn")
Moon = message_strategy("moon")
FedAmp = message_strategy("fedamp")
FedProto = message_strategy("fedproto")
