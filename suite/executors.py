"""Running a grid: which jobs are pending, who runs them, and the status table at the end.

Executors only decide *where* a job runs; the driver always writes the records, so resuming works the same
whichever executor ran (or will run) the rest of the grid.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from tabulate import tabulate

from .config import RunConfig
from .store import Store


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


def run_local(jobs: list[RunConfig], record: Callable[[RunConfig, dict], None], data_dir, device: str,
              quiet: bool) -> None:
    """Sequential, in this process (CPU, or the one visible GPU)."""
    from .runner import run_one

    for i, job in enumerate(jobs, 1):
        if not quiet:
            print(f"[{i}/{len(jobs)}] {job.label}", file=sys.stderr, flush=True)
        record(job, run_one(job, data_dir, device=device, quiet=quiet))


EXECUTORS: dict[str, Callable] = {"local": run_local}


def run_grid(jobs: list[RunConfig], store: Store, data_dir=None, executor: str = "local", force: bool = False,
             quiet: bool = False, device: str = "auto", **executor_options) -> GridResult:
    todo, skipped = pending_jobs(jobs, store, force)
    result = GridResult(skipped=skipped)
    finished: set[str] = set()

    def record(job: RunConfig, rec: dict) -> None:
        store.write(job.filename, rec)
        finished.add(job.hash)
        (result.done if rec["status"] == "ok" else result.failed).append((job, rec))
        if not quiet:
            line = (f"  done {job.label}: score {rec['final']['score']:.4f} in {rec['wall_s']:.0f}s"
                    if rec["status"] == "ok" else f"  FAILED {job.label}: {rec['error'][:300]}")
            print(line, file=sys.stderr, flush=True)

    if not quiet and skipped:
        print(f"{len(skipped)} of {len(jobs)} runs already have records in {store.runs}: skipped "
              "(--force reruns them)", file=sys.stderr)
    try:
        if todo:
            EXECUTORS[executor](todo, record, data_dir, device, quiet, **executor_options)
    finally:
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


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
