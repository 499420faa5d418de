"""Nothing a user wrote is lost or mixed: reused and hostile run names, links, torn records, malformed checkpoints.

Each test drives the ServerApp's own pieces in this process (the method's Message API strategy
built from a run config as ``run_on_grid`` builds it, the result writer, the round engine's
start and a strategy's ``resume``), against run folders
written by a real run (:class:`app.local.inprocess.InProcessRun` with stamen's result
writer), and ends by comparing the earlier files byte for byte.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import FINISHED_CLIENTS as CLIENTS
from helpers import FINISHED_CONFIG as CONFIG
from helpers import FINISHED_ROUNDS as ROUNDS
from helpers import finished_run

from app.config import ConfigError, parse_settings
from app.local.message_grid import InProcessGrid
from app.message_methods import MethodStrategy, message_strategy
from app.own_parts import OwnParts
from app.results.writer import ResultWriter, read_metrics, run_directory
from app.server_run import build_strategy, checkpoint_to_resume
from app.server_run import refused as record_refusal
from strategies.contracts.common import RunSettings
from strategies.flower.rounds import Rounds
from strategies.rounds.checkpoint import CheckpointError, load_checkpoint

STAMEN = OwnParts(allow_app_keys=False)  # stamen's own app


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, bytes]:
    """The files of one finished run, written once for the module: copy them with :func:`earlier_run`."""
    return contents(finished_run(tmp_path_factory.mktemp("finished"), "earlier"))


def earlier_run(finished: dict[str, bytes], results_dir: Path, name: str = "earlier") -> Path:
    run_dir = results_dir / name
    run_dir.mkdir(parents=True)
    for file, data in finished.items():
        (run_dir / file).write_bytes(data)
    return run_dir


def contents(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (not below it) and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def submit(run_config: dict) -> MethodStrategy:
    """What stamen's ServerApp does with a run before its first message (``app.message_methods.run_on_grid``).

    The method's Message API strategy built from the run config (a refused run logs why, in one line); not started.
    """
    try:
        strategy_class = message_strategy(str(RunSettings.from_config(run_config).strategy))
    except ConfigError as err:
        record_refusal(err, run_config, STAMEN)
        raise
    return strategy_class(run_config=run_config, model=STAMEN.model, model_name=STAMEN.model_name,
                          model_card=STAMEN.model_card, data_name=STAMEN.data_name,
                          allow_app_keys=STAMEN.allow_app_keys)  # fmt: skip


def refusal_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# ---------------------------------------------------------------------- a run-name that is taken


@pytest.mark.parametrize("earlier", ["a finished run", "a file of the user's"])
def test_a_taken_run_name_is_refused_in_one_line_and_the_earlier_files_are_left_as_they_were(
        finished, tmp_path, caplog, earlier):  # fmt: skip
    if earlier == "a finished run":
        run_dir = earlier_run(finished, tmp_path)
    else:
        run_dir = tmp_path / "earlier"
        run_dir.mkdir()
        (run_dir / "notes.txt").write_text("my notes on this run\n")
    before = contents(run_dir)
    with pytest.raises(ConfigError) as refused:
        submit({**CONFIG, "results-dir": str(tmp_path), "run-name": "earlier"})
    line = str(refused.value)
    assert line.startswith("run config key 'run-name':") and f"{run_dir} holds an earlier run" in line, line
    assert "pick another run-name" in line and "\n" not in line
    assert ("resume-from=" in line) == (earlier == "a finished run"), line  # resuming is offered only with a checkpoint
    assert len(refusal_lines(caplog)) == 1
    after = contents(run_dir)
    assert {name: after[name] for name in before} == before
    assert all(name.startswith("refused-") for name in set(after) - set(before)), sorted(after)
    if earlier == "a finished run":  # what the line offers: a run resuming from the folder's checkpoint writes there
        resumed = {**CONFIG, "results-dir": str(tmp_path), "run-name": "earlier", "num-server-rounds": ROUNDS + 1,
                   "resume-from": str(run_dir)}  # fmt: skip
        strategy = submit(resumed)
        assert strategy.num_rounds == 1 and strategy.offset == ROUNDS
        assert (run_dir / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]


@pytest.mark.parametrize("resubmission", ["a bad value", "a resume with other settings"])
def test_a_refused_resubmission_never_replaces_the_completed_summary(finished, tmp_path, caplog, resubmission):
    run_dir = earlier_run(finished, tmp_path)
    before = contents(run_dir)
    again = {**CONFIG, "results-dir": str(tmp_path), "run-name": "earlier"}
    again |= {"lr": -1.0} if resubmission == "a bad value" else {"lr": 0.5, "num-server-rounds": 4,
                                                                    "resume-from": str(run_dir)}  # fmt: skip
    with pytest.raises(ConfigError):
        submit(again)
    after = contents(run_dir)
    assert {name: after[name] for name in before} == before
    (record,) = set(after) - set(before)  # the refusal is recorded beside them
    refusal = json.loads(after[record])
    assert record.startswith("refused-") and refusal["refused"] is True and refusal["status"] == "failed"
    assert refusal["reason"] == refusal_lines(caplog)[0].removeprefix("stamen: the run is refused: ")


def test_a_folder_holding_only_a_refusal_takes_the_corrected_run_and_keeps_the_refusal(tmp_path, caplog):
    config = {**CONFIG, "results-dir": str(tmp_path), "run-name": "typo"}
    with pytest.raises(ConfigError):
        submit({**config, "lr": -1.0})
    refusal = (tmp_path / "typo" / "summary.json").read_bytes()
    submit(config)  # corrected: the run takes the folder
    files = contents(tmp_path / "typo")
    kept = [name for name in files if name.startswith("refused-")]
    assert len(kept) == 1 and files[kept[0]] == refusal
    assert "summary.json" not in files and files["metrics.jsonl"] == b""


def test_two_default_named_runs_started_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda *args: "20250101-120000")  # every run starts in that second
    folders = [run_directory(str(tmp_path), "", "fathom-mnist") for _ in range(2)]
    threads = [threading.Thread(target=lambda: folders.append(run_directory(str(tmp_path), "", "fathom-mnist")))
               for _ in range(6)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(folders)) == 8 and all(folder.is_dir() for folder in folders)
    assert folders[:2] == [tmp_path / "fathom-mnist-20250101-120000", tmp_path / "fathom-mnist-20250101-120000-1"]


# --------------------------------------------------------------------------- names that are paths


@pytest.mark.parametrize("name", ["../outside", "..", ".", "a/b", "x\\y", "   ", "tab\tname", "ABSOLUTE"])
def test_a_run_name_that_is_no_folder_name_is_refused_naming_the_key_and_nothing_is_written(tmp_path, caplog, name):
    results = tmp_path / "results"
    name = str(tmp_path / "elsewhere") if name == "ABSOLUTE" else name
    with pytest.raises(ConfigError) as refused:
        submit({**CONFIG, "results-dir": str(results), "run-name": name})
    line = str(refused.value)
    assert line.startswith(f"run config key 'run-name': {name!r}") and "one folder name under results-dir" in line
    assert refusal_lines(caplog) == [f"stamen: the run is refused: {' '.join(line.split())}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [] and not results.exists()


def test_run_name_problem_allows_names_and_only_names():
    from app.results.run_folder import run_name_problem

    for fine in ("", "run-1", "my run", "a..b", "résultats", "x" * 255):
        assert run_name_problem(fine) is None, fine
    for bad in ("../x", "/abs", "a/b", "..", ".", " ", "x\\y", "nul\0", "x" * 256):
        assert run_name_problem(bad).startswith(f"run config key 'run-name': {bad!r}"), bad


# ------------------------------------------------------------------------------- symbolic links


def test_a_run_folder_that_is_a_symbolic_link_is_not_followed(tmp_path, caplog):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    results = tmp_path / "results"
    results.mkdir()
    (results / "linked").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"'run-name': .*linked is a symbolic link"):
        submit({**CONFIG, "results-dir": str(results), "run-name": "linked"})
    assert list(elsewhere.iterdir()) == [] and len(refusal_lines(caplog)) == 1
    with pytest.raises(ConfigError, match="is a symbolic link"):
        ResultWriter(run_dir=results / "linked", settings={})
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("linked", ["summary.json", "metrics.jsonl"])
def test_a_results_file_that_is_a_symbolic_link_is_not_followed(finished, tmp_path, linked):
    run_dir = earlier_run(finished, tmp_path / "results")
    precious = tmp_path / "precious.txt"
    precious.write_bytes(finished[linked])
    (run_dir / linked).unlink()
    (run_dir / linked).symlink_to(precious)
    if linked == "metrics.jsonl":  # a resumed run reads it: refused, not read through the link
        with pytest.raises(ConfigError, match=r"'resume-from': .*metrics.jsonl is a symbolic link"):
            ResultWriter(run_dir=run_dir, settings={}, resume_after=1)
    else:  # a resumed run writes it: the link is replaced, what it pointed to stays
        ResultWriter(run_dir=run_dir, settings={}, resume_after=1).write_summary({"status": "completed"})
        assert not (run_dir / linked).is_symlink()
    assert precious.read_bytes() == finished[linked]


# ------------------------------------------------------------------------- atomic run records


def test_summary_and_run_record_are_written_whole_or_not_at_all(finished, tmp_path, monkeypatch):
    run_dir = earlier_run(finished, tmp_path)

    def killed(*args):
        raise OSError("killed before the rename")

    writer = ResultWriter(run_dir=run_dir, settings={}, resume_after=ROUNDS)
    monkeypatch.setattr(os, "replace", killed)  # the process dies between writing and renaming
    with pytest.raises(OSError, match="killed"):
        writer.write_summary({"status": "failed", "reason": "a newer summary"})
    with pytest.raises(OSError, match="killed"):
        ResultWriter(run_dir=tmp_path / "new", settings={"seed": 0}, provenance={"code": "x"})
    monkeypatch.undo()
    assert contents(run_dir) == finished  # the old summary, whole; no half-written file beside it
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["metrics.jsonl"]  # no run.json, not half a one


# ------------------------------------------------------------------------- torn metrics lines


def test_resume_drops_a_torn_last_line_with_one_warning(finished, tmp_path, caplog):
    run_dir = earlier_run(finished, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    with metrics.open("ab") as handle:  # the server was killed while appending round 3's line
        handle.write(b'{"round": 3, "strategy": "fathom", "train-lo')
    resumed = {**CONFIG, "results-dir": str(tmp_path), "num-server-rounds": ROUNDS + 2, "resume-from": str(run_dir)}
    with caplog.at_level(logging.WARNING):
        submit(resumed)
    assert metrics.read_bytes() == finished["metrics.jsonl"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "cut short" in
                r.getMessage()]  # fmt: skip
    assert len(warnings) == 1 and str(metrics) in warnings[0]

def assert_resume_refused(run_dir, tmp_path, caplog, match: str) -> None:
    """Resuming from ``run_dir`` is refused (``match``) in one line, and every file there is as it was."""
    before = contents(run_dir)
    resumed = {**CONFIG, "results-dir": str(tmp_path), "num-server-rounds": ROUNDS + 2, "resume-from": str(run_dir)}
    with pytest.raises(ConfigError, match=match):
        submit(resumed)
    assert len(refusal_lines(caplog)) == 1
    after = contents(run_dir)
    assert {name: after[name] for name in before} == before


def test_a_torn_line_before_the_last_is_refused_naming_it_and_the_file_is_kept(finished, tmp_path, caplog):
    run_dir = earlier_run(finished, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    first, second = finished["metrics.jsonl"].splitlines(keepends=True)
    metrics.write_bytes(first + b'{"round": 2, "trai\n' + second)
    assert_resume_refused(run_dir, tmp_path, caplog, rf"'resume-from': {metrics} line 2 is no JSON record")


def test_read_metrics_drops_only_a_last_line_without_its_newline(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"round": 1}\n{"round": 2}')  # complete, only the newline is missing: kept
    assert [r["round"] for r in read_metrics(path)] == [1, 2]
    path.write_bytes(b'{"round": 1}\n{"round": 2}\n{"rou')
    assert [r["round"] for r in read_metrics(path)] == [1, 2]
    path.write_bytes(b'{"round": 1}\n[1, 2]\n')  # JSON, but no round record, and not at the end
    with pytest.raises(ValueError, match="line 2 is no round record"):
        read_metrics(path)


# --------------------------------------------------------------------------- malformed checkpoints

VALUES = [None, True, 0, -1, 2.5, float("nan"), "x", [], [1], {}, {"a": 1}]
TOP_KEYS = ("format", "round", "state")
STATE_KEYS = ("settings", "history", "strategy", "elapsed-seconds", "node-properties", "own", "tuner")


def archive_bytes(meta: object, arrays: dict[str, np.ndarray], meta_array: np.ndarray | None = None) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, __meta__=np.array(json.dumps(meta)) if meta_array is None else meta_array)
    return buffer.getvalue()


def read_archive(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as archive:
        meta = json.loads(str(archive["__meta__"]))
        return meta, {name: archive[name] for name in archive.files if name != "__meta__"}


def paths_in(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) into a JSON document."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_in(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:3]):
            found += paths_in(item, (*prefix, index))
    return found


def changed(meta: dict, path: tuple, value: object, *, delete: bool = False) -> dict:
    """A copy of ``meta`` with the entry at ``path`` set to ``value`` (or deleted)."""
    meta = json.loads(json.dumps(meta))
    if not path:
        return value
    parent = meta
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return meta


# values of the right type, which a checkpoint may hold: not refused
FITTING = {("round",): [0], ("state", "elapsed-seconds"): [0, 2.5], ("state", "history"): [[]],
           ("state", "node-properties"): [{}], ("state", "own"): [{}, {"a": 1}],
           ("state", "history", 0, "round"): [0, -1], ("state", "tuner", "lr"): [2.5],
           ("state", "tuner", "epochs"): [2.5], ("state", "tuner", "batch-size"): [2.5],
           ("state", "tuner", "round"): [0], ("state", "tuner", "decays"): [0]}  # fmt: skip
REQUIRED_TUNER_KEYS = ("lr", "epochs", "batch-size", "round")  # the rest have defaults for older checkpoints


def header_cases(meta: dict) -> list[tuple[str, object]]:
    """Headers that must be refused, each with a label: wrong types and missing keys where the run reads them."""
    node = next(iter(meta["state"]["node-properties"]))
    places = [(key,) for key in TOP_KEYS] + [("state", key) for key in STATE_KEYS]
    places += [("state", "history", 0), ("state", "history", 0, "round"), ("state", "node-properties", node)]
    places += [("state", "tuner", key) for key in meta["state"]["tuner"]]
    cases = [(f"header = {v!r}", v) for v in VALUES]
    for place in places:
        fitting = FITTING.get(place, [])
        cases += [(f"{'.'.join(map(str, place))} = {v!r}", changed(meta, place, v)) for v in VALUES
                  if not any(v is f or (type(v) is type(f) and v == f) for f in fitting)]  # fmt: skip
    for place in [*((key,) for key in TOP_KEYS), ("state", "history"), ("state", "tuner"),
                  *(("state", "tuner", key) for key in REQUIRED_TUNER_KEYS)]:  # fmt: skip
        cases.append((f"no {'.'.join(place)}", changed(meta, place, None, delete=True)))
    return cases


def array_cases(arrays: dict[str, np.ndarray]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Arrays that must be refused: the model's of other dtypes, shapes or number, the tuner's short or textual."""
    model = arrays["global/0"]
    cases = [(f"global/0 as {dtype}", {**arrays, "global/0": model.astype(dtype)})
             for dtype in (np.float64, np.float16, np.int32, np.bool_)]  # fmt: skip
    cases += [("global/0 transposed", {**arrays, "global/0": model.T.copy()}),
              ("global/0 flattened", {**arrays, "global/0": model.ravel()}),
              ("no global/1", {k: v for k, v in arrays.items() if k != "global/1"}),
              ("an extra model tensor", {**arrays, f"global/{sum(k.startswith('global/') for k in arrays)}": model}),
              ("a tensor of text", {**arrays, "global/0": np.array(["a"] * model.size).reshape(model.shape)}),
              ("a record array", {**arrays, "fathom/recent-h": np.zeros(2, dtype=[("a", "f4")])})]  # fmt: skip
    for name in (k for k in arrays if k.startswith("fathom/")):
        cases.append((f"{name} as text", {**arrays, name: np.array("x")}))
    for name in ("fathom/loss-gate", "fathom/setback", "fathom/safe-ascent"):  # the tuner unpacks these
        cases.append((f"{name} empty", {**arrays, name: np.zeros(0)}))
    # safe ascent's values of the lowest loss (positive, or nan before any) and its whole count of fall-backs
    cases += [(f"fathom/safe-ascent = {values}", {**arrays, "fathom/safe-ascent": np.array(values)})
              for values in ([0.1, 1.0, 16.0, -1.0], [0.1, 1.0, 16.0, 0.5], [0.1, 1.0, 16.0, np.inf],
                             [0.0, 1.0, 16.0, 0.0], [-0.1, 1.0, 16.0, 0.0], [0.1, 1.0, 0.0])]  # fmt: skip
    return cases


