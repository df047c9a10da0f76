"""When a grid stops starting runs, while the runs under way finish and are recorded: at a deadline (`run --stop-by`),
which a run must be expected to finish by before it starts, or once SIGUSR1 asks it to drain (suite.run.stopping),
as a cluster's scheduler can before a job's time limit. What was not started is named, the command exits 75, and
the same command resumes it. The local executor asks the gate before each start; Ray hands every run to the cluster
at once, so it refuses a deadline."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta

from suite.grid.executors.status import GridStatus
from suite.run.progress import format_duration
from suite.run.settings import RunConfig
from suite.run.stopping import draining

__all__ = ["StartGate", "parse_stop_by"]  # what the rest of the suite uses; other names are this module's own

STOP_BY_FORMS = ("a duration from now (90m, 2h30m, 1.5h, 45s)", "a time of day (10:20, the next one to come)",
                 "a date and time (2026-12-07T10:20, local time unless it gives an offset)")
_DURATION = re.compile(r"^\+?(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?$")
_CLOCK = re.compile(r"^(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}))?$")


def parse_stop_by(text: str, now: datetime | None = None) -> datetime:
    """The deadline `--stop-by TEXT` names, as an aware local datetime; ValueError with the forms it takes."""
    now = (now or datetime.now()).astimezone()
    value = text.strip().lower()
    duration = _DURATION.match(value)
    if value and duration and any(duration.groupdict().values()):
        hours, minutes, seconds = (float(duration[k] or 0) for k in ("h", "m", "s"))
        if not hours + minutes + seconds > 0:
            raise ValueError(f"{text!r}: give a duration above 0")
        return now + timedelta(hours=hours, minutes=minutes, seconds=seconds)
    clock = _CLOCK.match(value)
    if clock:
        hour, minute, second = int(clock["h"]), int(clock["m"]), int(clock["s"] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise ValueError(f"{text!r} is no time of day")
        for day in (now.date(), now.date() + timedelta(days=1)):  # today's, else tomorrow's, at that day's offset
            at = datetime.combine(day, time(hour, minute, second)).astimezone()
            if at > now:
                return at
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r}: give {'; or '.join(STOP_BY_FORMS)}") from None
    at = at.astimezone() if at.tzinfo is None else at
    if at <= now:
        raise ValueError(f"{text!r} has passed (it is {now:%Y-%m-%d %H:%M:%S %Z} now)")
    return at


@dataclass
class StartGate:
    """Asked before each run starts; keeps the runs it held back, with the reason, for the grid's result."""

    deadline: datetime | None = None      # aware; None: only a drain (SIGUSR1) holds runs back
    drains: bool = True                   # false for an executor that cannot hold runs back (Ray)
    held: list[tuple[RunConfig, str]] = field(default_factory=list)
    seen: dict = field(default_factory=dict)  # step kind -> slowest seconds per step of the grids it served

    def learn(self, status: GridStatus) -> None:
        """Keep the slowest rates a grid's runs showed: a study's next stage or round prices its first runs by
        them (its own GridStatus starts with none)."""
        for kind, rate in status.slowest_rates().items():
            self.seen[kind] = max(rate, self.seen.get(kind, 0.0))

    def allows(self, job: RunConfig, status: GridStatus, now: datetime | None = None) -> bool:
        """Whether `job` may start now; if not, it is held (kept here and taken out of the status's counts)."""
        why = self._hold(job, status, now)
        if why is not None:
            self.held.append((job, why))
            status.held(job, why)
        return why is None

    def startable(self, jobs: list[RunConfig]) -> list[RunConfig]:
        """`jobs`, or none when the gate is closed: then each is held at once, before anything is planned for it."""
        if not jobs or self.closed() is None:
            return jobs
        status = GridStatus(len(jobs), quiet=True)  # no bar: a line says why, the status table lists them
        for job in jobs:
            self.allows(job, status)
        return []

    def closed(self, now: datetime | None = None) -> str | None:
        """Why no run at all may start now (a drain, or the deadline has come); None while some may."""
        if self.drains and draining():
            return "SIGUSR1 asked the grid to start no new run"
        if self.deadline is not None and self._left(now) <= 0:
            return f"{self._when} has come"
        return None

    @property
    def _when(self) -> str:
        return f"--stop-by {self.deadline:%Y-%m-%d %H:%M:%S %Z}"

    def _left(self, now: datetime | None) -> float:
        return (self.deadline - (now or datetime.now()).astimezone()).total_seconds()

    def _hold(self, job: RunConfig, status: GridStatus, now: datetime | None) -> str | None:
        closed = self.closed(now)
        if closed is not None or self.deadline is None:
            return closed
        left, when = self._left(now), self._when
        self.learn(status)
        need = status.run_seconds(job, self.seen)  # unknown until a run of the command has measured it: it starts
        if need is not None and need > left:
            return f"would not finish by {when} (about {format_duration(need)} needed, {format_duration(left)} left)"
        return None

    def line(self, now: datetime | None = None) -> str:
        """What the grid says at its start."""
        left = (self.deadline - (now or datetime.now()).astimezone()).total_seconds()
        return (f"--stop-by: no run starts that is expected to end after {self.deadline:%Y-%m-%d %H:%M:%S %Z} "
                f"(in {format_duration(left)}); runs under way finish, and the same command resumes the rest")
