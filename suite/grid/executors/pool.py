"""A pool of spawned worker processes on this machine (one per GPU, or several sharing the CPU cores): workers pull
jobs from the driver and send records back; a job whose worker dies is run again on a fresh worker, and one whose
CUDA graph capture failed runs again eagerly on a fresh worker."""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections import deque
from multiprocessing import resource_tracker
from typing import Any, Callable

from suite.grid.executors.gate import StartGate
from suite.grid.executors.status import GridStatus
from suite.grid.executors.workers import (
    executor_info,
    import_method_modules,
    method_modules,
    noted_eager,
    rerun_eagerly,
    without_capture,
)
from suite.run.device import wait_env
from suite.run.progress import Progress
from suite.run.record import RunRecord
from suite.run.settings import RunConfig

__all__ = ["WorkerPool", "max_run_seconds"]  # what the rest of the suite uses; other names are this module's own

POLL_S = 1.0  # how often the driver looks for dead workers while no record arrives
STOP_GRACE_S = 5.0  # a stopping worker gets this long after SIGTERM, then SIGKILL (a SIGSTOPped one ignores SIGTERM)
# Optional limit on one run's wall time in a worker pool, in minutes: a worker that is stopped (SIGSTOP), hung or
# far slower than expected would otherwise hold the grid forever. Past it, the worker is killed, the run recorded as
# failed with the reason, and the grid goes on with a fresh worker. Unset or 0: no limit.
MAX_RUN_MINUTES_ENV = "SUITE_MAX_RUN_MINUTES"


def max_run_seconds(flag: float | None = None) -> float | None:
    """The per-run time limit in seconds from --max-run-minutes (`flag`), else $SUITE_MAX_RUN_MINUTES; None: no
    limit (unset or 0). One rule for both: a value that is no finite number >= 0 is refused before anything runs."""
    import math

    from suite.api.errors import ExecutorError

    if flag is not None:
        text, where = str(flag), "--max-run-minutes"
    else:
        text, where = os.environ.get(MAX_RUN_MINUTES_ENV, "").strip(), MAX_RUN_MINUTES_ENV
    if not text:
        return None
    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not math.isfinite(minutes) or minutes < 0:
        raise ExecutorError(f"{where}={text!r}: give the longest a run may take in minutes (a finite number > 0), "
                            "or leave it unset or 0 for no limit")
    return minutes * 60 if minutes > 0 else None


# A worker says when it begins a job, after its own start (imports, CUDA): the run's clock starts then. One that
# never says so within this allowance past the limit is as stuck as a run past it.
START_ALLOWANCE_S = 600


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