def outcome(path: Path, settings, grid: InProcessGrid) -> str:
    """``"resumed"``, or the one-line refusal of a checkpoint on the server's path: load, check, resume.

    The round engine's start on ``grid`` is the server's: the preflight, the method's start, then ``resume``.
    """
    try:
        checkpoint = checkpoint_to_resume(settings)
        strategy = build_strategy(settings)
        Rounds(method=strategy, checkpoint=checkpoint).started(grid)
    except (CheckpointError, ConfigError) as err:
        assert "\n" not in str(err), str(err)
        return f"refused: {err}"
    return "resumed"


def test_every_malformed_checkpoint_is_refused_in_one_line_and_nothing_else_escapes(finished, tmp_path):
    run_dir = earlier_run(finished, tmp_path)
    path = run_dir / "checkpoint.npz"
    good = path.read_bytes()
    meta, arrays = read_archive(path)
    settings = parse_settings({**CONFIG, "results-dir": str(tmp_path), "num-server-rounds": ROUNDS + 2,
                               "resume-from": str(path)})  # fmt: skip
    federation = InProcessGrid(run_config={**CONFIG, "num-server-rounds": ROUNDS + 2}, num_clients=CLIENTS)

    def tried(data: bytes) -> str:
        path.write_bytes(data)
        return outcome(path, settings, federation)

    assert tried(good) == "resumed"
    refused: dict[str, str] = {}
    for label, header in header_cases(meta):
        refused[label] = tried(archive_bytes(header, arrays))
    for label, changed_arrays in array_cases(arrays):
        refused[label] = tried(archive_bytes(meta, changed_arrays))
    for label, entry in [("meta as a number", np.array(3.0)), ("meta as numbers", np.arange(4)),
                         ("meta as a list of texts", np.array([json.dumps(meta)] * 2)),
                         ("meta as bytes", np.array(json.dumps(meta).encode())),
                         ("meta nested past the parser's depth", np.array("[" * 100_000))]:  # fmt: skip
        refused[label] = tried(archive_bytes(meta, arrays, meta_array=entry))
    for cut in range(0, len(good), max(1, len(good) // 60)):
        refused[f"cut at byte {cut}"] = tried(good[:cut])
    one_array = io.BytesIO()
    np.save(one_array, np.zeros(3))
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    deep = io.BytesIO()
    with zipfile.ZipFile(deep, "w") as archive:
        archive.writestr("__meta__.npy", b"\x93NUMPY" + b"\xff" * 40)
    for label, data in [("a single .npy", one_array.getvalue()), ("a pickle", pickled.getvalue()),
                        ("a zip of garbage", deep.getvalue()), ("text", b"[" * 100_000)]:  # fmt: skip
        refused[label] = tried(data)
    real = tmp_path / "real.npz"
    real.write_bytes(good)
    path.unlink()
    path.symlink_to(real)
    refused["a symbolic link"] = outcome(path, settings, federation)
    path.unlink()
    wrong = {label: result for label, result in refused.items() if not result.startswith("refused: ")}
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in wrong.items())

    # and random changes anywhere in the header: each one resumes or is refused in one line, nothing else
    rng = np.random.default_rng(0)
    everywhere = paths_in(meta)
    outcomes = []
    for _ in range(150):
        where = everywhere[rng.integers(len(everywhere))]
        if where and rng.random() < 0.3:
            header = changed(meta, where, None, delete=True)
        else:
            header = changed(meta, where, VALUES[rng.integers(len(VALUES))])
        outcomes.append(tried(archive_bytes(header, arrays)))
    assert sum(o.startswith("refused: ") for o in outcomes) > 50
    path.write_bytes(good)
    assert load_checkpoint(path).round == ROUNDS and contents(run_dir) == finished


@pytest.mark.parametrize("damage", ["tensor as float64", "tensor transposed", "no tensor", "history not a list"])
def test_a_checkpoint_that_does_not_fit_is_refused_before_any_work_and_the_folder_is_kept(
        finished, tmp_path, caplog, damage):  # fmt: skip
    run_dir = earlier_run(finished, tmp_path)
    meta, arrays = read_archive(run_dir / "checkpoint.npz")
    if damage == "tensor as float64":
        arrays["global/0"] = arrays["global/0"].astype(np.float64)
    elif damage == "tensor transposed":
        arrays["global/0"] = arrays["global/0"].T.copy()
    elif damage == "no tensor":
        del arrays["global/1"]
    else:
        meta["state"]["history"] = 3
    (run_dir / "checkpoint.npz").write_bytes(archive_bytes(meta, arrays))
    assert_resume_refused(run_dir, tmp_path, caplog, r"^run config key 'resume-from': checkpoint ")
