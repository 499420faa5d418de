"""The strategy's parts read only what they define or are handed (issue 53: parts as real members).

Each part of :class:`strategies.base.FederatedStrategy` is a member built with its inputs
as arguments. A part written as a mixin on the strategy's shared ``self`` would read
attributes another part defines; this reads each part's source and lists every
``self.<name>`` it reads but neither assigns nor defines: there must be none. A new
name here is a hidden dependency, to be passed in instead.
"""

from __future__ import annotations

import ast

import pytest
from conftest import REPO

# every part of a strategy, each a member handed its inputs: none may read an attribute it does not define
MEMBERS = [("rounds/phases.py", "RoundPhases"), ("rounds/global_model.py", "GlobalModel"),
           ("rounds/run_watch.py", "RunWatch"), ("rounds/run_checkpoints.py", "RunCheckpoints"),
           ("screening/reply_screen.py", "ReplyScreen"), ("screening/update_screen.py", "UpdateNormScreen"),
           ("rounds/divergence.py", "DivergenceWatch"), ("nodes/directory.py", "NodeDirectory"),
           ("tuning/tuner.py", "FathomTuner"),
           ("flower/rounds.py", "Rounds")]  # the round engine: it holds the method and reads it through its handle


def reads_not_defined(file: str, name: str, source: str | None = None) -> set[str]:
    """``self.<x>`` names the class reads but neither assigns nor defines (methods, properties, class attributes)."""
    tree = ast.parse(source if source is not None else (REPO / "strategies" / file).read_text())
    cls = next(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name)
    defined = {item.name for item in cls.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)}
    for item in cls.body:
        if isinstance(item, ast.Assign | ast.AnnAssign):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            defined |= {target.id for target in targets if isinstance(target, ast.Name)}
    read = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (defined if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    return read - defined


@pytest.mark.parametrize(("file", "name"), MEMBERS)
def test_a_member_part_reads_only_what_it_is_handed(file, name):
    assert reads_not_defined(file, name) == set()


def test_the_checker_sees_a_hidden_read_and_nothing_else():
    source = ("class Part:\n    kind = 'x'\n    def f(self):\n        self.own = 1\n"
              "        return self.own + self.elsewhere + self.g() + len(self.kind)\n"
              "    def g(self):\n        return 0\n")
    assert reads_not_defined("", "Part", source) == {"elsewhere"}
