"""The tree as docs/architecture.md draws it, and the rooms' rules: no legacy Flower type, file sizes, the top.

The layout block of docs/architecture.md names every module of ``app/``, ``strategies/`` and
``clients/`` in its folder (a method's contract and client once, as ``<method>.py``); a
module it omits, or one it names that is gone, fails here. No legacy Flower type is left
(that only ``strategies/flower/`` imports Flower is tests/test_layout.py's); no file of
app/, strategies/ or clients/ is over 300 lines; ``strategies/`` keeps at most 10 entries
at its top.
"""

from __future__ import annotations

import re

from conftest import REPO

DOC = REPO / "docs" / "architecture.md"
DRAWN = ("app", "strategies", "clients")  # the packages whose every module the layout names (datasets/ in summary)
ENTRY = re.compile(r"^( *)(\S+?(?:\.py|/))(?:\s|$)")
MAX_LINES = 300


def drawn_tree(text: str) -> set[str]:
    """The paths the layout block names: folders end in ``/``; an entry's folder is the one above it by indentation."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    paths, folders = set(), []
    for line in block.splitlines():
        match = ENTRY.match(line)
        if not match or len(match.group(1)) >= 22:  # a description's continuation, not an entry
            continue
        depth, name = len(match.group(1)) // 2, match.group(2)
        folders = folders[:depth]
        path = "".join(folders) + name
        paths.add(path)
        if name.endswith("/"):
            folders.append(name)
    return paths


def actual_tree() -> set[str]:
    paths = set()
    for package in DRAWN:
        for path in (REPO / package).rglob("*.py"):
            relative = path.relative_to(REPO)
            if path.name in ("__init__.py", "__main__.py") or "__pycache__" in relative.parts:
                continue
            paths.add(relative.as_posix())
            paths |= {f"{parent.as_posix()}/" for parent in relative.parents if parent.as_posix() not in (".",)}
    return paths


def method_contract(path: str) -> bool:
    """A method's contract or client, which the layout names once as ``<method>.py`` in its folder."""
    methods = {p.stem for p in (REPO / "strategies" / "contracts").glob("*.py")} - SHARED_CONTRACT_FILES
    folder, _, name = path.rpartition("/")
    return folder in ("strategies/contracts", "clients") and name.removesuffix(".py") in methods


SHARED_CONTRACT_FILES = {"__init__", "keys", "contract", "payload", "personal", "models", "code", "common",
                         "client_reports", "settings", "naming"}  # fmt: skip


def test_the_layout_in_architecture_md_is_the_tree():
    drawn = drawn_tree(DOC.read_text())
    actual = actual_tree()
    missing = sorted(p for p in actual - drawn if not method_contract(p))
    gone = sorted(p for p in drawn - actual if p.split("/")[0] in DRAWN and "<method>" not in p)
    assert not missing, f"docs/architecture.md's layout omits {missing}"
    assert not gone, f"docs/architecture.md's layout names what is not there: {gone}"


def test_the_layout_reader_finds_entries_folders_and_skips_descriptions():
    text = ("## Layout\n\n```\napp/                  the root\n  api.py              x\n  config/             y\n"
            "    keys.py           z\n                      a continuation.py naming a file\n  other.py  w\n```\n")
    assert drawn_tree(text) == {"app/", "app/api.py", "app/config/", "app/config/keys.py", "app/other.py"}


def test_no_legacy_flower_type_is_left_in_the_packages():
    legacy = re.compile(r"FitIns|FitRes|ClientProxy|ClientManager|flwr\.server\.strategy|flwr\.compat")
    found = sorted(path.relative_to(REPO).as_posix() for package in ("strategies", "app", "clients")
                   for path in (REPO / package).rglob("*.py") if legacy.search(path.read_text()))  # fmt: skip
    assert found == [], f"Flower's legacy API in {found}"


def test_no_file_of_app_strategies_or_clients_is_over_300_lines():
    long = {path.relative_to(REPO).as_posix(): n for package in ("app", "strategies", "clients")
            for path in (REPO / package).rglob("*.py") if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split by concern: {long}"


def test_strategies_keeps_at_most_ten_entries_at_its_top():
    top = sorted(p.name for p in (REPO / "strategies").iterdir() if p.name != "__pycache__")
    assert len(top) <= 10, top
