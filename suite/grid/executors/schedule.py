"""Running a grid: which jobs are pending, which executor runs them, and the status table at the end.

Executors only decide *where* a job runs; the driver (this process) always writes the records, so resuming works the
same whichever executor ran (or will run) the rest of the grid.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from suite.api.errors import ExecutorError
from suite.api.registry import Registry
from suite.grid.executors.gate import StartGate
from suite.grid.executors.local import run_local
from suite.grid.executors.options import EXECUTOR_OPTIONS, options_of
from suite.grid.executors.ray import import_ray, run_ray
from suite.grid.executors.status import GridStatus, step_kind
from suite.grid.executors.workers import capture_self_test, noted_eager, without_capture
from suite.grid.store import Store, run_paces
from suite.run.progress import capped_steps, planned_steps
from suite.run.record import RunRecord
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["GridResult", "HeldBack", "check_executor", "pending_jobs", "run_grid", "status_table"]


@dataclass(frozen=True)
class Executor:
    run: Any                   # run(jobs, record, data_dir, device, quiet, status=..., **options)
    options: frozenset[str]    # the options it takes (others are refused before anything runs)


EXECUTORS: Registry[Executor] = Registry("executor", "suite.grid.executors.schedule")  # local and ray
# each takes its declared options (suite.grid.executors.options) and the ones the suite passes itself
EXECUTORS.add("local", Executor(run_local, options_of("local") | {"max_retries", "plan", "gate"}))
EXECUTORS.add("ray", Executor(run_ray, options_of("ray") | {"max_retries", "ship"}))


@dataclass
class GridResult:
    done: list[tuple[RunConfig, RunRecord]] = field(default_factory=list)
    skipped: list[RunConfig] = field(default_factory=list)
    failed: list[tuple[RunConfig, RunRecord]] = field(default_factory=list)
    not_run: list[RunConfig] = field(default_factory=list)
    elsewhere: list[RunConfig] = field(default_factory=list)  # claimed by another live grid into the same folder
    held: list[tuple[RunConfig, str]] = field(default_factory=list)  # not started, and why (suite...gate)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.not_run and not self.held


class HeldBack(Exception):
    """A grid's start gate held runs back (`run --stop-by`, SIGUSR1): the command stops after the runs under way,
    taking no look and starting no later stage, and the same command resumes it."""

    def __init__(self, result: GridResult):
        super().__init__(f"{len(result.held)} run(s) not started")
        self.result = result


def pending_jobs(jobs: list[RunConfig], store: Store, force: bool) -> tuple[list[RunConfig], list[RunConfig]]:
    """(to run, skipped). A job is skipped when an `ok` record of it exists; failed ones are run again. A record file
    that this process cannot read but must not replace (another user's, a newer suite's) skips its job even with
    `force`, with a warning that says why."""
    todo, skipped = [], []
    for job in jobs:
        skip = store.skip_reason(job.filename, force)
        if skip is not None and skip.kept:
            warnings.warn(f"{job.label}: {skip.why}", stacklevel=2)
        (todo if skip is None else skipped).append(job)
    return todo, skipped


EARLIER_RECORDS = 200   # records read per folder for the ETA's step costs, spread over it (750 took 1.8 s)


def earlier_step_seconds(store: Store) -> dict:
    """{step kind (`status.step_kind`): seconds per optimizer step of its fastest whole run} of the ok records in
    the output folder and its tuning folder (a study's final stage learns from its tuning runs), of one device kind
    (the one with the most records): the ETA's weights. The fastest, since only the kinds' ratios count and a run
    slowed by other work would skew them; at most EARLIER_RECORDS a folder (`run_paces`)."""
    rates: dict[str, dict] = {}
    for pace in run_paces(store.root, most=EARLIER_RECORDS):
        rates.setdefault(pace.device, {}).setdefault(step_kind(pace.job), []).append(pace.step_s)
    most = max(rates.values(), key=lambda kinds: sum(map(len, kinds.values())), default={})
    return {kind: min(v) for kind, v in most.items()}


def check_executor(executor: str, options: dict[str, Any]) -> None:
    """Fail before anything runs: unknown executor, options that belong to another one, Ray missing."""
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}. Valid executors: {', '.join(EXECUTORS.names())}")
    wrong = sorted(k for k, v in options.items() if v is not None and k not in EXECUTORS.get(executor).options)
    if wrong:
        flags = ", ".join("--" + k.replace("_", "-") for k in wrong)
        owners = {k: [e for e in EXECUTORS.names() if k in EXECUTORS.get(e).options] for k in wrong}
        hint = "; ".join(f"--{k.replace('_', '-')} is for --executor {'/'.join(v)}" for k, v in owners.items() if v)
        raise ExecutorError(f"{flags} does not apply to --executor {executor}" + (f" ({hint})" if hint else ""))
    for key in (name for name, option in EXECUTOR_OPTIONS.items() if option.positive):
        v = options.get(key)
        if v is not None and v != "auto" and not v > 0:  # auto: --workers as the machine allows
            raise ExecutorError(f"--{key.replace('_', '-')} {v}: give a value > 0")
    if executor == "ray":
        import_ray()


def run_grid(jobs: list[RunConfig], store: Store, data_dir=None, executor: str = "local", force: bool = False,
             quiet: bool = False, device: str = "auto", gate: StartGate | None = None,
             **executor_options) -> GridResult:
    """Run the jobs that have no `ok` record yet (all of them with `force`) and write each record as it arrives.
    `gate` (local executor): asked before each start; when it held any run back, HeldBack carries the result (its
    `held`) once the runs under way are recorded, so that no caller takes a look or starts a stage on a cut grid."""
    options = {k: v for k, v in executor_options.items() if v is not None}
    check_executor(executor, options)
    gate = _gate_for(executor, gate, options)
    todo, skipped = pending_jobs(jobs, store, force)
    claims = store.claims()  # one lock per job: another grid into this folder skips what this one runs
    todo, elsewhere = claims.claim(todo)
    if not force:  # a job may have been finished by another grid between the look above and the claim
        todo, finished_meanwhile = pending_jobs(todo, store, force)
        skipped += finished_meanwhile
    result = GridResult(skipped=skipped, elsewhere=elsewhere)
    finished: set[str] = set()
    held_before = len(gate.held)   # one gate may serve a study's every stage
    todo = gate.startable(todo)   # nothing may start (a drain, the deadline come): no self-test, no planning
    try:
        capture_off = capture_self_test(todo, device, executor, options.get("address")) if todo else None
    except BaseException:
        claims.close()
        raise
    eager = {j.hash for j in todo if capture_off and j.train.capture == "auto"}
    if capture_off:
        print(f"note: {capture_off}", file=sys.stderr)
        todo = [without_capture(j) if j.hash in eager else j for j in todo]
    planned = planned_steps(todo, data_dir)  # unread data (the hub): the budget's cap until the run starts
    status = GridStatus(len(todo), quiet=quiet,
                        planned={j.hash: planned[j.hash] if planned[j.hash] is not None else capped_steps(j)
                                 for j in todo},
                        kinds={j.hash: step_kind(j) for j in todo}, step_cost=earlier_step_seconds(store))

    def record(job: RunConfig, rec: RunRecord) -> None:
        if job.hash in eager:
            noted_eager(rec, capture_off)
        store.write(job.filename, rec)
        finished.add(job.hash)
        (result.done if rec.ok else result.failed).append((job, rec))
        status.finished_run(job, rec)

    if not quiet and skipped:
        print(f"{len(skipped)} of {len(jobs)} runs already have records in {store.runs}: skipped "
              "(--force reruns them)", file=sys.stderr)
    if elsewhere:
        print(f"{len(elsewhere)} run(s) are being run by another grid writing into {store.runs}: skipped here "
              "(give the same command again after that grid ends to pick up what it leaves)", file=sys.stderr)
    try:
        if todo:
            EXECUTORS.get(executor).run(todo, record, data_dir, device, quiet, status=status, **options)
    finally:
        claims.close()
        status.close()
        gate.learn(status)
        result.held = gate.held[held_before:]
        held = {j.hash for j, _ in result.held}
        result.not_run = [j for j in todo if j.hash not in finished and j.hash not in held]
    if result.held:
        raise HeldBack(result)
    return result


def _gate_for(executor: str, gate: StartGate | None, options: dict[str, Any]) -> StartGate:
    """The gate the grid asks before each start (a drain only, when none is given); the local executor takes it
    as an option, another refuses a deadline and never drains (it hands every run to the cluster at once)."""
    if executor != "local":
        if gate is not None and gate.deadline is not None:
            raise ExecutorError(f"--stop-by holds runs back before they start, which --executor {executor} cannot: "
                                "it hands every run to the cluster at once; use --executor local, or leave --stop-by "
                                "out")
        return StartGate(drains=False)
    options["gate"] = gate if gate is not None else StartGate()
    return options["gate"]


def status_table(result: GridResult) -> str:
    """The end-of-grid table: one row per run (done, skipped, failed, not run) and the counts."""
    rows = []
    for job, rec in result.done:
        rows.append([job.label, "done", f"{rec.final.score:.4f}", f"{rec.wall_s:.0f}s", ""])
    for job in result.skipped:
        rows.append([job.label, "skipped", "", "", "record exists"])
    for job, rec in result.failed:
        rows.append([job.label, "failed", "", f"{rec.wall_s or 0:.0f}s", (rec.error or "")[-160:]])
    for job in result.not_run:
        rows.append([job.label, "not run", "", "", "interrupted"])
    for job in result.elsewhere:
        rows.append([job.label, "elsewhere", "", "", "being run by another grid"])
    for job, why in result.held:
        rows.append([job.label, "not started", "", "", why[:160]])
    counts = (f"{len(result.done)} done, {len(result.skipped)} skipped, {len(result.failed)} failed"
              + (f", {len(result.not_run)} not run" if result.not_run else "")
              + (f", {len(result.elsewhere)} run by another grid" if result.elsewhere else "")
              + (f", {len(result.held)} not started" if result.held else ""))
    return tabulate(rows, headers=["run", "status", "dev score", "time", "note"], tablefmt="github") + "\n" + counts
