"""Whether a study's declared pre-registration (`report: preregistered:`, a file or a commit) was fixed before its
runs, as git shows it: the last commit that changed the file (or the commit named) must be older than the first
record's start, and the file must have no uncommitted edits. The analysis the report applies must be the registered
one too: the study file's verdict settings (`REGISTERED_KEYS` of its report: section, and its until_decided:) as
committed before the first run, none replaced by a flag of `report`. The report labels verdicts pre-registered only
then.
Commit dates are what git records (a committer can set them); the records' code version cannot order it instead, since
a record names the newest commit that changed run code, which a later pre-registration commit does not descend from."""
from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import yaml

from suite.report.load import Col
from suite.run.device import git_output

__all__ = ["Preregistration", "REGISTERED_KEYS", "check_preregistration"]

# the report: options that decide verdicts (collapse_floor only sets a descriptive rate; out, figures and the like
# change no verdict); a study file's until_decided: counts too
REGISTERED_KEYS = ("baseline", "alpha", "correction", "primary", "margin", "reference_tasks", "preregistered")


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
                "Read these verdicts as a re-analysis until the order is shown.")


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
                          study_file: str | None = None, replaced: Sequence[str] = ()) -> Preregistration:
    """Check `declared` (a path, relative to `root`, default the working directory, or a commit) against the records:
    verified when its fixing commit is older than the earliest record's start and a file has no uncommitted edits;
    and the analysis applied is the registered one: `study_file` (the report's --study) has the verdict settings it
    had in its last commit before the first run, and no flag of the report `replaced` one of them."""
    root = Path.cwd() if root is None else root
    commit, date, problems = _fixed_at(declared, root)
    if replaced:
        problems.append(f"the report's flags replace the study's {', '.join(replaced)}, so these are not the "
                        "registered analysis's verdicts")
    first, unknown = _first_started(records)
    if study_file is not None and first is not None:
        problems += _study_changed(study_file, first, root)
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


def _registered_settings(study: dict[str, Any]) -> dict[str, Any]:
    """A study file's settings that decide verdicts (its parsed YAML): REGISTERED_KEYS of report:, until_decided:."""
    report = study.get("report") or {}
    return {**{f"report: {key}": report.get(key) for key in REGISTERED_KEYS},
            "until_decided": study.get("until_decided")}


def _study_changed(study_file: str, first: datetime, root: Path) -> list[str]:
    """Why the study file's verdict settings are not those of its last commit before the first run ([] if they are)."""
    path = Path(study_file) if Path(study_file).is_absolute() else root / study_file
    where, name = path.resolve().parent, path.resolve().name
    commit = git_output(where, "log", "-1", f"--before={first.isoformat()}", "--format=%H", "--", name)
    if not commit:
        return [f"the study file `{study_file}` has no commit before the first run started, so its analysis was not "
                "fixed before it"]
    try:
        then = _registered_settings(yaml.safe_load(git_output(where, "show", f"{commit}:./{name}") or "") or {})
        now = _registered_settings(yaml.safe_load(path.read_text()) or {})
    except (OSError, yaml.YAMLError) as exc:
        return [f"the study file `{study_file}` could not be compared with its commit `{commit[:12]}` ({exc})"]
    changed = [key for key in now if now[key] != then[key]]
    if not changed:
        return []
    return [f"the study file `{study_file}` changed its {', '.join(changed)} since commit `{commit[:12]}`, its last "
            f"before the first run (then: {'; '.join(f'{k} {then[k]!r}' for k in changed)})"]
