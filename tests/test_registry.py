"""Every registered method is built from hooks: none overrides the base classes' engine-facing methods."""

from __future__ import annotations

import pytest

from app.config import parse_settings
from app.registry import METHODS
from app.server_run import build_strategy
from clients.base import TorchClient
from strategies.base import FederatedStrategy

# what the round engine (strategies/flower/rounds.py) calls on the method, and the base's own screening around it;
# the round's steps themselves are the method's phases (strategies/rounds/phases.py), which call the hooks
STRATEGY_METHODS = ("end_round", "adopt_model", "resume", "can_overlap", "fail", "screen_fit", "sent_to")
CLIENT_METHODS = ("fit", "evaluate", "get_parameters", "set_parameters", "get_properties", "receive",
                  "evaluation_reply")  # fmt: skip


def overridden(cls: type, base: type, names: tuple[str, ...]) -> list[str]:
    """The ``names`` that ``cls`` or a class between it and ``base`` defines anew."""
    between = cls.__mro__[: cls.__mro__.index(base)]
    return sorted({name for klass in between for name in vars(klass) if name in names})


def test_the_methods_checked_are_the_base_classes_own():
    # a name the base no longer defines would make the check below pass for nothing
    assert [n for n in STRATEGY_METHODS if not callable(vars(FederatedStrategy).get(n))] == []
    assert [n for n in CLIENT_METHODS if not callable(vars(TorchClient).get(n))] == []


@pytest.mark.parametrize("name", list(METHODS))
def test_no_method_overrides_the_flower_facing_methods_of_the_base_classes(name):
    method = METHODS[name]
    assert overridden(method.server, FederatedStrategy, STRATEGY_METHODS) == [], f"{name}'s server"
    assert overridden(method.client, TorchClient, CLIENT_METHODS) == [], f"{name}'s client"


def test_the_check_sees_an_override_through_an_intermediate_class():
    class Middle(TorchClient):
        def set_parameters(self, parameters):
            pass

    class Leaf(Middle):
        pass

    assert overridden(Leaf, TorchClient, CLIENT_METHODS) == ["set_parameters"]


@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_that_tests_its_own_model_is_sent_no_adaptation_step(name):
    contract = METHODS[name].contract
    strategy = build_strategy(parse_settings({**contract.example, "strategy": name, "adapt-steps": 3}))
    sent = strategy.evaluate_config()["adapt-steps"]
    assert sent == (3 if contract.adapts_at_test else 0), f"{name} sends adapt-steps {sent}"
