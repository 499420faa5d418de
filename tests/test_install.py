"""Installing stamen writes one top-level package, ``stamen``, and breaks no one else's.

The wheel is built by ``hatch_build.py``, which copies ``app``, ``strategies``, ``clients``
and ``datasets`` under ``stamen/`` and rewrites their imports (docs/installing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

from app.local.simulation import FINISHED_OK, LocalSimulation
from hatch_build import PACKAGES, rewrite_imports


def test_rewrite_moves_every_absolute_import_of_the_packages_under_stamen():
    source = textwrap.dedent(
        """\
        from __future__ import annotations
        import json
        from datasets.base import ArraySource
        from strategies.contracts.keys import (
            KeySpec,
            key,
        )
        if True:
            from clients.training import train_steps  # inside a block
        from app import registry
        from datasets_extra import thing
        from .sibling import helper
        text = "from strategies.base import X"  # a string is not an import
        """
    )
    expected = textwrap.dedent(
        """\
        from __future__ import annotations
        import json
        from stamen.datasets.base import ArraySource
        from stamen.strategies.contracts.keys import (
            KeySpec,
            key,
        )
        if True:
            from stamen.clients.training import train_steps  # inside a block
        from stamen.app import registry
        from datasets_extra import thing
        from .sibling import helper
        text = "from strategies.base import X"  # a string is not an import
        """
    )
    assert rewrite_imports(source) == expected


def test_rewrite_refuses_a_plain_import_of_a_package_naming_the_file():
    with pytest.raises(ValueError, match=r"clients/x\.py:2: write `from strategies\.base import"):
        rewrite_imports("import json\nimport strategies.base\n", filename="clients/x.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built once for the module's tests."""
    directory = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: hatchling comes from the test extras, so this needs no package index
    command = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*command, "-w", str(directory)], check=True, capture_output=True, text=True, timeout=600)
    (built,) = directory.glob("stamen-*.whl")
    return built


