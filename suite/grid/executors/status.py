"""The live status of a grid: done / running / pending / failed and an ETA, updated as the runs report their steps
and as results arrive; and the runs' own progress lines (suite.run.progress)."""
from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Mapping

from suite.run.progress import Progress, ProgressLines, format_duration
from suite.run.record import RunRecord
from suite.run.settings import RunConfig

__all__ = ["GridStatus"]  # what the rest of the suite uses; other names are this module's own


def retry_note(rec: RunRecord) -> str:
    """' (attempt 2; ...)' when the run was tried more than once (a dead worker, an out-of-memory error), else ''."""
    notes = []
    if rec.attempts > 1:
        notes.append(f"attempt {rec.attempts}")
    if rec.oom_retried:
        notes.append("run again after an out-of-memory error")
    return f" ({'; '.join(notes)})" if notes else ""


def scores(rec: RunRecord) -> str:
    """A finished run's scores, each named by its split: the tuning split's first where it has one (what a tuning
    stage chooses by), then the split its verdicts read (dev, or the held-out test split)."""
    scored = f"{rec.scored.name} {rec.scored.metrics.score:.4f}"
    return f"tuning split {rec.tune.score:.4f} ({scored})" if rec.tune is not None else scored


class GridStatus:
    """Counts of the runs of this invocation; a tqdm line on a terminal (unless quiet), one log line per finished run
    otherwise (a log file, --quiet); unless quiet, each run's start and epochs, and in a log file a line at least
    every minute of a long epoch.

    ETA = the optimizer steps the unfinished jobs have left / the steps per second the grid has made so far (all its
    runs' steps over the time since it started, loading and evaluation included), so it accounts for however many
    runs go in parallel and for jobs of different sizes. `planned`: each job's planned steps by hash
    (`suite.run.progress.planned_steps`; None where unknown: the run reports them when it starts, and until then the
    mean of the known ones stands in). Where no run reports steps at all, finished runs per second stand in.
    """

    def __init__(self, total: int, quiet: bool = False, stream=None,
                 planned: Mapping[str, int | None] | None = None):
        self.total, self.quiet = total, quiet
        self.stream = stream or sys.stderr
        self.done = self.failed = self.running = 0
        self.retries = 0
        self.start = time.perf_counter()
        self.first_event: float | None = None  # when the first run reported (loading data, or its first step)
        self.planned: dict[str, int | None] = dict(planned or {})
        self.stepped: dict[str, int] = {}   # job hash -> optimizer steps it has made
        self.ended: set[str] = set()        # job hashes with a record
        self._bar = None
        terminal = getattr(self.stream, "isatty", lambda: False)()
        self._lines = ProgressLines(steps=not terminal)  # on a terminal the bars show the steps
        if not quiet and total and terminal:
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
        made, elapsed = sum(self.stepped.values()), time.perf_counter() - (self.first_event or self.start)
        if not made:  # no run reports steps (or none has made one yet)
            return elapsed / self.finished * (self.total - self.finished) if self.finished else math.inf
        known = [n for n in self.planned.values() if n is not None]
        typical = statistics.fmean(known) if known else math.nan
        left = sum(max((typical if n is None else n) - self.stepped.get(h, 0), 0)
                   for h, n in self.planned.items() if h not in self.ended)
        unlisted = self.total - self.finished - sum(h not in self.ended for h in self.planned)
        left += max(unlisted, 0) * typical  # jobs nobody told this status about
        return left / (made / elapsed) if math.isfinite(left) else math.inf

    def progress(self, job: RunConfig, event: Progress) -> None:
        """A running job's progress: its steps count towards the ETA, and its line (if any) is printed."""
        if event.kind == "start":  # the exact plan (a second attempt starts again from 0)
            self.planned[job.hash] = event.steps
        if self.first_event is None:  # the step rate's clock starts with the first run, not the driver's setup
            self.first_event = time.perf_counter()
        self.stepped[job.hash] = event.step
        if self.quiet:
            return
        line = self._lines.line(job.label, event)
        if line is not None:
            self._say(line if event.kind == "start" else f"{line} | grid ETA {format_duration(self.eta())}")

    def line(self) -> str:
        retried = f", {self.retries} retried" if self.retries else ""
        eta = format_duration(self.eta()) if self.finished < self.total else "0s"
        return (f"{self.done} done, {self.running} running, {self.pending} pending, {self.failed} failed{retried}"
                f" | ETA {eta}")

    def set_running(self, n: int) -> None:
        self.running = n
        self._refresh()

    def started(self, job: RunConfig) -> None:
        self.running += 1
        self._refresh()

    def retried(self, job: RunConfig, why: str) -> None:
        self.running -= 1
        self.stepped.pop(job.hash, None)
        self.retries += 1
        self._say(f"  RETRY {job.label}: {why}")
        self._refresh()

    def add_retries(self, n: int) -> None:
        """Retries an executor learns of only when the run comes back (Ray retries a task by itself)."""
        self.retries += n
        self._refresh()

    def finished_run(self, job: RunConfig, rec: RunRecord) -> None:
        self.running = max(0, self.running - 1)
        self.ended.add(job.hash)
        steps = rec.timing.steps  # a run that reported nothing (Ray) still counts its steps here
        if isinstance(steps, int) and steps > self.stepped.get(job.hash, 0):
            self.stepped[job.hash] = steps
        if isinstance(steps, int) and self.planned.get(job.hash) is None:
            self.planned[job.hash] = steps  # a size the unknown ones may take after
        if rec.ok:
            self.done += 1
            text = f"  done {job.label}: {scores(rec)} in {rec.wall_s:.0f}s"
        else:
            self.failed += 1
            text = f"  FAILED {job.label}: {(rec.error or '')[:300]}"
        text += retry_note(rec)
        if self._bar is not None:
            self._bar.update(1)
            self._say(text)
            self._refresh()
        else:
            self._say(f"{text}  [{self.finished}/{self.total}: {self.line()}]")

    def _say(self, text: str) -> None:  # --quiet drops the bar only: these lines and their ETA are the log
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
