"""A node that runs other stamen code than the server: its preflight answer turned into a refusal.

The server compares each node's code fingerprint with its own (``strategies/contracts/code.py``).
A deployed device running other code is left out (only it is stale); simulated clients running
other code mean that the run itself mixes two stamens, and it stops.
"""

from __future__ import annotations

from strategies.contracts.client_reports import PREFLIGHT_DETAIL, PREFLIGHT_ERROR, PREFLIGHT_SCOPE, RAY_NODE
from strategies.contracts.code import CODE_FINGERPRINT, CODE_LOCATION, code_mismatch
from strategies.contracts.payload import Scalar

STALE = "stale code"  # the preflight detail of a node refused for running other stamen code
RUN_HINT = (
    ": a run must not mix two versions of stamen. With `flwr run .` this means a local SuperLink started in another "
    "folder serves this run and its clients import that folder's code; stop that SuperLink or give this run its own "
    "(docs/troubleshooting.md#two-checkouts has the commands)"
)
DEVICE_HINT = ": this device is left out; restart its SuperNode so that it runs the app of this run"


def screen_code(answer: dict[str, Scalar] | Exception, code: dict[str, str]) -> dict[str, Scalar] | Exception:
    """``answer``, or a problem answer when the node runs other stamen code than the server (``code``).

    A deployed node (one not simulated on Ray) that runs other code is left out
    (scope ``node``): only that device is stale. A simulated node means that the run
    itself mixes code (scope ``run``: it stops).
    """
    if isinstance(answer, Exception):
        return answer
    mismatch = code_mismatch(answer, fingerprint=code[CODE_FINGERPRINT], location=code[CODE_LOCATION])
    if mismatch is None:
        return answer
    device = not answer.get(RAY_NODE)
    return {**answer, PREFLIGHT_ERROR: mismatch + (DEVICE_HINT if device else RUN_HINT),
            PREFLIGHT_SCOPE: "node" if device else "run", PREFLIGHT_DETAIL: STALE}  # fmt: skip


def is_stale_run(answer: dict[str, Scalar] | Exception) -> bool:
    """Whether ``answer`` is :func:`screen_code`'s refusal of a run that mixes two stamens."""
    return isinstance(answer, dict) and answer.get(PREFLIGHT_DETAIL) == STALE and answer.get(PREFLIGHT_SCOPE) == "run"
