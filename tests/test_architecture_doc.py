"""docs/architecture.md's hook table against the code: which registered methods override which hook.

The table drifted once (it named FATHOM for hooks FATHOM never overrides); this test
makes the code the source of the column "overridden by", so adding a method or an
override without updating the table fails here.
"""

import re
from pathlib import Path

import pytest

from app.registry import METHODS
from strategies.base import FederatedStrategy

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(?P<hook>\w+)\(.*?\)` \|(?P<cells>.*)\|$")


def table_rows() -> dict[str, str]:
    """Each hook row of the table: the hook's name -> its "overridden by" cell."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## The strategy's hooks", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if match := ROW.match(line):
            rows[match["hook"]] = match["cells"].split("|")[-1]
    return rows


def overriding(hook: str) -> set[str]:
    """The registered methods whose server class (or a class between it and the base) defines ``hook``."""
    names = set()
    for name, method in METHODS.items():
        for cls in method.server.__mro__:
            if cls is FederatedStrategy:
                break
            if hook in vars(cls):
                names.add(name)
                break
    return names


def named_methods(cell: str) -> set[str]:
    return {word for word in re.findall(r"`([^`]+)`", cell) if word in METHODS}


def test_the_table_has_rows_for_the_hooks():
    assert len(table_rows()) >= 10, "docs/architecture.md's hook table was not found or lost its rows"


@pytest.mark.parametrize("hook", sorted(table_rows()))
def test_each_row_names_a_real_hook_and_exactly_the_methods_overriding_it(hook):
    assert callable(getattr(FederatedStrategy, hook, None)), f"the table names {hook}(), which the base lacks"
    assert named_methods(table_rows()[hook]) == overriding(hook), (
        f"docs/architecture.md: the row for {hook}() must name the methods overriding it"
    )


def test_every_overridden_hook_has_a_row():
    public = {
        attribute
        for method in METHODS.values()
        for cls in method.server.__mro__[: method.server.__mro__.index(FederatedStrategy)]
        for attribute, value in vars(cls).items()
        if callable(value) and not attribute.startswith("_") and hasattr(FederatedStrategy, attribute)
    }
    assert public - set(table_rows()) == set(), "hooks overridden by a method but missing from the table"
