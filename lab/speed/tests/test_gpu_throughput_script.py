"""The GPU slot's script (lab/speed/gpu_throughput.sh) checks itself: a step with no time left in the call's budget is
not started, and the script exits non-zero naming every step whose result file is missing. (Its CPU rehearsal,
QUICK=1, trains and takes minutes: docs/running-grids.md says what it measured.)"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "gpu_throughput.sh"


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "OUT": str(tmp_path / "out"), "QUICK": "1", **env})


@pytest.mark.parametrize("call, steps", [("1", 8), ("2", 2)])
def test_a_call_without_time_for_its_steps_exits_1_naming_each_missing_result(call, steps, tmp_path):
    done = _run(tmp_path, call, BUDGET="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"MISSING results ({steps}):" in done.stdout
    assert done.stdout.count("not started: no time left of BUDGET=1") == steps
    assert "every step wrote its result" not in done.stdout
    assert (tmp_path / "out" / f"log_call{call}.txt").read_text().count("=== ") == steps + 1


def test_the_call_must_be_named(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 2 and "usage: bash lab/speed/gpu_throughput.sh 1|2" in done.stderr
