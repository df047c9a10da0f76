"""Running a grid of jobs: which are pending, who runs them, a live status line, and the status table at the end.

- `grid`: pending jobs, `run_grid`, `check_executor`, `GridResult`, `status_table`.
- `status`: `GridStatus`, the live done / running / pending / failed line with an ETA.
- `gate`: `StartGate`, whether a run may still start (`run --stop-by`, a drain asked by SIGUSR1).
- `local`: in this process, or a pool of spawned workers (`pool`), one per GPU, each with its own
  `CUDA_VISIBLE_DEVICES`; `LocalPlan` says which.
- `ray`: one Ray task per job, on a private local cluster or an existing one; data shipped through the object store.
- `workers`: what every executor's workers share (the modules that registered the grid's methods, retries).

Executors only decide *where* a job runs; the driver always writes the records, so a grid interrupted under one
executor finishes under another.
"""
from suite.api.errors import ExecutorError
from suite.grid.executors.gate import StartGate
from suite.grid.executors.local import LocalPlan, local_plan, visible_gpus
from suite.grid.executors.schedule import (
    GridResult,
    HeldBack,
    check_executor,
    pending_jobs,
    run_grid,
    status_table,
)
from suite.grid.executors.status import GridStatus

__all__ = ["ExecutorError", "GridResult", "GridStatus", "HeldBack", "LocalPlan", "StartGate", "check_executor",
           "local_plan", "pending_jobs", "run_grid", "status_table", "visible_gpus"]
