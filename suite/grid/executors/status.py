"""The live status of a grid: done / running / pending / failed and an ETA, updated as results arrive."""
from __future__ import annotations

import math
import sys
import time

from suite.run.record import RunRecord
from suite.run.settings import RunConfig

__all__ = ["GridStatus"]  # what the rest of the suite uses; other names are this module's own


def format_duration(seconds: float) -> str:
    """3h04m, 5m07s or 9s; "?" when unknown (infinite)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


def retry_note(rec: RunRecord) -> str:
    """' (attempt 2; ...)' when the run was tried more than once (a dead worker, an out-of-memory error), else ''."""
    facts = rec.executor or {}
    notes = []
    if (facts.get("attempts") or 1) > 1:
        notes.append(f"attempt {facts['attempts']}")
    if facts.get("oom_retries"):
        notes.append("run again after an out-of-memory error")
    return f" ({'; '.join(notes)})" if notes else ""


class GridStatus:
    """Counts of the runs of this invocation; a tqdm line on a terminal (unless quiet), one log line per finished run
    otherwise (a log file, --quiet).

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
        self.retries += 1
        self._say(f"  RETRY {job.label}: {why}")
        self._refresh()

    def add_retries(self, n: int) -> None:
        """Retries an executor learns of only when the run comes back (Ray retries a task by itself)."""
        self.retries += n
        self._refresh()

    def finished_run(self, job: RunConfig, rec: RunRecord) -> None:
        self.running = max(0, self.running - 1)
        if rec.ok:
            self.done += 1
            text = f"  done {job.label}: score {rec.final['score']:.4f} in {rec.wall_s:.0f}s"
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
