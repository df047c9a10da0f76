"""Devices and precision: which device a run uses, its autocast dtype, how records name them, the environment."""
from __future__ import annotations

import platform
import resource
import subprocess
from pathlib import Path
from typing import Any

import torch

from suite import __version__
from suite.api.errors import BadInput

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(requested: str = "auto") -> torch.device:
    """'auto' (CUDA when visible, else CPU), 'cpu', 'cuda', 'cuda:N'; anything else is bad input."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise BadInput(f"--device {requested!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise BadInput(f"--device {requested!r}: the suite runs on cpu or cuda (auto picks CUDA when visible)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInput(f"--device {requested} was asked for but no CUDA device is visible (use cpu or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise BadInput(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype a run trains and evaluates in (None: plain fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return AUTOCAST_DTYPES[precision]


def precision_label(amp_dtype: torch.dtype | None, loss_scaling: bool = False) -> str:
    """'fp32', 'bf16 autocast', 'fp16 autocast, loss scaling': what records and bench headers say ran."""
    if amp_dtype is None:
        return "fp32"
    name = next(k for k, v in AUTOCAST_DTYPES.items() if v is amp_dtype)
    return f"{name} autocast" + (", loss scaling" if loss_scaling else "")


# What a run executes: a change elsewhere in the checkout (README, results/, studies/) leaves a run's code as committed,
# so it does not mark records "+dirty" (a study writing its records into the repository stays clean).
CODE_PATHS = ("suite", "methods", "tasks", "pyproject.toml")


def git_commit(root: Path | None = None) -> str | None:
    """The suite's git commit, with '+dirty' when its code (CODE_PATHS, untracked files included) differs from it;
    None outside a checkout."""
    here = root or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", *CODE_PATHS],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device) -> dict[str, Any]:
    import datasets
    import transformers

    env = {"suite": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "datasets": datasets.__version__,
           "platform": platform.platform(), "machine": platform.machine(), "cpu_threads": torch.get_num_threads(),
           "device": str(device), "git_commit": git_commit(), "host": platform.node()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def machine(device: torch.device) -> str:
    """The GPU (and CUDA version) or the CPU model and torch's thread count, for benchmark headers."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} torch threads"


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by this run; on CPU the process's peak resident set (it never decreases)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
