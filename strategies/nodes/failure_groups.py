"""Failures described in one line and grouped by cause, for the preflight and for every round alike.

A hundred nodes that fail the same way must make one line, not a hundred: the text of a
failure often carries the node's id (random 64-bit numbers) and Flower wraps a client's
exception in a sentence of its own (read back by :func:`strategies.nodes.failures.client_error`).
:func:`cause_of` reduces a failure's text to its cause; :func:`group_by_cause` counts them,
naming the partitions that failed as ranges. :func:`problem_of` and :func:`scope_of` read
a node's answer to the preflight as a failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from strategies.contracts.client_reports import PREFLIGHT_ERROR, PREFLIGHT_SCOPE
from strategies.contracts.payload import Scalar
from strategies.nodes.failures import client_error
from strategies.nodes.text import PROBLEM_CHARS, escaped

LISTED_CLIENTS = 6  # a failure group names this many clients (partitions as ranges), then "..."
NODE_ID = re.compile(r"\b(node|Node|node_id|node id)( ?[=:]? ?)\d{6,}\b")  # Flower's node ids: 64-bit integers
LONG_NUMBER = re.compile(r"\b\d{12,}\b")


def cause_of(text: str) -> str:
    """The cause a failure's ``text`` states, with node ids taken out and Flower's wrapping read.

    >>> cause_of("Message contains an Error (reason: <class 'RuntimeError'>:<'no GPU on node 123456789'>). "
    ...          "It originated during client-side execution of a message.")
    'RuntimeError: no GPU on node <id> (raised in the ClientApp)'
    """
    raised = client_error(text)
    if raised:
        text = f"{raised[0]}: {raised[1]} (raised in the ClientApp)"
    text = NODE_ID.sub(lambda m: f"{m.group(1)}{m.group(2)}<id>", " ".join(text.split()))
    return LONG_NUMBER.sub("<id>", text)


def by_cause(failures: Iterable[tuple[int | str, str]]) -> list[tuple[str, list[int | str]]]:
    """``(who, failure text)`` pairs -> ``(cause, every who)`` per cause (:func:`cause_of`), most common first."""
    groups: dict[str, list[int | str]] = {}
    for who, text in failures:
        groups.setdefault(cause_of(text), []).append(who)
    return sorted(groups.items(), key=lambda item: -len(item[1]))


def first_of(names: list[str], listed: int) -> list[str]:
    """The first ``listed`` of ``names``, then ``"..."`` when there are more."""
    return names[:listed] + (["..."] if len(names) > listed else [])


def ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    spans: list[list[int]] = []
    for number in sorted(set(numbers)):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def group_by_cause(failures: Iterable[tuple[int | str, str]], listed: int = LISTED_CLIENTS) -> list[dict[str, object]]:
    """``(who, failure text)`` pairs -> one group per cause, most common first: ``cause``, ``count``, first ``clients``.

    ``who`` is a partition number or a label; a group names its partitions first, as
    ranges (``partitions 0-2, 5``), then its labels in the order they came, the first
    ``listed`` of them.
    """
    groups = []
    for cause, who in by_cause(failures):
        partitions = [w for w in who if isinstance(w, int)]
        plural = "s" if len(partitions) > 1 else ""
        named = [f"partition{plural} {ranges(partitions)}"] if partitions else []
        named += [w for w in who if isinstance(w, str)]
        groups.append({"cause": cause, "count": len(who), "clients": first_of(named, listed)})
    return groups


def problem_of(answer: dict[str, Scalar] | Exception) -> str | None:
    """Why a node's answer means it cannot start (one line, escaped: the node wrote it), or ``None`` if it can."""
    if isinstance(answer, Exception):
        # Flower's error carries the client's traceback; its last line names the exception
        lines = [line.strip() for line in str(answer).splitlines() if line.strip()]
        return escaped(lines[-1], PROBLEM_CHARS) if lines else type(answer).__name__
    error = answer.get(PREFLIGHT_ERROR)
    return escaped(error, PROBLEM_CHARS) if error else None


def scope_of(answer: dict[str, Scalar] | Exception) -> str:
    """``node`` when a node's answer blames its own data, else ``run``."""
    return "run" if isinstance(answer, Exception) else str(answer.get(PREFLIGHT_SCOPE, "run"))
