"""bench/'s layout: one file puts the repository on sys.path, and scripts import only the shared modules."""

from __future__ import annotations

import ast
import json
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


def test_no_script_puts_the_repository_on_sys_path_nor_bootstraps():
    """Scripts run as ``python -m bench.<name>`` from the root: none edits ``sys.path`` or imports ``harness`` bare."""
    for name, tree in trees().items():
        inserting = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                     and ast.unparse(node.func) in ("sys.path.insert", "sys.path.append")]  # fmt: skip
        assert not inserting, f"bench/{name}.py edits sys.path"
        bare = [node for node in ast.walk(tree) if isinstance(node, ast.Import)
                and any(alias.name == "harness" for alias in node.names)]  # fmt: skip
        assert not bare, f"bench/{name}.py imports harness by its short name (the python bench/x.py bootstrap)"


def test_a_script_that_runs_itself_again_does_so_as_a_module():
    for name, tree in trees().items():
        again = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.List)
                 and any(ast.unparse(item) == "__file__" for item in node.elts)]  # fmt: skip
        assert not again, f"bench/{name}.py runs itself as a file: {again}; use harness.script_command(__file__)"


def calls(tree: ast.Module) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def test_the_shared_flags_and_the_quick_redirect_live_in_the_harness():
    shared = {"--quick", "--out", "--report-only"}
    for name, tree in trees().items():
        if name == "harness":
            continue
        own = {node.args[0].value for node in calls(tree)
               if ast.unparse(node.func).endswith("add_argument") and node.args
               and isinstance(node.args[0], ast.Constant) and node.args[0].value in shared}  # fmt: skip
        assert own == set(), f"bench/{name}.py adds {sorted(own)} itself: take them from harness.arguments()"
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert "QUICK_RESULTS" not in used, f"bench/{name}.py redirects --quick itself: harness.arguments() does"
        constant = [ast.unparse(node) for node in calls(tree)
                    if ast.unparse(node.func).endswith("results_folder") and node.args
                    and isinstance(node.args[0], ast.Constant)]  # fmt: skip
        assert constant == [], f"bench/{name}.py picks the quick folder itself: {constant}"


def test_the_harness_alone_stamps_machine_and_date_and_knows_the_app_dir():
    for name, tree in trees().items():
        if name == "harness":
            continue
        names = {ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        clock = sorted(n for n in names if n.startswith("platform.") or n == "time.strftime")
        assert clock == [], f"bench/{name}.py reads {clock}: a report's machine and date are harness.stamp()'s"
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
                    for alias in node.names}  # fmt: skip
        assert {"platform", "strftime"} & imported == set(), f"bench/{name}.py imports platform or strftime"
        built = [ast.unparse(node) for node in calls(tree) if ast.unparse(node.func) == "LocalSimulation"]
        assert built == [], f"bench/{name}.py builds {built}: harness.local_simulation() knows the app"


def test_quick_sends_the_named_paths_to_the_ignored_folder(tmp_path):
    from bench import harness

    parser = harness.arguments("B0: a test.\n", out="b0.json", quick="fast", report_only=True, redirect=("out", "log"))
    parser.add_argument("--log", type=Path, default=tmp_path / "b0_runs.jsonl")
    plain, quick = parser.parse_args([]), parser.parse_args(["--quick", "--out", str(tmp_path / "mine.json")])
    assert (plain.out, plain.log, plain.report_only) == (harness.RESULTS / "b0.json", tmp_path / "b0_runs.jsonl", False)
    assert (quick.out, quick.log) == (harness.QUICK_RESULTS / "mine.json", harness.QUICK_RESULTS / "b0_runs.jsonl")
    own = harness.arguments("B0\n", out="b0.json", quick_flag="cpu_only")
    own.add_argument("--cpu-only", action="store_true")
    assert own.parse_args(["--cpu-only"]).out == harness.QUICK_RESULTS / "b0.json"
    assert not hasattr(harness.arguments("B0\n").parse_args([]), "out")


def test_a_rebuilt_report_keeps_its_machine_and_date_and_its_place(tmp_path):
    from bench import harness

    previous = {"machine": "then", "date": "2026-01-01"}
    report = {"benchmark": "B0", **harness.stamp(previous), "rows": [1]}
    harness.write_report(tmp_path / "b0.json", report, "| table |\n", indent=1)
    assert (tmp_path / "b0.json").read_text() == json.dumps(report, indent=1) + "\n"
    assert list(json.loads((tmp_path / "b0.json").read_text())) == ["benchmark", "machine", "date", "rows"]
    assert (tmp_path / "b0.md").read_text() == "| table |\n"
    harness.write_report(tmp_path / "sub" / "plain.json", {"rows": []}, stamped=False)
    assert (tmp_path / "sub" / "plain.json").read_text() == '{\n  "rows": []\n}\n'
    assert not (tmp_path / "sub" / "plain.md").exists()
