"""Running a grid: which jobs are pending, who runs them, a live status line, and the status table at the end.

Executors only decide *where* a job runs; the driver (this process) always writes the records, so resuming works the
same whichever executor ran (or will run) the rest of the grid:

- `local` (default): in this process, one job after another (CPU, or the one GPU asked for). With several visible GPUs
  (or `workers=N`), a pool of spawned worker processes, one per GPU, each with its own `CUDA_VISIBLE_DEVICES`, pulling
  jobs from the driver and sending records back.
- `ray`: one Ray task per job (`num_gpus` per run, fractional to pack small runs onto one GPU; `num_cpus` on CPU-only
  clusters). A task whose worker process dies is retried (`max_retries`); a run that fails on its own (NaN loss, an
  exception) comes back as a `failed` record and is not retried. Results come back to the driver as they finish.

Workers import the modules that registered the grid's methods by name, so a method must live in an importable module
(built in, an installed plugin, or a module on the workers' PYTHONPATH), not in the driver's `__main__` script.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import math
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tabulate import tabulate

from .config import RunConfig
from .store import Store

RAY_INSTALL_HINT = "pip install '.[ray]' (or: pip install 'ray[default]')"
DEFAULT_MAX_RETRIES = 2  # re-runs of a job whose worker process died (not of runs that fail on their own)


class ExecutorError(RuntimeError):
    """An executor that cannot run here (missing package, options that do not apply); the CLI exits 2 with it."""


@dataclass
class GridResult:
    done: list[tuple[RunConfig, dict]] = field(default_factory=list)
    skipped: list[RunConfig] = field(default_factory=list)
    failed: list[tuple[RunConfig, dict]] = field(default_factory=list)
    not_run: list[RunConfig] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.not_run


def pending_jobs(jobs: list[RunConfig], store: Store, force: bool) -> tuple[list[RunConfig], list[RunConfig]]:
    """(to run, skipped). A job is skipped when an `ok` record of it exists; failed ones are run again."""
    todo, skipped = [], []
    for job in jobs:
        (skipped if not force and store.status(job.filename) == "ok" else todo).append(job)
    return todo, skipped


def failed_record(job: RunConfig, error: str, wall_s: float = 0.0) -> dict[str, Any]:
    """The record of a job that produced none itself (its worker died, or the task could not start)."""
    return {"config": job.to_dict(), "hash": job.hash, "label": job.label, "status": "failed", "error": error,
            "wall_s": wall_s, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# ---------------------------------------------------------------------------------------------------------
# Live status: done / running / pending / failed and an ETA, updated as results arrive
# ---------------------------------------------------------------------------------------------------------

def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class GridStatus:
    """Counts of the runs of this invocation; a tqdm line on a terminal, one log line per finished run otherwise.

    ETA = elapsed / finished x unfinished: throughput so far, so it accounts for however many runs go in parallel.
    """

    def __init__(self, total: int, quiet: bool = False, stream=None):
        self.total, self.quiet = total, quiet
        self.stream = stream or sys.stderr
        self.done = self.failed = self.running = 0
        self.retries = 0
        self.start = time.perf_counter()
        self._bar = None
        if not quiet and total and getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc="grid", unit="run", file=self.stream, dynamic_ncols=True,
                             bar_format="{desc}: {n_fmt}/{total_fmt} finished |{bar}| {elapsed} {postfix}")
            self._refresh()

    @property
    def finished(self) -> int:
        return self.done + self.failed

    @property
    def pending(self) -> int:
        return self.total - self.finished - self.running

    def eta(self) -> float:
        if self.finished == 0:
            return math.inf
        return (time.perf_counter() - self.start) / self.finished * (self.total - self.finished)

    def line(self) -> str:
        retried = f", {self.retries} retried" if self.retries else ""
        return (f"{self.done} done, {self.running} running, {self.pending} pending, {self.failed} failed{retried}"
                f" | ETA {_duration(self.eta()) if self.finished < self.total else '0s'}")

    def set_running(self, n: int) -> None:
        self.running = n
        self._refresh()

    def started(self, job: RunConfig) -> None:
        self.running += 1
        self._refresh()

    def retried(self, job: RunConfig, why: str) -> None:
        self.running -= 1
        self.retries += 1
        self._say(f"  RETRY {job.label}: {why}")
        self._refresh()

    def finished_run(self, job: RunConfig, rec: dict) -> None:
        self.running = max(0, self.running - 1)
        if rec["status"] == "ok":
            self.done += 1
            text = f"  done {job.label}: score {rec['final']['score']:.4f} in {rec['wall_s']:.0f}s"
        else:
            self.failed += 1
            text = f"  FAILED {job.label}: {rec.get('error', '')[:300]}"
        if self._bar is not None:
            self._bar.update(1)
            self._say(text)
            self._refresh()
        else:
            self._say(f"{text}  [{self.finished}/{self.total}: {self.line()}]")

    def _say(self, text: str) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _refresh(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self.line(), refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# ---------------------------------------------------------------------------------------------------------
# What workers need besides the job: the modules that registered its method
# ---------------------------------------------------------------------------------------------------------

def method_modules(jobs: list[RunConfig]) -> list[str]:
    """Modules whose import registers the grid's methods; workers import them before running a job."""
    from .attention import METHODS

    modules = set()
    for name in {j.method for j in jobs}:
        module = METHODS.get(name).__module__
        if module in ("__main__", "__mp_main__"):
            raise ExecutorError(f"method {name!r} is defined in the script being run, which worker processes "
                                "cannot import: move it into a module (installed, or on PYTHONPATH) and import it")
        modules.add(module)
    return sorted(modules)


