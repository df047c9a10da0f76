"""The local executor: in this process, one job after another (CPU, or the one GPU asked for); with several visible
GPUs (or `workers=N`), a pool of spawned worker processes (see `pool`), one per GPU, each with its own
`CUDA_VISIBLE_DEVICES`."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

from suite.api.errors import ExecutorError
from suite.grid.executors.gate import StartGate
from suite.grid.executors.pool import WorkerPool, max_run_seconds
from suite.grid.executors.status import GridStatus
from suite.grid.executors.workers import DEFAULT_MAX_RETRIES, executor_info, rerun_eagerly, without_capture
from suite.run.device import torch_threads
from suite.run.record import RunRecord
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["LocalPlan", "local_plan", "run_local", "visible_gpus"]


@dataclass
class LocalPlan:
    """How the local executor runs: `workers` processes (0: in this process), each with its environment overrides,
    the device string given to run_one inside a worker, and torch threads per training process
    (`suite.run.device.torch_threads`)."""

    workers: int
    envs: list[dict[str, str]]
    device: str
    threads: int
    memory_fraction: float | None = None  # each worker's share of its GPU's memory when workers share a GPU


def visible_gpus(count: int, env: dict[str, str] | None = None) -> list[str]:
    """Identifiers of the GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (indices, UUIDs or MIG ids)."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [d.strip() for d in listed.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


AUTO_MAX_WORKERS = 8  # per GPU, or on the CPU: beyond it a small run's share of the host is too thin to measure
# What one run may take, for `--workers auto`. On a GPU, a BERT-base run (estimates: no GPU has measured them yet;
# a record's timing.peak_reserved_mb will): its eager step, 6 GiB (weights, gradients and AdamW's state at 16 bytes
# a parameter, 1.8 GB; bf16 activations of a 32 x 128 batch, about 1.8 GB; the CUDA context and the allocator's
# cache), and its captured graphs' one shared pool, 4 GiB (one step's activations and fp32 gradients at the largest
# shape, about 2.5 GB: suite.run.capture). On the CPU, the driver's 2.7 GB peak of the README's main job.
RUN_EAGER_GPU_BYTES, GRAPH_POOL_GPU_BYTES = 6 * 2**30, 4 * 2**30
RUN_GPU_BYTES, RUN_CPU_BYTES = RUN_EAGER_GPU_BYTES + GRAPH_POOL_GPU_BYTES, 3 * 2**30


