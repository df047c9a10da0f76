"""Whether a study's declared pre-registration (`report: preregistered:`, a file or a commit) was fixed before its
runs, as git shows it: the last commit that changed the file (or the commit named) must be older than the first
record's start, and the file must have no uncommitted edits. The analysis the report applies must be the registered
one too: the study file's design and analysis as committed before the first run, the report's options and folders
the study's (a check the command layer gives, suite.grid.registration and suite.commands.report). The report labels
verdicts pre-registered only then.
Commit dates are what git records (a committer can set them); the records' code version cannot order it instead, since
a record names the newest commit that changed run code, which a later pre-registration commit does not descend from."""
from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from suite.report.load import Col
from suite.run.device import git_output

__all__ = ["Preregistration", "check_preregistration"]


@dataclasses.dataclass(frozen=True)
class Preregistration:
    """What git says about a declared pre-registration against the records reported."""
    declared: str                 # the study's `report: preregistered:` (a path or a commit)
    commit: str | None            # the file's last commit, or the commit named
    committed_at: str | None      # that commit's committer date (ISO 8601)
    first_started: str | None     # the earliest start among the records (ISO 8601)
    problems: tuple[str, ...]     # why it is not verified; empty when it is

    @property
    def verified(self) -> bool:
        return not self.problems

    def text(self) -> str:
        """One sentence for the report: verified, with the commit and times, or what failed."""
        if self.verified:
            return (f"Pre-registered, checked against git: `{self.declared}` was fixed in commit `{self.commit[:12]}` "
                    f"({self.committed_at}), before the first of these runs started ({self.first_started}), and has "
                    "no uncommitted edits; verdicts from statistics revised since are not pre-registered.")
        return (f"Declared pre-registered in `{self.declared}`, but **not verified**: {'; '.join(self.problems)}. "
                "Read these verdicts as a re-analysis.")


def _time(text) -> datetime | None:
    """An aware datetime from a record's `started` (2026-12-07T01:10:43+0000) or git's %cI; None if unreadable."""
    if not isinstance(text, str):
        return None
    for parse in (datetime.fromisoformat, lambda t: datetime.strptime(t, "%Y-%m-%dT%H:%M:%S%z")):  # 3.10: no +0000
        try:
            parsed = parse(text.strip())
        except ValueError:
            continue
        return parsed if parsed.tzinfo is not None else None
    return None


def _first_started(records: pd.DataFrame) -> tuple[datetime | None, int]:
    """The earliest readable start among the records, and how many records have none."""
    starts = [_time(s) for s in (records[Col.STARTED] if Col.STARTED in records else [None] * len(records))]
    known = [s for s in starts if s is not None]
    return (min(known) if known else None), len(starts) - len(known)


def _fixed_at(declared: str, root: Path) -> tuple[str | None, str | None, list[str]]:
    """The commit that fixed the declaration (the file's last commit, or the commit named), its date, and problems."""
    top = git_output(root, "rev-parse", "--show-toplevel")  # a path from the repository's top, run from anywhere in it
    candidates = [Path(declared)] if Path(declared).is_absolute() else [root / declared, *([Path(top) / declared]
                                                                                          if top else [])]
    path = next((p for p in candidates if p.is_file()), None)
    if path is not None:
        target = path.resolve()  # a link: the file it points to holds the analysis
        where, name = target.parent, target.name
        found = git_output(where, "log", "-1", "--format=%H %cI", "--", name)
        if not found:
            return None, None, [f"`{declared}` ({target}) has no commit in a git repository"]
        commit, date = found.split()
        edits = git_output(where, "status", "--porcelain", "--", name)
        problems = [f"`{declared}` has uncommitted edits"] if edits else []
        return commit, date, problems
    commit = git_output(root, "rev-parse", "--verify", "--quiet", f"{declared}^{{commit}}")
    if not commit:
        return None, None, [f"`{declared}` is neither a file nor a commit of the repository at {root}"]
    return commit, git_output(root, "show", "-s", "--format=%cI", commit), []


def check_preregistration(declared: str, records: pd.DataFrame, root: Path | None = None,
                          registration: Callable[[datetime], Sequence[str]] | None = None) -> Preregistration:
    """Check `declared` (a path, relative to `root`, default the working directory, or a commit) against the records:
    verified when its fixing commit is older than the earliest record's start, a file has no uncommitted edits, and
    `registration(first start)` finds the analysis applied to be the registered one (the command layer's check of
    the study file, its options and folders: suite.commands.report); without it, that cannot be shown."""
    commit, date, problems = _fixed_at(declared, Path.cwd() if root is None else root)
    first, unknown = _first_started(records)
    if registration is None:
        problems.append("the report read no study file (--study), so the analysis applied cannot be compared with "
                        "the registered one")
    elif first is not None:
        problems += registration(first)
    if first is None:
        problems.append("no record says when it started, so the order cannot be shown")
    elif unknown:
        problems.append(f"{unknown} record(s) do not say when they started")
    fixed = _time(date) if date else None
    if commit is not None and fixed is None:
        problems.append(f"git gave no readable date for commit `{commit[:12]}`")
    if first is not None and fixed is not None and fixed >= first:
        problems.append(f"it was last changed in commit `{commit[:12]}` ({date}), not before the first run started "
                        f"({first.isoformat()})")
    return Preregistration(declared, commit, date, first.isoformat() if first else None, tuple(problems))