def _import_modules(modules: list[str]) -> None:
    for module in modules:
        importlib.import_module(module)


# ---------------------------------------------------------------------------------------------------------
# local: sequential, or a pool of spawned worker processes (one per GPU)
# ---------------------------------------------------------------------------------------------------------

@dataclass
class LocalPlan:
    """How the local executor runs: `workers` processes (0: in this process), each with its environment overrides,
    the device string given to run_one inside a worker, and torch threads per worker (None: torch's default)."""

    workers: int
    envs: list[dict[str, str]]
    device: str
    threads: int | None


def visible_gpus(count: int, env: dict[str, str] | None = None) -> list[str]:
    """Identifiers of the GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (indices, UUIDs or MIG ids)."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [d.strip() for d in listed.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def local_plan(device: str = "auto", workers: int | None = None, gpu_count: int | None = None,
               cpu_count: int | None = None, env: dict[str, str] | None = None) -> LocalPlan:
    """Decide the local executor's layout. `gpu_count`/`cpu_count`/`env` default to this machine's (tests pass
    stand-ins). Several GPUs (device auto or cuda): one worker per GPU (or `workers`, assigned round-robin, which
    packs several runs onto a GPU). Otherwise `workers` CPU processes (default 1: in this process), sharing the cores."""
    if workers is not None and workers < 1:
        raise ExecutorError(f"--workers {workers}: give at least 1")
    if gpu_count is None:
        gpu_count = _cuda_device_count() if device in ("auto", "cuda") else 0
    cpu_count = cpu_count or _cpu_count()
    if device in ("auto", "cuda") and gpu_count > 0:
        gpus = visible_gpus(gpu_count, env)
        n = workers or len(gpus)
        if n == 1:
            return LocalPlan(0, [], device, None)
        # One GPU per worker, set before the worker starts, so torch in the worker only ever sees that GPU.
        envs = [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} for i in range(n)]
        return LocalPlan(n, envs, "cuda", max(1, cpu_count // n))
    if device == "cuda":
        raise ExecutorError("--device cuda was asked for but no CUDA device is visible")
    n = workers or 1
    if n == 1:
        return LocalPlan(0, [], device, None)
    worker_device = "cpu" if device == "auto" else device
    return LocalPlan(n, [{} for _ in range(n)], worker_device, max(1, cpu_count // n))


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@contextlib.contextmanager
def _environ(overrides: dict[str, str]):
    """Set environment variables for a child about to be spawned (it copies the environment at start)."""
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _exit_with_driver() -> None:
    """End this worker as soon as the driver process is gone, however it went (SIGKILL, a crash): a worker left
    behind would hold a GPU and its cores with nobody to hand its record to."""
    from multiprocessing.connection import wait

    driver = mp.parent_process()
    if driver is None:
        return

    def watch() -> None:
        wait([driver.sentinel])  # ready once the driver has exited
        os._exit(1)

    threading.Thread(target=watch, name="suite-driver-watch", daemon=True).start()


def _pool_worker(worker_id: int, inbox, outbox, data_dir, device: str, threads: int | None,
                 modules: list[str]) -> None:
    """A spawned local worker: run the jobs the driver sends until it sends None; send each record back."""
    _exit_with_driver()
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        _import_modules(modules)
        from .runner import run_one

        info = {"name": "local", "worker": worker_id, "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        while True:
            item = inbox.get()
            if item is None:
                return
            index, job = item
            rec = run_one(job, data_dir, device=device, quiet=True)
            rec["executor"] = info
            outbox.put((worker_id, index, rec))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the driver reports it
        return


def run_local(jobs: list[RunConfig], record: Callable[[RunConfig, dict], None], data_dir, device: str,
              quiet: bool, status: GridStatus | None = None, workers: int | None = None,
              max_retries: int = DEFAULT_MAX_RETRIES, plan: LocalPlan | None = None) -> None:
    """Sequential in this process, or a spawned worker pool when the plan says so (several GPUs, or workers > 1)."""
    status = status or GridStatus(len(jobs), quiet=True)
    plan = plan or local_plan(device, workers)
    if plan.workers == 0:
        from .runner import run_one

        info = {"name": "local", "worker": None, "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        for job in jobs:
            status.started(job)
            rec = run_one(job, data_dir, device=device, quiet=quiet)
            rec["executor"] = info
            record(job, rec)
        return
    _run_pool(jobs, record, data_dir, plan, status, max_retries)


def _run_pool(jobs, record, data_dir, plan: LocalPlan, status: GridStatus, max_retries: int) -> None:
    ctx = mp.get_context("spawn")  # fresh interpreters: no CUDA state inherited, CUDA_VISIBLE_DEVICES honoured
    outbox = ctx.Queue()
    modules = method_modules(jobs)
    todo = deque(enumerate(jobs))
    attempts = [0] * len(jobs)
    procs: dict[int, Any] = {}
    inboxes: dict[int, Any] = {}
    running: dict[int, int] = {}  # worker -> index of the job it runs

    def spawn(wid: int) -> None:
        inboxes[wid] = ctx.Queue()
        with _environ(plan.envs[wid]):
            p = ctx.Process(target=_pool_worker, name=f"suite-worker-{wid}", daemon=True,
                            args=(wid, inboxes[wid], outbox, data_dir, plan.device, plan.threads, modules))
            p.start()
        procs[wid] = p

    def assign(wid: int) -> None:
        if todo:
            index, job = todo.popleft()
            attempts[index] += 1
            running[wid] = index
            inboxes[wid].put((index, job))
            status.started(job)
        else:
            inboxes[wid].put(None)

    def handle(msg) -> None:
        wid, index, rec = msg
        if running.get(wid) != index:
            return  # a record that arrived after its job was given up on
        del running[wid]
        assign(wid)  # the worker starts its next job while the driver writes this record
        record(jobs[index], rec)

    try:
        for wid in range(min(plan.workers, len(jobs))):
            spawn(wid)
            assign(wid)
        while running:
            try:
                handle(outbox.get(timeout=1.0))
                continue
            except queue_mod.Empty:
                pass
            for wid in [w for w in running if not procs[w].is_alive()]:
                while True:  # a record it sent just before exiting still counts
                    try:
                        handle(outbox.get_nowait())
                    except queue_mod.Empty:
                        break
                if wid not in running:
                    continue
                index = running.pop(wid)
                job, code = jobs[index], procs[wid].exitcode
                if attempts[index] <= max_retries:
                    todo.appendleft((index, job))
                    status.retried(job, f"worker {wid} died (exit code {code}); running the job again")
                else:
                    record(job, failed_record(job, f"WorkerDied: the worker process exited with code {code} "
                                                   f"on each of {attempts[index]} attempts"))
                if todo:
                    spawn(wid)
                    assign(wid)
    finally:
        for wid, p in procs.items():
            if p.is_alive():
                with contextlib.suppress(Exception):
                    inboxes[wid].put(None)
        for p in procs.values():
            p.join(timeout=10 if not running else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


# ---------------------------------------------------------------------------------------------------------
# ray: one task per job, on a local cluster or an existing one
# ---------------------------------------------------------------------------------------------------------

def import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL_HINT}") from None
    return ray


def ship_data(jobs: list[RunConfig], data_dir) -> dict[str, bytes] | None:
    """The local TSV files the grid reads, {relative path: bytes}, to send to workers that lack the folder."""
    from .data import get_task, resolve_data_dir

    root = resolve_data_dir(data_dir)
    if root is None:
        return None  # the hub: every worker downloads (or finds in its cache) the dataset itself
    files: dict[str, bytes] = {}
    for task in sorted({j.task for j in jobs}):
        spec = get_task(task)
        for split in [spec.train_split, *spec.eval_splits.values()]:
            rel = f"{spec.local_dir}/{spec.local[split].file}"
            files[rel] = (root / rel).read_bytes()
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
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return target


def _ray_job(job: RunConfig, data_dir, device: str, threads: int, modules: list[str],
             files: dict[str, bytes] | None) -> dict:
    """Body of one Ray task: run the job on this worker and return its record (the driver writes it)."""
    import platform

    import torch

    torch.set_num_threads(threads)
    _import_modules(modules)
    from .runner import run_one

    if files is not None:
        data_dir = materialise_data(files)
    rec = run_one(job, data_dir, device=device, quiet=True)
    rec["executor"] = {"name": "ray", "host": platform.node(), "pid": os.getpid(),
                       "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    return rec


def run_ray(jobs: list[RunConfig], record: Callable[[RunConfig, dict], None], data_dir, device: str, quiet: bool,
            status: GridStatus | None = None, address: str | None = None, gpus_per_run: float | None = None,
            cpus_per_run: float | None = None, max_retries: int = DEFAULT_MAX_RETRIES,
            ship: bool | None = None) -> None:
    """Submit every job as a Ray task and write records as they finish.

    Without `address` a private local cluster is started (and shut down at the end); with it (`auto`, `host:port`,
    `ray://host:10001`) the existing cluster is used. When Ray is already initialised in this process, that
    connection is used and left open. `ship` (default: when connecting to an existing cluster) sends the grid's data
    files through the object store, so workers need no shared filesystem; model folders must exist on every worker
    (or use hub ids / the packaged `minilm`).
    """
    ray = import_ray()
    status = status or GridStatus(len(jobs), quiet=True)
    modules = method_modules(jobs)
    started_here = False
    if not ray.is_initialized():
        import logging

        where = {"address": address} if address else {"address": "local", "include_dashboard": False}
        ray.init(**where, log_to_driver=not quiet, logging_level=logging.WARNING if quiet else logging.INFO)
        started_here = True
    refs: dict[Any, RunConfig] = {}
    try:
        resources = ray.cluster_resources()
        cluster_gpus = resources.get("GPU", 0)
        if device.startswith("cuda") and not cluster_gpus:
            raise ExecutorError("--device cuda was asked for but the Ray cluster has no GPU")
        use_gpu = cluster_gpus > 0 and device != "cpu"
        num_gpus = (gpus_per_run if gpus_per_run is not None else 1) if use_gpu else 0
        num_cpus = cpus_per_run if cpus_per_run is not None else 1
        if use_gpu and num_gpus <= 0:
            raise ExecutorError(f"--gpus-per-run {gpus_per_run}: give a value > 0 (e.g. 0.5 packs two runs per GPU)")
        threads = max(1, int(num_cpus))
        if ship is None:
            ship = address is not None
        files = ship_data(jobs, data_dir) if ship else None
        files_ref = ray.put(files) if files is not None else None
        task = ray.remote(_ray_job).options(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries,
                                            retry_exceptions=False, name="suite-run")
        run_device = "cuda" if num_gpus else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES to the task's GPU(s)
        for job in jobs:
            refs[task.remote(job, data_dir, run_device, threads, modules, files_ref)] = job

        def capacity() -> int:
            free = ray.cluster_resources()
            slots = free.get("CPU", 0) / num_cpus if num_cpus else math.inf
            if num_gpus:
                slots = min(slots, free.get("GPU", 0) / num_gpus)
            return int(slots) if math.isfinite(slots) else len(refs)

        slots, checked = capacity(), time.monotonic()
        status.set_running(min(len(refs), slots))
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=2.0)
            for ref in ready:
                job = refs.pop(ref)
                try:
                    rec = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the worker died max_retries + 1 times, or could not start
                    rec = failed_record(job, f"{type(exc).__name__}: {str(exc)[:2000]}")
                record(job, rec)
            if time.monotonic() - checked > 30:  # clusters grow and shrink
                slots, checked = capacity(), time.monotonic()
            status.set_running(min(len(refs), slots))
    finally:
        for ref in refs:  # interrupted: stop what still runs
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------

EXECUTORS: dict[str, Callable] = {"local": run_local, "ray": run_ray}
OPTIONS = {"local": {"workers", "max_retries", "plan"},
           "ray": {"address", "gpus_per_run", "cpus_per_run", "max_retries", "ship"}}


def check_executor(executor: str, options: dict[str, Any]) -> None:
    """Fail before anything runs: unknown executor, options that belong to another one, Ray missing."""
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}. Valid executors: {', '.join(EXECUTORS)}")
    wrong = sorted(k for k, v in options.items() if v is not None and k not in OPTIONS[executor])
    if wrong:
        flags = ", ".join("--" + k.replace("_", "-") for k in wrong)
        owners = {k: [e for e, opts in OPTIONS.items() if k in opts] for k in wrong}
        hint = "; ".join(f"--{k.replace('_', '-')} is for --executor {'/'.join(v)}" for k, v in owners.items() if v)
        raise ExecutorError(f"{flags} does not apply to --executor {executor}" + (f" ({hint})" if hint else ""))
    for key in ("gpus_per_run", "cpus_per_run"):
        v = options.get(key)
        if v is not None and not v > 0:
            raise ExecutorError(f"--{key.replace('_', '-')} {v}: give a value > 0")
    if executor == "ray":
        import_ray()


def run_grid(jobs: list[RunConfig], store: Store, data_dir=None, executor: str = "local", force: bool = False,
             quiet: bool = False, device: str = "auto", **executor_options) -> GridResult:
    options = {k: v for k, v in executor_options.items() if v is not None}
    check_executor(executor, options)
    todo, skipped = pending_jobs(jobs, store, force)
    result = GridResult(skipped=skipped)
    finished: set[str] = set()
    status = GridStatus(len(todo), quiet=quiet)

    def record(job: RunConfig, rec: dict) -> None:
        store.write(job.filename, rec)
        finished.add(job.hash)
        (result.done if rec["status"] == "ok" else result.failed).append((job, rec))
        status.finished_run(job, rec)

    if not quiet and skipped:
        print(f"{len(skipped)} of {len(jobs)} runs already have records in {store.runs}: skipped "
              "(--force reruns them)", file=sys.stderr)
    try:
        if todo:
            EXECUTORS[executor](todo, record, data_dir, device, quiet, status=status, **options)
    finally:
        status.close()
        result.not_run = [j for j in todo if j.hash not in finished]
    return result


def status_table(result: GridResult) -> str:
    rows = []
    for job, rec in result.done:
        rows.append([job.label, "done", f"{rec['final']['score']:.4f}", f"{rec['wall_s']:.0f}s", ""])
    for job in result.skipped:
        rows.append([job.label, "skipped", "", "", "record exists"])
    for job, rec in result.failed:
        rows.append([job.label, "failed", "", f"{rec.get('wall_s', 0):.0f}s", rec.get("error", "")[-160:]])
    for job in result.not_run:
        rows.append([job.label, "not run", "", "", "interrupted"])
    counts = (f"{len(result.done)} done, {len(result.skipped)} skipped, {len(result.failed)} failed"
              + (f", {len(result.not_run)} not run" if result.not_run else ""))
    return tabulate(rows, headers=["run", "status", "dev score", "time", "note"], tablefmt="github") + "\n" + counts

