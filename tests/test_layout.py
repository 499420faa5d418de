"""The dependency direction of docs/architecture.md, checked on every import statement of the packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

PACKAGES = ("app", "strategies", "clients", "datasets")
FLOWER_ROOM = "strategies.flower"  # the one place of strategies/ that imports Flower's message types
FLOWER_LOGGER = "flwr.common.logger"  # Flower's log function, not a type: every room logs through it
# package (or subpackage) -> top-level modules it must not import
FORBIDDEN = {
    "datasets": ("app", "strategies", "clients", "flwr", "torch"),
    "strategies.contracts": ("app", "clients", "flwr", "torch"),
    "strategies": ("app", "clients", "torch"),
    "clients": ("app",),
}


def imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def modules():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield ".".join(path.relative_to(REPO).with_suffix("").parts), path


@pytest.mark.parametrize(("module", "path"), list(modules()), ids=lambda value: str(value))
def test_imports_follow_the_dependency_direction(module, path):
    owner = max((p for p in FORBIDDEN if module == p or module.startswith(p + ".")), key=len, default=None)
    imported = imports_of(path)
    if owner is not None:
        bad = [name for name in imported if name.split(".")[0] in FORBIDDEN[owner]]
        assert not bad, f"{module} imports {bad}; {owner} must not import {FORBIDDEN[owner]}"
    if module.startswith("strategies.") and not module.startswith(FLOWER_ROOM):  # Flower's types: one room only
        bad = [n for n in imported if n.split(".")[0] == "flwr" and n != FLOWER_LOGGER]
        assert not bad, f"{module} imports {bad}; only {FLOWER_ROOM} imports Flower (its logger aside)"
    if module.startswith("clients."):  # a client may read its method's contract and nothing else of the server's
        bad = [n for n in imported if n.startswith("strategies") and not n.startswith("strategies.contracts")]
        assert not bad, f"{module} imports {bad}; clients import only strategies.contracts"
    assert not [name for name in imported if name.split(".")[0] == "flwr_datasets"], "flwr_datasets would be shadowed"


def app_imports(path: Path, app_modules: set[str]) -> set[str]:
    """The app modules ``path`` imports: its import statements, anywhere in the file, and ``import_module("app.x")``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "app":
            found |= {f"app.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            found |= {arg.value for arg in node.args if isinstance(arg, ast.Constant)}
    found |= set(imports_of(path))
    return found & app_modules


def test_the_app_package_has_no_import_cycles():
    paths = {f"app.{path.stem}": path for path in (REPO / "app").glob("*.py") if path.stem != "__init__"}
    graph = {module: app_imports(path, set(paths)) for module, path in paths.items()}
    cycles = []

    def visit(module: str, trail: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in trail:
                cycles.append(" -> ".join([*trail[trail.index(imported):], imported]))
            elif imported not in done:
                visit(imported, [*trail, imported])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert not cycles, f"app/ must read top-down; import cycles: {sorted(set(cycles))}"
