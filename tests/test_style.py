import shutil
import subprocess

import pytest
from conftest import REPO


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed; install the test extras: pip install '.[test]'")
    out = subprocess.run([ruff, "check", str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
