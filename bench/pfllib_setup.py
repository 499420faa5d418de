"""PFLlib's own code beside stamen's: its checkout and environment, stamen's clients in its file format, its runs.

``bench/pfllib_parity.py`` runs both systems on the same clients. PFLlib
(github.com/TsingZ0/PFLlib, pinned at :data:`PFLLIB_COMMIT`) is never changed: its
``system/main.py`` runs as it is, under :func:`run_pfllib`, which only

- offsets the seed: PFLlib seeds ``torch.manual_seed(0)`` at import and in every client,
  so each of its runs would draw the same numbers; seed ``s`` adds ``1000 s`` to every
  seed it sets (seed 0 is PFLlib exactly);
- records each evaluation's per-client counts (its own figure is correct / total over all
  clients) by wrapping the server's ``test_metrics`` (Ditto's ``test_metrics_personalized``),
  and for FedProto also each client's own model's accuracy (argmax of its head), which is
  what stamen's FedProto reports, PFLlib's being the nearest global prototype;
- stops after the last evaluation asked for (PFLlib's loop trains one round past it).

It runs under a Python that has PFLlib's imports (:func:`pfllib_python`): a virtual
environment that sees this machine's torch, plus what PFLlib imports beyond stamen's
dependencies (:data:`PFLLIB_NEEDS`); never stamen's own environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

PFLLIB_URL = "https://github.com/TsingZ0/PFLlib"
PFLLIB_COMMIT = "d832e76f6a23b833038949ec1e4fdefe63a4d350"  # 2025-11-29, the newest when B8 was checked against it

# what PFLlib's system/ imports that stamen does not install (its main.py imports every method's module)
PFLLIB_NEEDS = ("scikit-learn", "h5py", "ujson", "calmsize", "matplotlib", "cvxpy")

CACHE = Path.home() / ".cache" / "stamen" / "pfllib-parity"

# stamen's method -> PFLlib's -algo
ALGORITHMS = {"fedavg": "FedAvg", "perfedavg": "PerAvg", "ditto": "Ditto", "fedrep": "FedRep", "fedproto": "FedProto"}

# PFLlib's defaults (system/main.py): batch 10, lr 0.005, one local epoch, every client every round; Ditto's mu 0,
# FedProto's lamda 1, one personal (Ditto) and head (FedRep) epoch
PFLLIB_DEFAULTS = {"batch-size": 10, "lr": 0.005, "local-epochs": 1, "join-ratio": 1.0}


def dataset_name(seed: int) -> str:
    """The folder PFLlib reads a seed's clients from; "Cifar10" in it makes PFLlib build FedAvgCNN with dim=1600."""
    return f"Cifar10_stamen_practical_s{seed}"


def checkout(clone: Path | None) -> Path:
    """PFLlib's ``system/`` at :data:`PFLLIB_COMMIT` under :data:`CACHE`, from ``clone`` or a fresh clone of GitHub.

    Raises
    ------
    SystemExit
        If the commit cannot be had.

    """
    target = CACHE / f"pfllib-{PFLLIB_COMMIT[:12]}"
    if (target / "system" / "main.py").exists():
        return target
    if clone is None:
        clone = CACHE / "clone"
        if not clone.exists():
            subprocess.run(["git", "clone", "--quiet", "--bare", PFLLIB_URL, str(clone)], check=True)
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(clone), "archive", "--format=tar", PFLLIB_COMMIT, "system"],
                             capture_output=True)  # fmt: skip
    if archive.returncode != 0:
        raise SystemExit(f"PFLlib's commit {PFLLIB_COMMIT} is not in {clone}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    (target / "dataset").mkdir(exist_ok=True)
    return target


def pfllib_python(python: str | None) -> str:
    """A Python with PFLlib's imports: ``python``, or a virtual environment under :data:`CACHE` made once."""
    if python:
        return python
    venv = CACHE / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *PFLLIB_NEEDS], check=True)
    return str(venv / "bin" / "python")


def fingerprint(clients: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> str:
    """SHA-256 of every client's (train x, train y, test x, test y) in order: float32 inputs, int64 labels."""
    digest = hashlib.sha256()
    for arrays in clients:
        for array, dtype in zip(arrays, (np.float32, np.int64, np.float32, np.int64), strict=True):
            digest.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
    return digest.hexdigest()


def export(clients: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], folder: Path) -> str:
    """Write the clients in PFLlib's format (``{train,test}/<i>.npz`` holding ``{'x', 'y'}``); their fingerprint.

    PFLlib's ``dataset_utils.save_file`` writes ``np.savez_compressed(f, data=dict)``; these
    are written uncompressed (``np.savez``), which its ``read_data`` reads the same way.
    """
    for part in ("train", "test"):
        (folder / part).mkdir(parents=True, exist_ok=True)
    for index, (train_x, train_y, test_x, test_y) in enumerate(clients):
        for part, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
            with open(folder / part / f"{index}.npz", "wb") as file:
                np.savez(file, data={"x": x.astype(np.float32), "y": y.astype(np.int64)})
    stamp = fingerprint(clients)
    (folder / "fingerprint.json").write_text(json.dumps({"clients": len(clients), "sha256": stamp}))
    return stamp


