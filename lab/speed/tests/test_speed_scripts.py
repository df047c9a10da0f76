"""The speed scripts' own logic, on the CPU: the MFU peak table, the GPU check's exit without CUDA and its
tolerances against the published H200 run, and the capture script's sync check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import suite
from lab.speed import gpu_capture, gpu_check, mfu
from suite.testing import temporary_methods

ROOT = Path(__file__).resolve().parents[3]
GLUE = ROOT.parent / "shared" / "data" / "glue"


@pytest.fixture
def shared_glue() -> Path:
    if not (GLUE / "RTE" / "train.tsv").is_file():
        pytest.skip(f"real GLUE data not found at {GLUE}")
    return GLUE


@pytest.fixture
def register():
    """Registers a toy method for one test and removes it afterwards."""
    with temporary_methods() as add:
        yield add


def test_mfu_peak_table_tells_similar_names_apart():
    assert mfu.peak_tflops("NVIDIA L40") == 181.0 and mfu.peak_tflops("NVIDIA L40S") == 362.0
    assert mfu.peak_tflops("NVIDIA L4") == 121.0
    assert mfu.peak_tflops("NVIDIA A10") == 125.0 and mfu.peak_tflops("NVIDIA A10G") is None
    assert mfu.peak_tflops("NVIDIA H100 PCIe") == 756.5 and mfu.peak_tflops("NVIDIA H100 80GB HBM3") == 989.5
    assert mfu.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0


def test_gpu_check_says_where_it_ran_and_exits_without_cuda(monkeypatch, capsys):
    assert "NVIDIA H200" in gpu_check.__doc__ and "results/gpu/README.md" in gpu_check.__doc__
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--data-dir", "unused", "--out", "unused.json"]) == gpu_check.NO_CUDA
    out = capsys.readouterr()
    assert "one GPU model so far" in out.out
    assert "no CUDA device is visible" in out.err


def test_gpu_check_tolerances_hold_the_h200_run_and_nothing_looser():
    """The published H200 report passes the script's tolerances for every method, with the exactly sparse methods'
    bf16 gradients the only ones given more room; the fp32 bounds stay tight enough to catch a real fault."""
    report = json.loads((ROOT / "results" / "gpu" / "gpu_check.json").read_text())
    for name, entry in report["checks"]["methods"]["methods"].items():
        for precision in ("fp32", "bf16"):
            tol = gpu_check.tolerance(name, precision)
            assert entry[precision]["logits_max_abs"] <= tol["logits_max_abs"], (name, precision)
            assert entry[precision]["grad_rel_l2"] <= tol["grad_rel_l2"], (name, precision)
    assert gpu_check.tolerance("vanilla", "fp32") == {"logits_max_abs": 1e-4, "grad_rel_l2": 1e-3}
    assert gpu_check.tolerance("sparsemax", "fp32") == gpu_check.tolerance("vanilla", "fp32")
    assert gpu_check.tolerance("vanilla", "bf16")["grad_rel_l2"] == 0.1
    assert gpu_check.tolerance("sparsemax", "bf16")["grad_rel_l2"] == 0.3


def test_the_sync_check_names_the_sync_and_where_it_happened(shared_glue, monkeypatch, register):
    """lab/speed/gpu_capture.py --sync on the CPU, with torch.cuda's sync debug mode stood in for: a method that
    synchronises under the mode is named with the phase and a frame; vanilla is found clean."""
    Vanilla = suite.METHODS.get("vanilla")

    monkeypatch.setattr(gpu_capture, "DEVICE", torch.device("cpu"))
    monkeypatch.setattr(gpu_capture, "AMP", None)
    mode = [0]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.__setitem__(0, m))

    class Syncs(Vanilla):
        capturable = True

        def attention(self, *args, **kwargs):
            if mode[0] == "error":  # as torch raises on a synchronising call under the mode
                raise RuntimeError("called a synchronizing CUDA operation")
            return super().attention(*args, **kwargs)

    name = register(Syncs, "test_syncs")
    steps_batches, task = gpu_capture.batches(str(shared_glue), 2, 4)
    row = gpu_capture.sync_check(name, task, steps_batches)
    assert row["sync"] == "called a synchronizing CUDA operation" and row["phase"] == "eager step", row
    assert row["phases_run"] == ["warm-up (mode off)", "eager step"] and ".py:" in row["where"]
    clean = gpu_capture.sync_check("vanilla", task, steps_batches)
    assert clean["sync"] is None and clean["phases_run"] == ["warm-up (mode off)", "eager step"]
    assert mode[0] == 0  # the mode is switched off after each step