def test_the_wheel_holds_only_stamen_and_every_file_of_the_four_packages(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    roots = {name.split("/")[0] for name in names}
    assert roots == {"stamen", "stamen-0.1.0.dist-info"}, roots
    shipped = {name.removeprefix("stamen/") for name in names if name.startswith("stamen/")}
    in_clone = {
        path.relative_to(REPO).as_posix()
        for package in PACKAGES
        for path in (REPO / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert in_clone <= shipped and shipped - in_clone == {"__init__.py"}


def test_the_installed_copy_imports_and_loads_its_data_without_any_short_name(tmp_path, wheel):
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    probe = textwrap.dedent(
        """\
        import sys
        import stamen.app.server_app, stamen.app.client_app
        from stamen.strategies.methods.perfedavg import PerFedAvgServer
        from stamen.clients.perfedavg import PerFedAvgClient
        from stamen.datasets.embedded import load_mnist_5k
        assert len(load_mnist_5k().train_y) > 0
        short = sorted(m for m in sys.modules if m.split(".")[0] in ("app", "strategies", "clients", "datasets"))
        assert not short, short
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _venv_beside_this_python(venv: Path) -> Path:
    """A virtual environment that also sees the packages this Python sees; its python.

    ``venv --system-site-packages`` lends the *base* interpreter's packages: run from inside
    a virtual environment (where a user runs the README's test command), it would not see
    that environment's flwr and torch. A ``.pth`` file in the new environment appends this
    Python's own site-packages after the new environment's, so what is installed into it
    still comes first.
    """
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = _venv_python(venv)
    if sys.prefix != sys.base_prefix:
        inner = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
        outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (Path(inner) / "_outer_environment.pth").write_text("".join(f"{path}\n" for path in outer))
    return python


@pytest.mark.e2e
def test_flwr_datasets_survives_installing_stamen_and_the_quick_start_job_finishes(tmp_path, monkeypatch):
    """The issue's reproduction: flwr-datasets first, then stamen as the README installs it."""
    venv = tmp_path / "venv"
    # System site-packages lend torch, flwr and ray (the registry's torch is capped and on disk);
    # flwr-datasets, HuggingFace datasets and stamen itself are installed into the venv.
    python = str(_venv_beside_this_python(venv))
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    probe = subprocess.run([*pip, "download", "--no-deps", "-d", str(tmp_path / "probe"), "flwr-datasets"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"the package index cannot be reached to fetch flwr-datasets: {probe.stderr.strip()[-300:]}")
    subprocess.run([*pip, "install", "flwr-datasets[vision]"], check=True, capture_output=True, timeout=900)
    subprocess.run([*pip, "install", str(REPO)], check=True, capture_output=True, timeout=600)  # README: pip install .

    files = subprocess.run(
        [python, "-m", "pip", "show", "-f", "stamen"], check=True, capture_output=True, text=True
    ).stdout
    listed = [line.strip() for line in files.split("Files:")[1].splitlines() if line.strip()]
    scripts = [line for line in listed if line.startswith("../")]  # console scripts land in the environment's bin/
    assert [Path(line).name for line in scripts] == ["stamen-device"], listed
    packages = {line.split("/")[0] for line in listed if line not in scripts}
    assert packages == {"stamen", "stamen-0.1.0.dist-info"}, listed
    check = (
        "import flwr_datasets, datasets; from flwr_datasets import FederatedDataset; "
        "from stamen.strategies.methods.perfedavg import PerFedAvgServer; "
        "assert 'site-packages' in datasets.__file__ and hasattr(datasets, 'Dataset'), datasets.__file__; print('ok')"
    )
    out = subprocess.run([python, "-c", check], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]

    # README quick start 1, with the venv's flwr: the job runs from the clone and finishes. 2 of its 100
    # rounds (the last one evaluated) take the same path through the install; the rest only cost CI time.
    monkeypatch.setenv("PATH", f"{_venv_python(venv).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    with LocalSimulation(app_dir=REPO) as sim:
        config = {"num-server-rounds": 2, "results-dir": str(tmp_path / "results")}  # not the user's ~/stamen
        outcome = sim.run(run_config=config, num_supernodes=50, extra_federation="client-resources-num-cpus=1",
                          timeout_s=900)  # fmt: skip
    assert outcome.ok, outcome.log_tail
    assert "final: perfedavg: 2 rounds" in outcome.log and "final personalised accuracy 0." in outcome.log


@pytest.mark.e2e
def test_a_device_from_the_installed_wheel_alone_joins_a_tls_deployment(tmp_path, wheel):
    """stamen-device from a fresh virtual environment holding only the wheel, in an empty folder, beside a SuperNode."""
    from app.local.deployment import LocalDeployment

    venv = tmp_path / "venv"
    # torch, flwr and the rest come from the system site-packages (the registry's torch is capped and on disk); the
    # wheel goes into the venv itself, over whatever stamen the system may hold
    python = _venv_beside_this_python(venv)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                    str(wheel)], check=True, capture_output=True, timeout=600)  # fmt: skip
    device = python.parent / "stamen-device"
    empty = tmp_path / "empty"
    empty.mkdir()
    usage = subprocess.run([str(device), "--help"], cwd=empty, capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: stamen-device "), usage.stderr[-2000:]
    results = tmp_path / "results"
    config = {"strategy": "fedavg", "num-server-rounds": 2, "partitioner": "iid", "results-dir": str(results),
              "run-name": "installed-device"}  # fmt: skip
    # node 1 a warm device of the checkout (no fresh flwr-clientapp process per message), node 0 the installed one
    with LocalDeployment(app_dir=REPO, num_nodes=2, tls=True, warm=True, devices={0: [str(device)]},
                         workdir=tmp_path / "deployment") as deployment:  # fmt: skip
        outcome = deployment.run(config, timeout_s=600)
        device_log = deployment.nodes[0].log_path.read_text(errors="replace")
    assert outcome.status == FINISHED_OK, outcome.log[-3000:]
    assert f"{python} -m stamen.app.device.warm_exec" in device_log, device_log[-3000:]  # the installed warm executor
    summary = json.loads((results / "installed-device" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final"]["clients-succeeded"] == 2
