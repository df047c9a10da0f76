"""The Ray executor: one Ray task per job, on a private local cluster or an existing one.

`num_gpus` per run (fractional to pack small runs onto one GPU), `num_cpus` on CPU-only clusters. A task whose worker
process dies is retried (`max_retries`); a run that fails on its own (NaN loss, an exception) comes back as a `failed`
record and is not retried. Results come back to the driver as they finish; the driver writes them.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import platform
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from suite.api.errors import ExecutorError
from suite.grid.executors.returned import check_outputs_can_come_back, in_private_folder, pack, unpack
from suite.grid.executors.status import GridStatus
from suite.grid.executors.workers import (
    DEFAULT_MAX_RETRIES,
    executor_info,
    import_method_modules,
    method_modules,
    noted_eager,
    rerun_eagerly,
    without_capture,
)
from suite.run import stopping
from suite.run.device import wait_env
from suite.run.progress import ProgressLines
from suite.run.record import RunRecord
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["TaskResources", "check_address", "connected", "declared_task", "import_ray", "kept_signal_handlers",
           "run_ray"]

CONNECT_TIMEOUT_S = 10  # a cluster's port that does not answer within this is not there (Ray itself waits minutes)


def check_address(address: str) -> None:
    """ExecutorError unless `address` is `auto`, HOST:PORT or ray://HOST:PORT with something listening at it: a
    malformed address gave a raw ValueError, and one where nothing listens kept the driver waiting for minutes."""
    import socket

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ExecutorError(f"--address {address!r}: give auto, HOST:PORT (a cluster's head, e.g. 10.0.0.5:6379) "
                            "or ray://HOST:PORT (Ray Client, e.g. ray://10.0.0.5:10001)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ExecutorError(f"--address {address}: nothing answers there within {CONNECT_TIMEOUT_S} s "
                            f"({exc.strerror or exc}); start the cluster (`ray start --head`) or give its address, "
                            "or leave --address out to start a local cluster") from None

RAY_INSTALL_HINT = "pip install '.[ray]' (or: pip install 'ray[default]')"
RECHECK_CAPACITY_S = 30  # clusters grow and shrink: how often the running count re-reads the free resources


def import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL_HINT}") from None
    return ray


def ship_data(jobs: list[RunConfig], data_dir) -> dict[str, bytes] | None:
    """The local TSV files the grid reads, {relative path: bytes}, to send to workers that lack the folder."""
    from suite.api.tasks import get_task
    from suite.run.data import resolve_data_dir

    root = resolve_data_dir(data_dir)
    if root is None:
        return None  # the hub: every worker downloads (or finds in its cache) the dataset itself
    files: dict[str, bytes] = {}
    for task in sorted({j.task for j in jobs}):
        spec = get_task(task)
        for split in [spec.train_split, *spec.eval_splits.values()]:
            rel = f"{spec.local_dir}/{spec.local[split].file}"
            files[rel] = (root / rel).read_bytes()
        if not spec.data_dir and any(j.outputs and j.outputs.predict_test for j in jobs if j.task == task):
            for test_set in spec.test_sets:  # --predict-test: the test files the driver's preflight found
                if (root / test_set.file).is_file():
                    files[test_set.file] = (root / test_set.file).read_bytes()
    return files


def materialise_data(files: dict[str, bytes]) -> Path:
    """Write shipped data files once per machine under the temp folder (content-addressed) and return that folder."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    target = Path(tempfile.gettempdir()) / "suite-data" / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    for rel, blob in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(blob)
    try:
        staging.rename(target)  # atomic; another task on this machine may have won the race
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def task_attempt() -> int | None:
    """Which attempt at its task this Ray worker runs (1: the first; Ray retries a task whose worker died), or None
    where this Ray version does not say (the call is Ray's internal one: no public API gives it)."""
    try:
        import ray

        return int(ray._private.worker.global_worker.core_worker.get_current_task_attempt_number()) + 1
    except Exception:  # noqa: BLE001  only a fact for the record
        return None


