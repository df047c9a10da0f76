"""Devices and precision: which device a run uses, its autocast dtype, how records name them, the environment."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import platform
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from suite import __version__
from suite.api import startup_cache
from suite.api.errors import BadInput

# what the rest of the suite uses; other names are this module's own
__all__ = ["CPU_BF16_CHECKS", "autocast_dtype", "cpu_bf16_native", "cpu_model", "device_type", "enable_tf32",
           "environment", "git_commit", "git_output", "is_capture_failure", "is_out_of_memory", "is_sticky_cuda_error",
           "limit_gpu_memory", "machine", "make_deterministic", "peak_memory_mb", "peak_reserved_mb", "pick_device",
           "precision_label", "prefer_passive_waits", "resolve_jobs_precision", "resolve_precision", "torch_threads",
           "wait_env", "wait_policy"]

if TYPE_CHECKING:  # torch is imported where it is used: `list` and dry runs plan without it (suite.api.startup_cache)
    import torch


def _autocast_dtypes() -> dict[str, torch.dtype | None]:
    import torch

    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def __getattr__(name: str):
    if name == "AUTOCAST_DTYPES":  # precision -> autocast dtype (None: plain fp32)
        return _autocast_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pick_device(requested: str = "auto") -> torch.device:
    """'auto' (CUDA when visible, else CPU), 'cpu', 'cuda', 'cuda:N'; anything else is bad input."""
    import torch

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


CPU_BF16_CHECKS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's; absent: False


def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 matrix products in hardware (AVX512-BF16 or AMX). Without them autocast
    emulates bf16 at a fraction of fp32's speed (a MiniLM-sized matmul 8-95x slower on an AVX2 AMD EPYC, see
    docs/results.md#bf16-against-fp32). A command that only plans, before torch is imported, reads the answer torch
    gave on this machine since its last boot (`suite.api.startup_cache`)."""
    if startup_cache.usable():
        return startup_cache.remembered("cpu-bf16", _cpu_facts(), _ask_torch_cpu_bf16)
    import torch

    return any(getattr(torch.cpu, check, lambda: False)() for check in CPU_BF16_CHECKS)


def _ask_torch_cpu_bf16() -> tuple[bool, list[str]]:
    import torch

    return (any(getattr(torch.cpu, check, lambda: False)() for check in CPU_BF16_CHECKS),
            [spec.origin for spec in (torch.__spec__, torch._C.__spec__)])


