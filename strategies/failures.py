"""Failures grouped by cause, whatever the federation's size: pure functions over their texts (no Flower).

A hundred nodes that fail the same way must make one line, not a hundred: the text of a
failure often carries the node's id (random 64-bit numbers) and Flower wraps a client's
exception in a sentence of its own. :func:`cause_of` reduces a failure's text to its cause;
:func:`group_by_cause` counts them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeVar

W = TypeVar("W")  # who failed: a label, or a partition number

# Flower's wrapping of an exception raised in a ClientApp: the reason is "<class 'X'>:<'message'>"
FLOWER_WRAPPED = re.compile(
    r"Message contains an Error \(reason: <class '(?:[\w.]+\.)?(\w+)'>:<'?(.*?)'?>\)\. It originated during "
    r"client-side execution of a message\.",
    re.DOTALL,
)
NODE_ID = re.compile(r"\b(node|Node|node_id|node id)( ?[=:]? ?)\d{6,}\b")  # Flower's node ids: 64-bit integers
LONG_NUMBER = re.compile(r"\b\d{12,}\b")


def cause_of(text: str) -> str:
    """The cause a failure's ``text`` states, with node ids taken out and Flower's wrapping read.

    >>> cause_of("Message contains an Error (reason: <class 'RuntimeError'>:<'no GPU on node 123456789'>). "
    ...          "It originated during client-side execution of a message.")
    'RuntimeError: no GPU on node <id> (raised in the ClientApp)'
    """
    wrapped = FLOWER_WRAPPED.search(text)
    if wrapped:
        text = f"{wrapped.group(1)}: {wrapped.group(2)} (raised in the ClientApp)"
    text = NODE_ID.sub(lambda m: f"{m.group(1)}{m.group(2)}<id>", " ".join(text.split()))
    return LONG_NUMBER.sub("<id>", text)


def by_cause(failures: Iterable[tuple[W, str]]) -> list[tuple[str, list[W]]]:
    """``(who, failure text)`` pairs -> ``(cause, every who)`` per cause (:func:`cause_of`), most common first."""
    groups: dict[str, list[W]] = {}
    for who, text in failures:
        groups.setdefault(cause_of(text), []).append(who)
    return sorted(groups.items(), key=lambda item: -len(item[1]))


def first_of(names: list[str], listed: int) -> list[str]:
    """The first ``listed`` of ``names``, then ``"..."`` when there are more."""
    return names[:listed] + (["..."] if len(names) > listed else [])


def group_by_cause(failures: Iterable[tuple[str, str]], listed: int = 6) -> list[dict[str, object]]:
    """``(who, failure text)`` pairs -> one group per cause, most common first: ``cause``, ``count``, first ``who``."""
    return [{"cause": cause, "count": len(who), "clients": first_of(who, listed)} for cause, who in by_cause(failures)]
