"""Which runs a module-scoped fixture must make, from the tests pytest selected (``-k fedbn`` runs FedBN's alone).

The end-to-end modules make every run in one fixture (one SuperLink, runs submitted
ahead). A run is needed when a selected test of the module names it: a test parametrized
over the registry by its parameter, any other test by the runs it declares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

# The methods the Ray simulation and the TLS deployment run: the transport does not depend on the method, so a fixed
# trio, one per kind of message: fedavg (the model alone), scaffold (array sets beside the model) and fedproto (no
# model travelling at all). Every registered method runs two rounds in-process through Flower's encoding byte for byte,
# its records, declared metrics, bytes and personal arrays checked by its contract (tests/test_methods.py), so the
# end-to-end tiers do not grow with the registry.
TRANSPORT_METHODS = ("fedavg", "scaffold", "fedproto")


def selected_runs(request: pytest.FixtureRequest, param: str, declared: Mapping[str, Iterable[str]]) -> set[str]:
    """The run names the selected tests of ``request``'s module need.

    Parameters
    ----------
    request
        The fixture's request.
    param
        The name of the parameter that names a run (``name``, ``strategy``).
    declared
        Test function name -> the runs it reads, for the tests without that parameter.

    """
    wanted: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and param in callspec.params:
            wanted.add(callspec.params[param])
        else:
            wanted.update(declared.get(item.originalname, ()))
    return wanted
