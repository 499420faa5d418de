"""The test suite's own layout: what test modules share lives in tests/helpers.py or conftest, not in each other."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (top-level or inside a function), by its dotted name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_test_module_imports_another():
    test_modules = {path.stem for path in TESTS.glob("test_*.py")}
    offenders = {}
    for path in sorted(TESTS.glob("test_*.py")):
        taken = {name for name in imported_modules(path) if name.removeprefix("tests.") in test_modules}
        if taken:
            offenders[path.name] = sorted(taken)
    assert offenders == {}, f"move what these take from other test modules to tests/helpers.py: {offenders}"