@contextlib.contextmanager
def _usr1_blocked():
    """SIGUSR1 blocked while a worker starts: it inherits the mask, so a drain sent to the process group before it
    has set the signal aside (after its imports) stays pending instead of ending it; it then ignores and unblocks."""
    if not hasattr(signal, "pthread_sigmask") or not hasattr(signal, "SIGUSR1"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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


def _pool_worker(worker_id: int, inbox, outbox, data_dir, device: str, threads: int,
                 modules: list[str], memory_fraction: float | None = None) -> None:
    """A spawned local worker: run the jobs the driver sends until it sends None; send each record back. After an
    error that breaks this process's CUDA context (`is_sticky_cuda_error`) or a failed capture, which leaves it
    mid-capture (`is_capture_failure`), it says so and exits: the driver starts a fresh worker, since every later
    job here would fail too."""
    _exit_with_driver()
    if hasattr(signal, "SIGUSR1"):  # a drain asked of the whole process group is the driver's to act on
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # blocked from its start (_usr1_blocked)
    try:
        import torch

        torch.set_num_threads(threads)
        import_method_modules(modules)
        from suite.run.device import is_capture_failure, is_sticky_cuda_error
        from suite.run.runner import run_one

        while True:
            item = inbox.get()
            if item is None:
                return
            index, attempt, job = item
            outbox.put((worker_id, index, None, False))  # begun: --max-run-minutes counts from here
            rec = run_one(job, data_dir, device=device, quiet=True, memory_fraction=memory_fraction,
                          on_progress=lambda event, i=index: outbox.put((worker_id, i, event, False)))
            rec.ran_by(executor_info("local", worker=worker_id, attempts=attempt))
            broken = is_sticky_cuda_error(rec.error) or is_capture_failure(rec.error)
            outbox.put((worker_id, index, rec, broken))
            if broken:
                return  # the queue's feeder thread still delivers the record before the process ends
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the driver reports it
        return


class WorkerPool:
    """One worker process per entry of `worker_envs` (the environment overrides it starts with), fed one job at a
    time by the driver, which writes every record itself."""

    def __init__(self, jobs: list[RunConfig], record: Callable[[RunConfig, RunRecord], None], data_dir,
                 worker_envs: list[dict[str, str]], device: str, threads: int, status: GridStatus,
                 max_retries: int, memory_fraction: float | None = None, max_run_s: float | None = None,
                 eager_notes: dict[int, str] | None = None, gate: StartGate | None = None):
        # spawn: fresh interpreters, so no CUDA state is inherited and CUDA_VISIBLE_DEVICES is honoured
        self.mp_context = mp.get_context("spawn")
        with _usr1_blocked():  # the queues' helper process keeps SIGUSR1 blocked for good: a drain does not end it
            resource_tracker.ensure_running()
        self.outbox = self.mp_context.Queue()
        self.modules = method_modules(jobs)
        self.jobs, self.record, self.data_dir = jobs, record, data_dir
        self.worker_envs, self.device, self.threads = worker_envs, device, threads
        self.status, self.max_retries, self.memory_fraction = status, max_retries, memory_fraction
        self.todo = deque(enumerate(jobs))
        self.attempts = [0] * len(jobs)
        self.procs: dict[int, Any] = {}
        self.inboxes: dict[int, Any] = {}
        self.running: dict[int, int] = {}  # worker -> index of the job it runs
        self.max_run_s = max_run_s if max_run_s is not None else max_run_seconds()
        self.started_at: dict[int, float] = {}  # worker -> when its current job was sent, then begun (monotonic)
        self.begun: set[int] = set()  # workers that said their current job has begun
        self.eager_notes = dict(eager_notes or {})  # job index -> why it runs eagerly now (its capture failed)
        self.gate = gate  # asked before each start (suite.grid.executors.gate)
        for index in self.eager_notes:
            self.attempts[index] = 1  # its capture failed in an attempt before this pool

    def run(self) -> None:
        try:
            for worker_id in range(min(len(self.worker_envs), len(self.jobs))):
                if not self._startable():
                    break
                self._spawn(worker_id)
                self._assign(worker_id)
            while self.running:
                try:
                    self._handle(self.outbox.get(timeout=POLL_S))
                    continue
                except queue.Empty:
                    pass
                for worker_id in [w for w in self.running if not self.procs[w].is_alive()]:
                    self._worker_died(worker_id)
                for worker_id in self._overran():
                    self._stop_overrun(worker_id)
        finally:
            self._stop_workers()

    def _spawn(self, worker_id: int) -> None:
        self.inboxes[worker_id] = self.mp_context.Queue()
        # the wait policy too: a driver that loaded torch before the suite could set it (a script) has none
        with _environ({**wait_env(), **self.worker_envs[worker_id]}):
            proc = self.mp_context.Process(
                target=_pool_worker, name=f"suite-worker-{worker_id}", daemon=True,
                args=(worker_id, self.inboxes[worker_id], self.outbox, self.data_dir, self.device, self.threads,
                      self.modules, self.memory_fraction))
            with _usr1_blocked():
                proc.start()
        self.procs[worker_id] = proc

    def _startable(self) -> bool:
        """Whether a job is left that the gate lets start; those it holds back leave the queue for good (the grid's
        result names them)."""
        while self.todo and self.gate is not None and not self.gate.allows(self.todo[0][1], self.status):
            self.todo.popleft()
        return bool(self.todo)

    def _assign(self, worker_id: int) -> None:
        """Send the worker its next job that the gate lets start, or None (stop) when there is none left."""
        if not self._startable():
            self.inboxes[worker_id].put(None)
            return
        index, job = self.todo.popleft()
        self.attempts[index] += 1
        self.running[worker_id] = index
        self.started_at[worker_id] = time.monotonic()
        self.begun.discard(worker_id)
        self.inboxes[worker_id].put((index, self.attempts[index], job))
        self.status.started(job)

    def _handle(self, message) -> None:
        worker_id, index, rec, broken = message
        if self.running.get(worker_id) != index:
            return  # a record that arrived after its job was given up on
        if rec is None:  # the worker has begun the job: the run's clock starts now, not at the worker's start
            self.started_at[worker_id] = time.monotonic()
            self.begun.add(worker_id)
            return
        if isinstance(rec, Progress):  # the run's progress: its line and the grid's ETA
            self.status.progress(self.jobs[index], rec)
            return
        del self.running[worker_id]
        if index in self.eager_notes:
            noted_eager(rec, self.eager_notes[index])
        if broken:  # the worker exits: its CUDA context is unusable
            self._replace_broken_worker(worker_id, index, rec)
            return
        self._assign(worker_id)  # the worker starts its next job while the driver writes this record
        self.record(self.jobs[index], rec)

    def _replace_broken_worker(self, worker_id: int, index: int, rec: RunRecord) -> None:
        """The job whose CUDA error broke its worker runs again on a fresh worker while retries are left (the error
        may be the broken context's, not the job's); then its record, with the error, is kept. A failed capture's
        job runs again once, with capture off."""
        job, eager = self.jobs[index], rerun_eagerly(self.jobs[index], rec.error)
        if eager is not None:  # once, with capture off: the failure was the capture's, not the run's
            self.jobs[index], self.eager_notes[index] = without_capture(job), f"worker {worker_id}: {eager}"
            self.todo.appendleft((index, self.jobs[index]))
            self.status.retried(job, f"worker {worker_id}: {eager}")
        elif self.attempts[index] <= self.max_retries:
            self.todo.appendleft((index, job))
            self.status.retried(job, f"worker {worker_id} hit a CUDA error that breaks its process "
                                     f"({(rec.error or '')[:200]}); running the job again on a fresh worker")
        else:
            self.record(job, rec)
        self.procs[worker_id].join(timeout=30)
        if self._startable():
            self._spawn(worker_id)
            self._assign(worker_id)

    def _worker_died(self, worker_id: int) -> None:
        """Run the dead worker's job again on a fresh worker, or record it as failed once its retries are spent."""
        while True:  # a record it sent just before exiting still counts
            try:
                self._handle(self.outbox.get_nowait())
            except queue.Empty:
                break
        if worker_id not in self.running or self.procs[worker_id].is_alive():
            return  # its last record was its job's; or a fresh worker replaced it (a broken CUDA context)
        index = self.running.pop(worker_id)
        job, code = self.jobs[index], self.procs[worker_id].exitcode
        if self.attempts[index] <= self.max_retries:
            self.todo.appendleft((index, job))
            self.status.retried(job, f"worker {worker_id} died (exit code {code}); running the job again")
        else:
            self.record(job, RunRecord.failed(job, f"WorkerDied: the worker process exited with code {code} "
                                                   f"on each of {self.attempts[index]} attempts"))
        if self._startable():
            self._spawn(worker_id)
            self._assign(worker_id)

    def _overran(self) -> list[int]:
        """Workers whose current run has taken longer than the per-run limit."""
        if self.max_run_s is None:
            return []
        now = time.monotonic()
        return [w for w in self.running
                if now - self.started_at[w] > self.max_run_s + (0 if w in self.begun else START_ALLOWANCE_S)]

    def _stop_overrun(self, worker_id: int) -> None:
        """Kill a worker past the time limit (SIGKILL: a stopped process ignores everything else), record its run
        as failed with the reason (not retried: it would likely hang again), and go on with a fresh worker."""
        proc = self.procs[worker_id]
        proc.kill()
        proc.join(timeout=10)
        index = self.running.pop(worker_id)
        job, minutes = self.jobs[index], self.max_run_s / 60
        self.record(job, RunRecord.failed(job, f"TimeLimit: the run took longer than {minutes:g} minutes "
                                               f"(--max-run-minutes or ${MAX_RUN_MINUTES_ENV}); its worker "
                                               f"{worker_id} was stopped",
                                          wall_s=time.monotonic() - self.started_at[worker_id]))
        if self._startable():
            self._spawn(worker_id)
            self._assign(worker_id)

    def _stop_workers(self) -> None:
        """Ask every worker to stop, wait a bounded time, then SIGTERM and at last SIGKILL the ones still there: a
        worker stopped with SIGSTOP ignores SIGTERM until it is continued, and multiprocessing's exit would then
        wait for it forever (a driver SIGTERMed while its only worker was stopped never ended)."""
        for worker_id, proc in self.procs.items():
            if proc.is_alive():
                with contextlib.suppress(Exception):
                    self.inboxes[worker_id].put(None)
        for proc in self.procs.values():
            proc.join(timeout=10 if not self.running else 0.5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=STOP_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=STOP_GRACE_S)
