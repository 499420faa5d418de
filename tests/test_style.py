import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


def test_ruff_is_clean():
    # the ruff installed beside this Python (a venv's bin/, not activated), else the PATH's
    beside = Path(sys.executable).parent / "ruff"
    ruff = str(beside) if beside.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed; install the test extras: pip install '.[test]'")
    out = subprocess.run([ruff, "check", str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