def _cpu_facts() -> dict[str, Any]:
    """What torch's answer on the CPU's bf16 instructions depends on: the CPU (its /proc/cpuinfo, less the clock
    speeds), the kernel, this boot (hardware cannot change without one) and the torch build (its version file;
    `_ask_torch_cpu_bf16` adds torch's files)."""
    def text(path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    cpuinfo = "".join(line for line in (text("/proc/cpuinfo") or "").splitlines(True) if not line.startswith("cpu MHz"))
    return {"checks": CPU_BF16_CHECKS, "cpuinfo": hashlib.sha256(cpuinfo.encode()).hexdigest(),
            "boot": text("/proc/sys/kernel/random/boot_id"), "uname": list(platform.uname()),
            "torch": _torch_version_file(), **startup_cache.interpreter()}


def _torch_version_file() -> str | None:
    """The text of the installed torch's version.py (its version and the GPU toolkits it was built with), read
    without importing torch; None when there is no torch to find."""
    try:
        spec = importlib.util.find_spec("torch")
        where = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
        return (Path(where) / "version.py").read_text() if where else None
    except (ImportError, ValueError, OSError):
        return None


def _torch_without_gpus() -> bool:
    """Whether the installed torch was built without CUDA and ROCm (a `+cpu` wheel): its torch.cuda then says no
    GPU is available, whatever the machine has. False when in doubt."""
    version = _torch_version_file() or ""
    return all(re.search(rf"^{name}(: *Optional\[str\])? *= *None *$", version, re.M) for name in ("cuda", "hip"))


def device_type(requested: str = "auto") -> str:
    """`pick_device(requested).type` (with its errors). A command that only plans, before torch is imported, knows
    without torch that `cpu` is the CPU, and so is `auto` under a torch built without CUDA and ROCm."""
    if startup_cache.usable() and (requested == "cpu" or requested == "auto" and _torch_without_gpus()):
        return "cpu"
    return pick_device(requested).type


def bf16_native(device: torch.device) -> bool:
    """Whether this device computes bf16 in hardware: a CPU as `cpu_bf16_native`, a CUDA GPU of compute capability
    8.0 and up (A100, A10, L4, H100...); V100 and T4 only emulate it, slower than fp32."""
    import torch

    if device.type == "cpu":
        return cpu_bf16_native()
    if device.type != "cuda":
        return False
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # older torch without the argument
        return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_precision(precision: str, device_type: str, bf16_ok: bool) -> tuple[str, str | None]:
    """(the precision a run with `precision` trains in on a `device_type` device, a message when `auto` had to step
    down on a GPU). `auto`: bf16 autocast where the device computes bf16 natively (`bf16_ok`: a CUDA GPU of compute
    capability 8.0 and up, a CPU with AVX512-BF16 or AMX), else fp32 (fp16 needs loss scaling and not every method
    supports it, so it is left to be asked for). Resolved before a job is hashed, so that an fp32 record and a bf16
    record of one configuration never share a file name."""
    if precision != "auto":
        return precision, None
    if bf16_ok:
        return "bf16", None
    if device_type != "cuda":
        return "fp32", None
    return "fp32", ("train.precision=auto: this GPU has no native bf16 (compute capability < 8.0), so runs train in "
                    "fp32; --precision fp16 (loss scaling) is faster on it where the method supports it")


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype a run trains and evaluates in (None: plain fp32); `auto` as `resolve_precision`."""
    return _autocast_dtypes()[resolve_precision(precision, device.type, bf16_native(device))[0]]


def enable_tf32(device: torch.device) -> bool:
    """fp32 matmuls and convolutions on CUDA use TF32 tensor cores (Ampere and later; 10-bit mantissa inputs, fp32
    accumulation): the speed GPUs are bought for, at the precision of mixed-precision training. Returns whether it
    is on, for the record; CPUs are left untouched."""
    if device.type != "cuda":
        return False
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"


def make_deterministic(device: torch.device, on: bool) -> dict[str, Any] | None:
    """train.deterministic: CUDA kernels that give the same bits on every run (deterministic algorithms, cuBLAS's
    fixed workspace, cuDNN without autotuning), or an error naming an operation that has none. What it costs on a
    GPU has not been measured by this project (no GPU was available): PyTorch's notes name slower scatter/index
    backward passes (the embedding gradient) and cuDNN without benchmark mode. CPU runs are repeatable without it."""
    if device.type != "cuda":
        return None
    import os

    import torch

    # set either way: a worker process runs many jobs, and the previous one may have asked for it
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    if not on:
        return None
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC_WORKSPACE)  # read when cuBLAS starts
    torch.backends.cudnn.benchmark = False
    return {"deterministic_algorithms": True, "cublas_workspace_config": os.environ["CUBLAS_WORKSPACE_CONFIG"],
            "cudnn_deterministic": True}


def limit_gpu_memory(device: torch.device, fraction: float | None) -> float | None:
    """Cap this process's share of the GPU's memory when runs share a GPU (`--gpus-per-run 0.5`, more workers than
    GPUs), so one run's growth fails that run with an out-of-memory error instead of its neighbours. Returns the
    cap set (None: none)."""
    if device.type != "cuda" or fraction is None or not 0 < fraction < 1:
        return None
    import torch

    # torch wants an index here: a bare `cuda` (the runner's default device) raises ValueError on a real GPU
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


# Errors after which the CUDA context of the process is unusable: every later kernel fails too, so the process must
# be replaced (an out-of-memory error is not one of them: the next run may fit).
STICKY_CUDA_ERRORS = ("device-side assert", "illegal memory access", "unspecified launch failure",
                      "misaligned address", "illegal instruction", "cudaErrorLaunchFailure", "CUDA error: an illegal",
                      "uncorrectable ECC error", "CUDA error: unknown error")


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def is_sticky_cuda_error(error: str | None) -> bool:
    """A recorded error that leaves the process's CUDA context broken (see STICKY_CUDA_ERRORS)."""
    return bool(error) and any(marker in error for marker in STICKY_CUDA_ERRORS)


def is_capture_failure(error: str | None) -> bool:
    """A recorded error of a failed CUDA graph capture (`suite.run.capture.CaptureFailed`): the process's CUDA
    generator is left mid-capture, so it takes no more jobs, and the job runs again eagerly in a fresh process."""
    return bool(error) and error.startswith("CaptureFailed: ")


def precision_label(amp_dtype: torch.dtype | None, loss_scaling: bool = False) -> str:
    """'fp32', 'bf16 autocast', 'fp16 autocast, loss scaling': what records and bench headers say ran."""
    if amp_dtype is None:
        return "fp32"
    name = next(k for k, v in _autocast_dtypes().items() if v is amp_dtype)
    return f"{name} autocast" + (", loss scaling" if loss_scaling else "")


# What a run executes. A record names the newest commit that changed these paths, not HEAD: committing records,
# docs or the report's code while a study runs leaves every later record on the same code version, and a change
# elsewhere in the checkout (README, results/, studies/) does not mark records "+dirty". suite/report only reads
# records (it never runs inside a training run), so its changes are not a new version of the records' code.
CODE_PATHS = ("suite", "methods", "tasks", "pyproject.toml")
NOT_RUN_CODE = ("suite/report",)


def git_output(cwd: Path, *args: str, timeout: float = 10) -> str | None:
    """`git -C cwd args`'s stripped stdout; None when git is missing, fails or times out (callers read None as
    "cannot tell")."""
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(root: Path | None = None, excluded: tuple[str, ...] = NOT_RUN_CODE) -> str | None:
    """The newest commit that changed the code a run executes (CODE_PATHS less `excluded`; () adds the report's own
    code), with '+dirty' when that code (untracked files included) differs from it; HEAD where no commit touched it;
    None outside a checkout, in a repository without commits, or when git fails. In a shallow clone whose history
    stops before that commit, the oldest commit it has is named, with '+shallow' (the version is that commit or an
    earlier one). A copy installed from a wheel or an sdist is no checkout: it names the commit stamped when it was
    built, '<sha>+installed' (with '+dirty' after it when that tree had uncommitted code; suite.run.install_stamp)."""
    from suite.run.install_stamp import installed_commit

    if root is None and (stamp := installed_commit()) is not None:
        return stamp
    here = root or Path(__file__).resolve().parent.parent
    # pathspecs from the repository's top: `here` is the package folder when no root is given
    spec = ["--", *(f":(top){p}" for p in CODE_PATHS), *(f":(top,exclude){p}" for p in excluded)]

    def git(*args: str) -> str | None:
        return git_output(here, *args, timeout=5)

    found = git("log", "-1", "--format=%H %P", *spec)
    if found is None:  # not a checkout, no commit yet, or no git
        return None
    sha, *parents = found.split() or [git("rev-parse", "HEAD") or ""]
    dirty = git("status", "--porcelain", *spec)
    if not sha or dirty is None:
        return None
    if not parents:
        shallow = git("rev-parse", "--is-shallow-repository")
        if shallow is None:   # cannot tell whether the history stops here
            return None
        if shallow == "true":
            sha += "+shallow"  # a grafted boundary: the history that would name the version is not here
    return sha + ("+dirty" if dirty else "")


# libgomp's (torch's OpenMP) settings for how idle threads wait, read once when torch loads it
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def wait_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """How a process about to load torch lets its OpenMP threads wait: the user's own OMP_WAIT_POLICY and
    GOMP_SPINCOUNT when either is set, else PASSIVE (sleep at once). libgomp's default spins ~3 ms per wait, which on
    a shared CPU took the cores the other processes needed: docs/cost.md#threads-and-waiting."""
    env = os.environ if env is None else env
    own = {key: env[key] for key in WAIT_SETTINGS if env.get(key, "").strip()}
    return own or {"OMP_WAIT_POLICY": "PASSIVE"}


def prefer_passive_waits() -> None:
    """`wait_env` into this process's environment, for libgomp to read when torch loads and for every process
    started from here; left alone once torch is loaded, so that the record says what this process's threads do."""
    if "torch" not in sys.modules:
        os.environ.update(wait_env())


def wait_policy(env: Mapping[str, str] | None = None) -> str:
    """The record's words for how this process's OpenMP threads wait: PASSIVE, ACTIVE or default (libgomp's own:
    spin, then sleep), with GOMP_SPINCOUNT when set."""
    env = os.environ if env is None else env
    policy = env.get("OMP_WAIT_POLICY", "").strip().upper() or "default"
    spin = env.get("GOMP_SPINCOUNT", "").strip()
    return f"{policy}, GOMP_SPINCOUNT={spin}" if spin else policy


def torch_threads(processes: int = 1, cores: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """Torch threads for each of `processes` training processes sharing this machine's `cores`: the user's
    OMP_NUM_THREADS when it is a positive number, else the cores shared out, at least one each. On a busy 2-core CPU
    two threads with passive waits cost what one costs per step (docs/cost.md#threads-and-waiting)."""
    env = os.environ if env is None else env
    own = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if own.isdigit() and int(own) > 0:
        return int(own)
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, processes))