def _ray_job(job: RunConfig, data_dir, device: str, threads: int, modules: list[str],
             files: dict[str, bytes] | None, bring_back: bool = False,
             memory_fraction: float | None = None) -> tuple[RunRecord, bytes | None]:
    """Body of one Ray task: run the job on this worker; return its record (the driver writes it) and, with
    `bring_back`, the files the run wrote (a tar: see `returned`), written here into a private folder."""
    import torch

    torch.set_num_threads(threads)
    import_method_modules(modules)
    from suite.run.runner import run_one

    if files is not None:
        data_dir = materialise_data(files)
    folder = None
    if bring_back:
        job, folder = in_private_folder(job)
    lines = ProgressLines()  # printed here: Ray brings a worker's output to the driver's log (unless --quiet)
    rec = run_one(job, data_dir, device=device, quiet=True, memory_fraction=memory_fraction,
                  on_progress=lambda event: _print_line(lines.line(job.label, event)))
    rec.ran_by(executor_info("ray", host=platform.node(), attempts=task_attempt()))
    return rec, (pack(folder) if folder is not None else None)


def _print_line(line: str | None) -> None:
    if line is not None:
        print(line, file=sys.stderr, flush=True)


@dataclass
class TaskResources:
    """What one Ray task asks for: CPUs, GPUs (0: a CPU run; fractional packs runs onto a GPU)."""

    num_cpus: float
    num_gpus: float

    @classmethod
    def choose(cls, cluster_gpus: float, device: str, gpus_per_run: float | None,
               cpus_per_run: float | None) -> TaskResources:
        if device.startswith("cuda") and not cluster_gpus:
            raise ExecutorError("--device cuda was asked for but the Ray cluster has no GPU")
        use_gpu = cluster_gpus > 0 and device != "cpu"
        num_gpus = (gpus_per_run if gpus_per_run is not None else 1) if use_gpu else 0
        if use_gpu and num_gpus <= 0:
            raise ExecutorError(f"--gpus-per-run {gpus_per_run}: give a value > 0 (e.g. 0.5 packs two runs per GPU)")
        return cls(cpus_per_run if cpus_per_run is not None else 1, num_gpus)

    @property
    def threads(self) -> int:
        return max(1, int(self.num_cpus))

    @property
    def device(self) -> str:
        return "cuda" if self.num_gpus else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES to the task's GPU(s)

    @property
    def memory_fraction(self) -> float | None:
        """A run's share of its GPU's memory when runs share a GPU (--gpus-per-run below 1), else None."""
        return self.num_gpus if 0 < self.num_gpus < 1 else None

    def slots(self, cluster: dict[str, float], pending: int) -> int:
        """How many such tasks the cluster's resources hold at once (`pending` when nothing limits them)."""
        slots = cluster.get("CPU", 0) / self.num_cpus if self.num_cpus else math.inf
        if self.num_gpus:
            slots = min(slots, cluster.get("GPU", 0) / self.num_gpus)
        return int(slots) if math.isfinite(slots) else pending


def declared_task(ray, resources: "TaskResources"):
    return ray.remote(max_calls=1)(_ray_job) if resources.num_gpus else ray.remote(_ray_job)


def remote_task(ray, resources: "TaskResources", max_retries: int, env: dict[str, str] | None = None):
    """The Ray task of one run. A GPU run gets a fresh worker process (max_calls=1): Ray applies that default only to
    functions declared with num_gpus, not to GPU options given later, and refuses max_calls in `.options`; a reused
    process would keep the previous run's CUDA context and cached memory and ignore a changed CUDA_VISIBLE_DEVICES.
    `env`: environment variables the workers need from the driver (an MLflow server's address); the OpenMP wait
    policy (`wait_env`) goes with them: a worker of a cluster started elsewhere does not inherit the driver's."""
    env_vars = {**wait_env(), **(env or {})}
    return declared_task(ray, resources).options(num_cpus=resources.num_cpus, num_gpus=resources.num_gpus,
                                                 max_retries=max_retries, retry_exceptions=False, name="suite-run",
                                                 runtime_env={"env_vars": env_vars})


