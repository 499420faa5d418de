"""Build stamen's wheel as one top-level package, ``stamen``.

A Flower app runs from its own folder: ``flwr run .`` bundles the folder and puts it
first on ``sys.path`` in every ServerApp and ClientApp process, and the tests, the
benchmarks and ``python -m app.local.deployment`` run from the clone too. So the four folders
``app``, ``strategies``, ``clients`` and ``datasets`` never need to be installed under
those generic names, and installing them there overwrote HuggingFace ``datasets``
(which flwr-datasets needs) and any other app's ``app``.

What a wheel is for is other code importing stamen: a user's own Flower app that
extends its strategies and clients. This hook gives it a collision-free name: it copies
the four folders to ``stamen/<folder>`` and rewrites their absolute imports
(``from strategies.base import X`` -> ``from stamen.strategies.base import X``), as
pip's vendoring tool does for the libraries pip ships. The clone keeps its short
imports; the wheel holds nothing but ``stamen/``. docs/installing.md says why.
"""

from __future__ import annotations

import ast
import re
import shutil
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGES = ("app", "strategies", "clients", "datasets")
IMPORT_ROOT = "stamen"

PUBLIC_SURFACE = "app/api.py"  # what `import stamen` offers: its __all__, loaded on first use

INIT = '''"""stamen, installed: Per-FedAvg, FATHOM, diffusion and the other methods as Flower strategies.

The public surface (docs/own-app.md) is this package's ``__all__``: the methods by name,
the settings parser, and ``build_server_app`` / ``build_client_app``, which build a Flower
``ServerApp`` and ``ClientApp`` from your own model and data. The names are loaded on
first use, so ``import stamen.app.device.console`` stays as light as it was. The rest of stamen is
importable as ``stamen.strategies``, ``stamen.clients``, ``stamen.datasets`` and
``stamen.app``; in a clone the same code sits in the top-level folders (docs/installing.md).
"""

__all__ = {names!r}


def __getattr__(name: str) -> object:
    if name in __all__:
        from stamen.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'stamen' has no attribute {{name!r}}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
'''


def public_names(source_root: Path) -> list[str]:
    """The ``__all__`` of the public surface module, read without importing it (it imports torch and flwr)."""
    tree = ast.parse((source_root / PUBLIC_SURFACE).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise ValueError(f"{PUBLIC_SURFACE} has no literal __all__")


def rewrite_imports(source: str, *, filename: str = "<source>") -> str:
    """``source`` with every absolute import of stamen's packages moved under ``stamen.``.

    Only ``from <package>[.module] import ...`` statements are rewritten, which is the one
    form stamen's code uses; a plain ``import <package>`` would bind the short name,
    which the installed copy does not have, so it is refused with the file named.
    """
    lines = source.splitlines(keepends=True)
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] in PACKAGES for alias in node.names):
            raise ValueError(
                f"{filename}:{node.lineno}: write `from {node.names[0].name} import ...`; a plain "
                f"`import {node.names[0].name}` cannot be rewritten under {IMPORT_ROOT}."
            )
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            index = node.lineno - 1
            pattern = rf"\bfrom(\s+){re.escape(node.module)}\b"
            rewritten, count = re.subn(pattern, rf"from\g<1>{IMPORT_ROOT}.{node.module}", lines[index], count=1)
            if count != 1:
                raise ValueError(f"{filename}:{node.lineno}: cannot find `from {node.module}` on its line")
            lines[index] = rewritten
    return "".join(lines)


def write_import_root(*, source_root: Path, target: Path) -> None:
    """Copy the four packages from ``source_root`` to ``target/stamen/`` with rewritten imports."""
    root = target / IMPORT_ROOT
    root.mkdir(parents=True)
    (root / "__init__.py").write_text(INIT.format(names=public_names(source_root)))
    for package in PACKAGES:
        for path in sorted((source_root / package).rglob("*")):
            if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            destination = root / path.relative_to(source_root)
            destination.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".py":
                destination.write_text(rewrite_imports(path.read_text(), filename=str(path.relative_to(source_root))))
            else:
                shutil.copyfile(path, destination)


class StamenImportRootHook(BuildHookInterface):
    """Adds the generated ``stamen/`` to the wheel (standard and editable alike)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        self._generated = tempfile.TemporaryDirectory(prefix="stamen-wheel-")
        write_import_root(source_root=Path(self.root), target=Path(self._generated.name))
        generated = str(Path(self._generated.name) / IMPORT_ROOT)
        # An editable install gets the same copy: a .pth pointing at the clone would put its
        # top-level `datasets` ahead of HuggingFace's in every process of the environment.
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data[key][generated] = IMPORT_ROOT

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        generated = getattr(self, "_generated", None)
        if generated is not None:
            generated.cleanup()
