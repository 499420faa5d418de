"""One registry rule shared by the registries of methods and models: each name once (pure Python)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def named_once(items: Iterable[T], name_of: Callable[[T], str], kind: str) -> dict[str, T]:
    """``{name: item}`` in the items' order, refusing two ``kind`` of one name (``two models are named 'x'``)."""
    named: dict[str, T] = {}
    for item in items:
        name = name_of(item)
        if name in named:
            raise ValueError(f"two {kind} are named {name!r}")
        named[name] = item
    return named
