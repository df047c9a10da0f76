"""The repository's Python is lint-clean (ruff, configured in pyproject.toml), as CI checks it."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed (it comes with the test extra)")
def test_ruff_is_clean():
    result = subprocess.run(["ruff", "check", "--no-cache", "suite", "methods", "tasks", "tests", "lab"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