def environment(device: torch.device) -> dict[str, Any]:
    from importlib import metadata

    import torch
    import transformers

    try:  # its version without importing it (half a second per worker; only hub data needs the package)
        datasets_version = metadata.version("datasets")
    except metadata.PackageNotFoundError:
        datasets_version = None
    env = {"suite": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "datasets": datasets_version,
           "platform": platform.platform(), "machine": platform.machine(), "cpu_threads": torch.get_num_threads(),
           "omp_wait_policy": wait_policy(), "device": str(device), "git_commit": git_commit(),
           "host": platform.node(), "cpu": cpu_model(), "cpu_bf16": cpu_bf16_native()}
    if device.type == "cuda":
        env |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    return env


def machine(device: torch.device) -> str:
    """The GPU (and CUDA version) or the CPU model and torch's thread count, for benchmark headers."""
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU {cpu_model()}, {torch.get_num_threads()} torch threads"


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (/proc/cpuinfo: a VM may call every generation "AMD
    EPYC"), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as fh:  # the first processor's lines
            info = dict(map(str.strip, line.split(":", 1)) for line in fh.read().split("\n\n")[0].splitlines()
                        if ":" in line)
    except OSError:
        info = {}
    ids = ", ".join(f"{key} {info[key]}" for key in ("cpu family", "model") if info.get(key))
    name = info.get("model name") or platform.processor() or platform.machine()
    return f"{name} ({ids})" if ids else name


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by this run; on CPU the process's peak resident set (it never decreases)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_reserved_mb(device: torch.device) -> dict[str, float]:
    """{"peak_reserved_mb": ...} on CUDA: the most GPU memory this run's process held (its captured graphs' pool
    and the allocator's cache included), what a worker sharing a GPU must fit in; {} elsewhere."""
    import torch

    return {"peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20} if device.type == "cuda" else {}


def gpus_bf16_native(device: torch.device) -> bool:
    """Native bf16 on the GPU a run will use (every visible one when no index is given: a pool spreads runs)."""
    import torch

    indices = [device.index] if device.index is not None else range(torch.cuda.device_count())
    return all(torch.cuda.get_device_capability(i) >= (8, 0) for i in indices)


def resolve_jobs_precision(jobs: list, device: str, executor: str = "local", address: str | None = None) -> list:
    """The grid's jobs with `train.precision=auto` replaced by what they will train in on `device` (see
    `resolve_precision`), so that the precision is part of each job's hash. A remote Ray cluster's GPUs cannot be
    seen from the driver: there `auto` must be replaced by an explicit precision; on its CPUs (--device cpu) `auto`
    is fp32, since the driver cannot tell whether they compute bf16 natively either."""
    auto = any(j.train.precision == "auto" for j in jobs)
    if auto and executor == "ray" and address and device.split(":")[0] != "cpu":
        raise BadInput("train.precision=auto with --executor ray --address: the driver cannot see which GPUs the "
                       "cluster's workers have, and a job's precision is part of its record's name. Give "
                       "--precision bf16 (GPUs of compute capability 8.0 and up), fp16 or fp32 with --device cuda, or "
                       "--device cpu")
    jobs = _resolve_pad_to(jobs, device, executor == "ray" and bool(address))
    if not auto:
        return jobs
    kind = device_type(device)
    remote = executor == "ray" and address
    native = gpus_bf16_native(pick_device(device)) if kind == "cuda" else not remote and cpu_bf16_native()
    precision, message = resolve_precision("auto", kind, native)
    if message:
        print(f"note: {message}", file=sys.stderr)
    return [dataclasses.replace(j, train=dataclasses.replace(j.train, precision=precision))
            if j.train.precision == "auto" else j for j in jobs]


def _resolve_pad_to(jobs: list, device: str, remote: bool) -> list:
    """`train.pad_to=auto` replaced by what the jobs will pad to on `device` (`resolve_pad_to`), before they are hashed.
    A remote cluster's device cannot be seen from the driver: it must be named (--device cpu or cuda), as guessing
    a GPU renamed every job of a grid run on CPUs (a `--replay` found none of its records)."""
    from suite.run.batching import resolve_pad_to

    if not any(j.train.pad_to == "auto" for j in jobs):
        return jobs
    named = device.split(":")[0]
    if remote and named not in ("cpu", "cuda"):
        raise BadInput(f"train.pad_to=auto with --executor ray --address and --device {device}: the driver cannot see "
                       "whether the cluster's workers have GPUs (auto pads to buckets there) or only CPUs (the longest "
                       "row), and a job's padding is part of its record's name. Give --device cuda or --device cpu "
                       "(or --set train.pad_to=buckets|longest)")
    kind = "cpu" if named == "cpu" else "cuda" if remote else device_type(device)
    return [dataclasses.replace(j, train=dataclasses.replace(j.train, pad_to=resolve_pad_to("auto", kind,
                                                                                            j.train.compile)))
            if j.train.pad_to == "auto" else j for j in jobs]