def auto_workers(slots: int, cores: int, memory: int, per_run: int) -> int:
    """Runs side by side on one device for `--workers auto`: as many as its memory holds (`per_run` bytes each)
    and the host's cores give one each, at most AUTO_MAX_WORKERS, at least 1."""
    return max(1, min(AUTO_MAX_WORKERS, slots, cores, memory // per_run))


def local_plan(device: str = "auto", workers: int | str | None = None, gpu_count: int | None = None,
               cpu_count: int | None = None, env: dict[str, str] | None = None,
               memory: int | None = None) -> LocalPlan:
    """Decide the local executor's layout. `gpu_count`/`cpu_count`/`env`/`memory` (one GPU's, or the machine's
    RAM) default to this machine's (tests pass stand-ins). Several GPUs (device auto or cuda): one worker per GPU
    (or `workers`, assigned round-robin, which packs several runs onto a GPU; `auto`: `auto_workers` per GPU).
    Otherwise `workers` CPU processes (default 1: in this process; `auto`: one per core as the memory allows),
    sharing the cores: each gets its share of them as torch threads (the user's OMP_NUM_THREADS when set)."""
    if workers is not None and workers != "auto" and workers < 1:
        raise ExecutorError(f"--workers {workers}: give at least 1 (or auto)")
    if gpu_count is None:
        gpu_count = _cuda_device_count() if device in ("auto", "cuda") else 0
    cpu_count = cpu_count or _cpu_count()
    if device in ("auto", "cuda") and gpu_count > 0:
        gpus = visible_gpus(gpu_count, env)
        if workers == "auto":
            per_gpu = auto_workers(AUTO_MAX_WORKERS, cpu_count // len(gpus), memory or _gpu_memory(), RUN_GPU_BYTES)
            workers = per_gpu * len(gpus)
        n = workers or len(gpus)
        if n == 1:
            return LocalPlan(0, [], device, torch_threads(1, cpu_count, env))
        # One GPU per worker, set before the worker starts, so torch in the worker only ever sees that GPU.
        envs = [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} for i in range(n)]
        per_gpu = math.ceil(n / len(gpus))  # round-robin: the most workers any GPU gets
        return LocalPlan(n, envs, "cuda", torch_threads(n, cpu_count, env), 1 / per_gpu if per_gpu > 1 else None)
    if device == "cuda":
        raise ExecutorError("--device cuda was asked for but no CUDA device is visible")
    if workers == "auto":
        from suite.grid.preflight import machine_memory

        workers = auto_workers(AUTO_MAX_WORKERS, cpu_count, memory or machine_memory()[0], RUN_CPU_BYTES)
    n = workers or 1
    if n == 1:
        return LocalPlan(0, [], device, torch_threads(1, cpu_count, env))
    worker_device = "cpu" if device == "auto" else device
    return LocalPlan(n, [{} for _ in range(n)], worker_device, torch_threads(n, cpu_count, env))


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _gpu_memory() -> int:
    """The smallest visible GPU's memory in bytes."""
    import torch

    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run_local(jobs: list[RunConfig], record: Callable[[RunConfig, RunRecord], None], data_dir, device: str,
              quiet: bool, status: GridStatus | None = None, workers: int | str | None = None,
              max_retries: int = DEFAULT_MAX_RETRIES, plan: LocalPlan | None = None,
              max_run_minutes: float | None = None, gate: StartGate | None = None) -> None:
    """Sequential in this process, or a spawned worker pool when the plan says so (several GPUs, or workers > 1).
    A time limit per run needs a process that can be killed: with one, even a single worker runs as a pool.
    `gate`: asked before each run starts (suite.grid.executors.gate)."""
    status = status or GridStatus(len(jobs), quiet=True)
    plan = plan or local_plan(device, workers)
    limit_s = max_run_seconds(max_run_minutes)
    if plan.workers == 0 and _CAPTURE_FAILED_HERE:  # this process is left mid-capture: a fresh one runs the grid
        plan = LocalPlan(1, [{}], plan.device, plan.threads)
    if plan.workers == 0 and limit_s:
        plan = LocalPlan(1, [{}], "cpu" if plan.device == "auto" else plan.device, plan.threads)
    if plan.workers == 0:
        _run_in_process(jobs, record, data_dir, device, quiet, status, plan.threads, max_retries, gate)
    else:
        WorkerPool(jobs, record, data_dir, plan.envs, plan.device, plan.threads, status, max_retries,
                   plan.memory_fraction, limit_s, gate=gate).run()


_CAPTURE_FAILED_HERE: list[bool] = []  # not empty once a capture failed in this process: its later grids use a worker


def _run_in_process(jobs: list[RunConfig], record: Callable[[RunConfig, RunRecord], None], data_dir, device: str,
                    quiet: bool, status: GridStatus, threads: int, max_retries: int = DEFAULT_MAX_RETRIES,
                    gate: StartGate | None = None) -> None:
    """One job after another in this process. After a failed capture this process is left mid-capture: the job
    (eagerly) and the rest of the grid run on in one spawned worker instead."""
    import torch

    from suite.run.runner import run_one

    torch.set_num_threads(threads)

    info = executor_info("local", worker=None)
    for i, job in enumerate(jobs):
        if gate is not None and not gate.allows(job, status):
            continue
        status.started(job)
        rec = run_one(job, data_dir, device=device, quiet=quiet,
                      on_progress=lambda event, j=job: status.progress(j, event))
        rec.ran_by(info)
        eager = rerun_eagerly(job, rec.error)
        if eager is not None:
            _CAPTURE_FAILED_HERE.append(True)
            status.retried(job, f"this process: {eager}; the rest of the grid runs in a fresh worker process")
            rest = [without_capture(job), *jobs[i + 1:]]
            WorkerPool(rest, record, data_dir, [{}], device, threads, status, max_retries,
                       eager_notes={0: f"this process: {eager}"}, gate=gate).run()
            return
        record(job, rec)
