"""bench/'s layout: one file puts the repository on sys.path, and scripts import only the shared modules."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def is_script(tree: ast.Module) -> bool:
    """Whether a module is run (it has ``if __name__ == "__main__"``) rather than only imported."""
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)


def trees() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text(), filename=str(path)) for path in sorted(BENCH.glob("*.py"))}


def bench_imports(tree: ast.Module) -> set[str]:
    """The bench modules a module imports, at any depth (``bench.x`` and, run as a script, ``x``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found.add(parts[1] if parts[0] == "bench" and len(parts) > 1 else parts[0])
    return found


def test_no_script_imports_another_script():
    modules = trees()
    scripts = {name for name, tree in modules.items() if is_script(tree)}
    assert "harness" in modules and "harness" not in scripts
    imported = {(name, other) for name in scripts for other in bench_imports(modules[name]) & scripts}
    assert imported == set(), "a script imports another: move what they share to a shared module (bench/*_setup.py)"


def test_one_file_puts_the_repository_on_sys_path():
    inserting = sorted(name for name, tree in trees().items()
                       if any(isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.path.insert"
                              for node in ast.walk(tree)))  # fmt: skip
    assert inserting == ["harness"]


def test_every_script_bootstraps_through_the_harness_before_importing_the_repository():
    repository = {"app", "bench", "clients", "datasets", "strategies"}
    for name, tree in trees().items():
        if not is_script(tree):
            continue
        order = [bench_imports(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.If))]
        first = next((i for i, found in enumerate(order) if found & repository), None)
        if first is not None:  # run as `python bench/x.py`, only the harness can put the repository on sys.path
            assert "harness" in set().union(*order[:first]), f"bench/{name}.py imports the repository before harness"