def pfllib_arguments(method: str, *, seed: int, rounds: int, every: int, clients: int) -> list[str]:
    """PFLlib's command line for ``method`` on seed ``seed``'s clients: its defaults, on the CPU, ``rounds`` rounds."""
    return ["-data", dataset_name(seed), "-m", "CNN", "-algo", ALGORITHMS[method], "-gr", str(rounds),
            "-eg", str(every), "-nc", str(clients), "-jr", str(PFLLIB_DEFAULTS["join-ratio"]),
            "-lbs", str(PFLLIB_DEFAULTS["batch-size"]), "-lr", str(PFLLIB_DEFAULTS["lr"]),
            "-ls", str(PFLLIB_DEFAULTS["local-epochs"]), "-dev", "cpu", "-ncl", "10"]  # fmt: skip


class Done(Exception):  # noqa: N818  (a signal that the wanted evaluations are in, not an error)
    """Raised by the recording hook once the last evaluation asked for is recorded."""


def run_pfllib(root: Path, method: str, *, seed: int, rounds: int, every: int, clients: int) -> dict:
    """PFLlib's main.py for ``method`` in this process (``root``'s ``system/`` on ``PYTHONPATH``); its evaluations.

    Call it in a Python with PFLlib's imports, as ``bench/pfllib_parity.py --pfllib-worker``
    does: it changes this process's working directory, seeds and thread count.
    """
    import torch

    seeded = torch.manual_seed
    torch.manual_seed = lambda value: seeded(int(value) + 1000 * seed)  # PFLlib seeds 0 everywhere
    torch.set_num_threads(1)
    os.chdir(root / "system")
    from flcore.servers import serverbase, serverditto  # PFLlib's, from PYTHONPATH
    from utils.data_utils import read_client_data

    name = dataset_name(seed)
    read = [[read_client_data(name, i, is_train=train) for train in (True, False)] for i in range(clients)]
    read_fingerprint = fingerprint(
        (torch.stack([x for x, _ in tr]).numpy(), torch.stack([y for _, y in tr]).numpy(),
         torch.stack([x for x, _ in te]).numpy(), torch.stack([y for _, y in te]).numpy()) for tr, te in read
    )  # fmt: skip
    wanted = rounds // every + 1  # PFLlib evaluates before each round's training: rounds 0, every, ..., rounds
    kind = "personal" if method == "ditto" else "test"
    evaluations: dict[str, list[dict]] = {"test": [], "personal": []}

    def record(which: str, server, stats) -> None:
        _, counts, correct = stats[0], stats[1], stats[2]
        entry = {"round": len(evaluations[which]) * every, "correct": [float(c) for c in correct],
                 "examples": [int(n) for n in counts]}  # fmt: skip
        if method == "fedproto":  # each client's own model, as stamen tests it (PFLlib: nearest global prototype)
            entry["own-model-correct"] = [own_model_correct(c, te) for c, (_, te) in zip(server.clients, read,
                                                                                          strict=True)]  # fmt: skip
        evaluations[which].append(entry)
        if which == kind and len(evaluations[which]) >= wanted:
            raise Done

    def wrap(cls: type, attribute: str, which: str) -> None:
        original = getattr(cls, attribute)

        def recording(self):
            stats = original(self)
            record(which, self, stats)
            return stats

        setattr(cls, attribute, recording)

    wrap(serverbase.Server, "test_metrics", "test")
    wrap(serverditto.Ditto, "test_metrics_personalized", "personal")
    sys.argv = ["main.py", *pfllib_arguments(method, seed=seed, rounds=rounds, every=every, clients=clients)]
    started = time.perf_counter()
    try:
        runpy.run_path("main.py", run_name="__main__")
    except Done:
        pass
    return {"evaluations": evaluations[kind], "global-evaluations": evaluations["test"] if kind != "test" else [],
            "read-fingerprint": read_fingerprint, "wall-seconds": time.perf_counter() - started,
            "pfllib-commit": PFLLIB_COMMIT, "arguments": sys.argv[1:]}  # fmt: skip


def own_model_correct(client, test) -> float:
    """Test examples a PFLlib client's own model (its head's argmax) gets right; no random number is drawn."""
    import torch

    x = torch.stack([x for x, _ in test])
    y = torch.stack([y for _, y in test])
    client.model.eval()
    with torch.no_grad():
        return float((client.model(x).argmax(dim=1) == y).sum())
