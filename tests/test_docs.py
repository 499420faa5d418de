"""The README and docs: every relative link leads to a file, the README stays a front door."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_to_files(page):
    for target, _ in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"the README is {len(lines)} lines; reference material belongs in docs/"
    assert 'pip install ".[test]" && python3 -m pytest -q' in lines
    # tests/test_install.py installs stamen the way quick start 1 does
    quick_start = "pip install . && FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 flwr run ."
    assert any(line.startswith(quick_start) for line in lines)
