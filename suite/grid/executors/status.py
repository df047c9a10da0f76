"""The live status of a grid: done / running / pending / failed and an ETA, updated as the runs report their steps
and as results arrive; and the runs' own progress lines (suite.run.progress)."""
from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Hashable, Mapping

from suite.run.progress import Progress, ProgressLines, cost_settings, format_duration
from suite.run.record import RunRecord
from suite.run.settings import RunConfig

__all__ = ["GridStatus", "step_kind"]  # what the rest of the suite uses; other names are this module's own


def retry_note(rec: RunRecord) -> str:
    """' (attempt 2; ...)' when the run was tried more than once (a dead worker, an out-of-memory error), else ''."""
    notes = []
    if rec.attempts > 1:
        notes.append(f"attempt {rec.attempts}")
    if rec.oom_retried:
        notes.append("run again after an out-of-memory error")
    return f" ({'; '.join(notes)})" if notes else ""


def step_kind(job: RunConfig) -> Hashable:
    """What the seconds of a job's optimizer step turn on besides the machine: its model, its task (sentence lengths)
    and its batch, length, precision and accumulation settings."""
    return job.model, job.task, cost_settings(job.train)


def scores(rec: RunRecord) -> str:
    """A finished run's scores, each named by its split: the tuning split's first where it has one (what a tuning
    stage chooses by), then the split its verdicts read (dev, or the held-out test split)."""
    scored = f"{rec.scored.name} {rec.scored.metrics.score:.4f}"
    return f"tuning split {rec.tune_score:.4f} ({scored})" if math.isfinite(rec.tune_score) else scored


