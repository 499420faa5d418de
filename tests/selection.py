"""Which runs a module-scoped fixture must make, from the tests pytest selected (``-k fedbn`` runs FedBN's alone).

The end-to-end modules make every run in one fixture (one SuperLink, runs submitted
ahead). A run is needed when a selected test of the module names it: a test parametrized
over the registry by its parameter, any other test by the runs it declares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

# The methods the end-to-end tiers run through Flower's engine and a TLS deployment: one for each kind of message
# and state a transport could break (meta-learning metrics, a tuner's config, array sets beside the model, no model
# at all, personal layers kept home, Context.state across rounds, the preflight's node map). The transport does
# not depend on the method otherwise; every registered method runs its rounds in-process through Flower's encoding
# byte for byte (tests/test_models.py, test_every_method_runs_two_in_process_rounds_on_the_batchnorm_cnn), so the
# e2e tiers no longer grow by about 25 s with each method added.
TRANSPORT_METHODS = ("perfedavg", "fedavg", "fathom", "scaffold", "fedproto", "fedrep", "ditto", "diffusion")


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
