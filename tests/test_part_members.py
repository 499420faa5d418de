"""The strategy's parts read only what they define or are handed (issue 53: parts as real members).

A part still written as a mixin of :class:`strategies.base.FederatedStrategy` reads
attributes that another part or the base defines on the shared ``self``; this lists, per
part, every ``self.<name>`` it reads but neither assigns nor defines, by reading its
source. A part made a member (its inputs as arguments) must read none; a mixin's list may
only shrink: a new name here is a new hidden dependency, to be passed in instead.
"""

from __future__ import annotations

import ast

import pytest
from conftest import REPO

# part -> the attributes it reads from the shared self today (the allowance only shrinks)
MIXIN_READS = {
    ("flower_api.py", "FlowerApi"): {
        "_encoded", "_use_shared", "begin_round", "central_evaluation", "class_names", "combine",
        "contract", "evaluate_config", "evaluate_specs", "fit_specs", "global_model", "global_parameters",
        "global_shared", "hyperparameters", "name", "nodes", "num_rounds", "parameters_for", "payload_for",
        "recorder", "reply_screen", "sample_evaluate", "sample_fit", "screen_fit", "settings", "shared", "start",
        "started", "timing", "tuner"},
    ("global_model.py", "GlobalModelPart"): {"contract", "method", "parameters_for", "shared"},
    # its divergence state is a member now (strategy.divergence), read here instead of two counters of its own
    ("run_watch.py", "RunWatch"): {"_use_model", "checkpoint", "class_names", "contract", "divergence",
                                   "failure_groups", "finish", "history", "in_force", "name", "nodes", "num_rounds",
                                   "recorder", "sent_model", "settings", "started", "timing"},
}  # fmt: skip
MEMBERS = [("run_checkpoints.py", "RunCheckpoints"), ("reply_screen.py", "ReplyScreen"),
           ("update_screen.py", "UpdateNormScreen"), ("divergence.py", "DivergenceWatch"),
           ("message_strategy.py", "MessageStrategy")]  # the Message API adapter: a member over the strategy


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


@pytest.mark.parametrize(("file", "name"), list(MIXIN_READS))
def test_a_mixin_part_reads_no_new_attribute_of_the_shared_self(file, name):
    new = reads_not_defined(file, name) - MIXIN_READS[file, name]
    assert not new, f"{name} reads {sorted(new)} from another part: hand them in instead"


def test_the_checker_sees_a_hidden_read_and_nothing_else():
    source = ("class Part:\n    kind = 'x'\n    def f(self):\n        self.own = 1\n"
              "        return self.own + self.elsewhere + self.g() + len(self.kind)\n"
              "    def g(self):\n        return 0\n")
    assert reads_not_defined("", "Part", source) == {"elsewhere"}