@contextlib.contextmanager
def kept_signal_handlers():
    """SIGTERM and SIGINT handlers as they were before the block (the suite's stop handling survives ray.init)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            with contextlib.suppress(ValueError, TypeError):  # not the main thread / a handler set outside Python
                signal.signal(sig, handler)


def run_ray(jobs: list[RunConfig], record: Callable[[RunConfig, RunRecord], None], data_dir, device: str, quiet: bool,
            status: GridStatus | None = None, address: str | None = None, gpus_per_run: float | None = None,
            cpus_per_run: float | None = None, max_retries: int = DEFAULT_MAX_RETRIES,
            ship: bool | None = None) -> None:
    """Submit every job as a Ray task and write records as they finish.

    Without `address` a private local cluster is started (and shut down at the end); with it (`auto`, `host:port`,
    `ray://host:10001`) the existing cluster is used. When Ray is already initialised in this process, that
    connection is used and left open. `ship` (default: when connecting to an existing cluster) sends the grid's data
    files (and test files for --predict-test) through the object store and brings every file a run writes back with
    its record (`returned`), so workers need no shared filesystem; model folders must exist on every worker (or use
    hub ids / the packaged `minilm`).
    """
    ray = import_ray()
    status = status or GridStatus(len(jobs), quiet=True)
    modules = method_modules(jobs)
    if ship is None:
        ship = address is not None
    env = check_outputs_can_come_back(jobs) if ship else {}
    with connected(ray, address, quiet):
        refs: dict[Any, RunConfig] = {}
        try:
            resources = TaskResources.choose(ray.cluster_resources().get("GPU", 0), device, gpus_per_run,
                                             cpus_per_run)
            files = ship_data(jobs, data_dir) if ship else None
            files_ref = ray.put(files) if files is not None else None
            task = remote_task(ray, resources, max_retries, env)

            def submit(job: RunConfig):
                return task.remote(job, data_dir, resources.device, resources.threads, modules, files_ref,
                                   bool(ship and job.outputs and job.outputs.active), resources.memory_fraction)

            for job in jobs:
                refs[submit(job)] = job
            _collect(ray, refs, record, status, resources, submit)
        finally:
            for ref in refs:  # interrupted: stop what still runs
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)


@contextlib.contextmanager
def connected(ray, address: str | None, quiet: bool):
    """Ray initialised for the block: the cluster at `address`, or without it a private local cluster started here
    and shut down after the block; a connection this process already had is used and left open. Ray listens on every
    interface it finds, whatever it is told: confine a local cluster with a network namespace
    (docs/running-grids.md#keeping-a-local-cluster-on-loopback)."""
    started_here = False
    if not ray.is_initialized():
        if address:
            check_address(address)
        where = {"address": address} if address else {"address": "local", "include_dashboard": False}
        with kept_signal_handlers():  # ray.init installs its own SIGTERM handler, which aborts the driver (134)
            ray.init(**where, log_to_driver=not quiet, logging_level=logging.WARNING if quiet else logging.INFO)
        started_here = True
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def _collect(ray, refs: dict[Any, RunConfig], record: Callable[[RunConfig, RunRecord], None], status: GridStatus,
             resources: TaskResources, submit: Callable[[RunConfig], Any] | None = None) -> None:
    """Hand each record to `record` as its task finishes, removing it from `refs`; keep the running count current.
    A job whose capture failed is submitted once more with capture off (`submit`): a GPU task runs in a fresh
    worker process (max_calls=1), and on CPUs no capture is tried."""
    notes: dict[str, str] = {}  # job hash -> why it runs eagerly now
    slots, checked = resources.slots(ray.cluster_resources(), len(refs)), time.monotonic()
    status.set_running(min(len(refs), slots))
    while refs:
        try:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=2.0)
        except SystemError:  # a stop signal's exception raised inside Ray's compiled code comes out as this
            stopping.check()  # the stop itself (Terminated: exit 143; Ctrl-C: 130), finished records kept
            raise
        stopping.check()
        for ref in ready:
            job = refs.pop(ref)
            try:
                rec, returned = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the worker died max_retries + 1 times, or could not start
                rec, returned = RunRecord.failed(job, f"{type(exc).__name__}: {str(exc)[:2000]}"), None
            if returned is not None:  # before the record, so that its artifacts exist when it does
                rec.note_executor(outputs_returned=unpack(returned, job.outputs.root))
            if rec.attempts > 1:
                status.add_retries(rec.attempts - 1)
            eager = rerun_eagerly(job, rec.error) if submit is not None else None
            if eager is not None:
                notes[job.hash] = eager
                status.retried(job, eager)
                eager_job = without_capture(job)
                refs[submit(eager_job)] = eager_job
                continue
            if job.hash in notes:
                noted_eager(rec, notes[job.hash])
            record(job, rec)
        if time.monotonic() - checked > RECHECK_CAPACITY_S:
            slots, checked = resources.slots(ray.cluster_resources(), len(refs)), time.monotonic()
        status.set_running(min(len(refs), slots))