class GridStatus:
    """Counts of the runs of this invocation; a tqdm line on a terminal (unless quiet), one log line per finished run
    otherwise (a log file, --quiet); unless quiet, each run's start and epochs, and in a log file a line at least
    every minute of a long epoch.

    ETA = the work the unfinished jobs have left / the work per second the grid has done so far (over the time since
    its first run began, loading and evaluation included), so it accounts for however many runs go in parallel and
    for jobs of different sizes. Work is optimizer steps, each weighted by what a step of its kind costs (`kinds`: a
    job's task and the settings a step's time turns on, `suite.run.progress.cost_settings`): a CoLA step (short
    sentences) costs a fraction of an MRPC step (pairs), so counting bare steps put a study's ETA at twice its time.
    A kind's weight is its seconds per step as this grid's runs of it measure it (over whole epochs), else as earlier
    records measured it (`step_cost`: the output folder's, a study's tuning runs) scaled to this grid's pace, else the
    mean of the known ones; with none known every step weighs the same (`weights`). `planned`: each job's planned
    steps by hash (`suite.run.progress.planned_steps`; None where unknown: the run reports them when it starts, and
    until then the mean of the known ones stands in). Where no run reports steps at all, finished runs per second
    stand in.
    """

    def __init__(self, total: int, quiet: bool = False, stream=None,
                 planned: Mapping[str, int | None] | None = None, kinds: Mapping[str, Hashable] | None = None,
                 step_cost: Mapping[Hashable, float] | None = None):
        self.total, self.quiet = total, quiet
        self.stream = stream or sys.stderr
        self.done = self.failed = self.running = 0
        self.retries = 0
        self.not_started = 0   # runs a start gate held back (suite.grid.executors.gate)
        self.start = time.perf_counter()
        self.first_event: float | None = None  # when the first run reported (loading data, or its first step)
        self.planned: dict[str, int | None] = dict(planned or {})
        self.stepped: dict[str, int] = {}   # job hash -> optimizer steps it has made
        self.kinds: dict[str, Hashable] = dict(kinds or {})   # job hash -> what its step costs turn on
        self.step_cost = {k: c for k, c in (step_cost or {}).items() if c > 0 and math.isfinite(c)}
        self.step_s: dict[str, float] = {}  # job hash -> its seconds per step so far (evaluations included)
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

    def weights(self) -> dict[Hashable, float]:
        """Seconds per step of this grid's kinds, in one unit: this grid's own measures where it has any (a job's rate
        once it has finished an epoch, or its record's); for a kind only earlier records know, their figure scaled to
        this grid's pace on the kinds both know. Earlier records of kinds this grid does not run are left out, and so
        are all of them when they share no measured kind with it (another machine's seconds are no unit here)."""
        ours = set(self.kinds.values())
        runs: dict[Hashable, list[float]] = {}
        for h, rate in self.step_s.items():
            runs.setdefault(self.kinds.get(h), []).append(rate)
        live = {k: statistics.median(v) for k, v in runs.items()}
        earlier = {k: c for k, c in self.step_cost.items() if k in ours}
        both = [live[k] / earlier[k] for k in live if k in earlier]
        if live and not both:
            return live
        scale = statistics.median(both) if both else 1.0
        return {**{k: c * scale for k, c in earlier.items()}, **live}

    def eta(self) -> float:
        elapsed = time.perf_counter() - (self.first_event or self.start)
        weights = self.weights()
        usual = statistics.fmean(weights.values()) if weights else 1.0   # a kind not measured yet

        def weight(h: str) -> float:
            return weights.get(self.kinds.get(h), usual)

        known = [n for n in self.planned.values() if n is not None]
        typical = statistics.fmean(known) if known else math.nan
        left = sum(max((typical if n is None else n) - self.stepped.get(h, 0), 0) * weight(h)
                   for h, n in self.planned.items() if h not in self.ended)
        unlisted = self.total - self.finished - sum(h not in self.ended for h in self.planned)
        left += max(unlisted, 0) * typical * usual  # jobs nobody told this status about
        done = sum(n * weight(h) for h, n in self.stepped.items())
        if not (done > 0 and elapsed > 0):  # no run reports steps (or none has made one yet)
            return elapsed / self.finished * (self.total - self.finished) if self.finished else math.inf
        return left / (done / elapsed) if math.isfinite(left) else math.inf

    def slowest_rates(self) -> dict[Hashable, float]:
        """{step kind: the slowest seconds per step this grid's runs of it have shown} (since their training began,
        evaluation included; a finished run's whole wall time)."""
        slowest: dict[Hashable, float] = {}
        for h, rate in self.step_s.items():
            k = self.kinds.get(h)
            slowest[k] = max(rate, slowest.get(k, 0.0))
        return slowest

    def run_seconds(self, job: RunConfig, seen: Mapping[Hashable, float] | None = None) -> float | None:
        """What a job not started yet should take, for a start gate (suite.grid.executors.gate): its planned steps
        at the slowest rate of its kind that this grid's runs, or the runs the gate saw in the command's earlier
        grids (`seen`), have shown; else at its kind's earlier records (`step_cost`) times the largest ratio of
        those rates to the earlier records over the kinds both know. None without either: earlier records alone
        may be another machine's, whose seconds are no unit here."""
        kind, steps = self.kinds.get(job.hash, step_kind(job)), self.planned.get(job.hash)
        slowest = dict(seen or {})
        for k, rate in self.slowest_rates().items():
            slowest[k] = max(rate, slowest.get(k, 0.0))
        ratios = [slowest[k] / self.step_cost[k] for k in slowest if k in self.step_cost]
        rate = slowest.get(kind) or (self.step_cost[kind] * max(ratios) if kind in self.step_cost and ratios else None)
        return None if steps is None or rate is None else steps * rate

    def held(self, job: RunConfig, why: str) -> None:
        """A job the grid will not start (suite.grid.executors.gate): out of the counts and the ETA."""
        self.total -= 1
        self.planned.pop(job.hash, None)
        if self._bar is not None:
            self._bar.total = self.total
        if not self.not_started:  # the first says why; the status table at the end lists them all
            self._say(f"  not started {job.label}: {why} (the table at the end lists every run not started)")
        self.not_started += 1
        self._refresh()

    def progress(self, job: RunConfig, event: Progress) -> None:
        """A running job's progress: its steps count towards the ETA, and its line (if any) is printed."""
        if event.kind == "start":  # the exact plan (a second attempt starts again from 0)
            self.planned[job.hash] = event.steps
        if self.first_event is None:  # the step rate's clock starts with the first run, not the driver's setup
            self.first_event = time.perf_counter()
        self.stepped[job.hash] = event.step
        self.kinds.setdefault(job.hash, step_kind(job))
        if event.kind == "epoch":   # a whole epoch, its evaluation included (a first step's rate is warm-up's)
            self._rate(job.hash, event.elapsed_s, event.step)
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
        self.step_s.pop(job.hash, None)
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
        self.kinds.setdefault(job.hash, step_kind(job))
        if rec.ok and isinstance(steps, int):
            self._rate(job.hash, rec.wall_s, steps)   # the whole run's (Ray reports no epochs)
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

    def _rate(self, job_hash: str, seconds, steps: int) -> None:
        rate = seconds / steps if steps and seconds else math.nan
        if rate > 0 and math.isfinite(rate):
            self.step_s[job_hash] = rate

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
