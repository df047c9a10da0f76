"""A study file as it was registered: its last commit before the study's first run, against the file now. For a
pre-registered study (`report: preregistered:`) the report's verdicts are the registered analysis only where the
design and the analysis that decide them are those of that commit: every key but the few that decide no verdict
(`FREE_KEYS`), with no value taken from the environment (`${oc.env:...}`), which no commit can fix. The command
layer compares the report's options and folders with the registered ones (suite.commands.report)."""
from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from suite.grid.study import Study, bounded_study_text, load_study
from suite.run.device import git_output

__all__ = ["registered_study"]  # what the rest of the suite uses

# what may change after the first run: it decides no verdict (the words, where the data lives, where and how the
# runs are spread, what they leave besides records, the power planning, the descriptive collapse floor, where the
# report is written); a grid's description under also: too
FREE_KEYS = ("description", "data_dir", "device", "executor", "outputs", "power", "report.collapse_floor",
             "report.out")


class RegisteredStudy:
    """The study file now, read as `report` reads it, where it is the registration in every key that decides a
    verdict (`study`; None otherwise), the registering commit, and why it is not that registration (`problems`)."""

    def __init__(self, study: Study | None, commit: str | None, problems: list[str]):
        self.study, self.commit, self.problems = study, commit, problems


def _design(data: Any) -> dict[str, Any]:
    """The study's keys that decide verdicts: all but FREE_KEYS, as dotted paths for the top two levels."""
    data = data if isinstance(data, dict) else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "report" and isinstance(value, dict):
            out.update({f"report.{k}": v for k, v in value.items() if f"report.{k}" not in FREE_KEYS})
        elif key == "also" and isinstance(value, list):
            out[key] = [{k: v for k, v in g.items() if k != "description"} if isinstance(g, dict) else g
                        for g in value]
        elif key not in FREE_KEYS:
            out[key] = value
    return out


def _placeholders(value: Any) -> bool:
    """Whether a value (nested) takes something from the environment."""
    if isinstance(value, dict):
        return any(_placeholders(v) for v in value.values())
    if isinstance(value, list):
        return any(_placeholders(v) for v in value)
    return isinstance(value, str) and "${" in value


def _parsed(blob: bytes) -> Any:
    return yaml.safe_load(bounded_study_text(blob))


def _committed(where: Path, commit: str, name: str) -> bytes | None:
    """The file's bytes as of `commit` (as `load_study` reads a file: bytes, decoded as UTF-8 later)."""
    try:
        done = subprocess.run(["git", "-C", str(where), "show", f"{commit}:./{name}"], capture_output=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _differing(then: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The design keys whose values differ between two designs (a key missing from one differs)."""
    return sorted(k for k in {**then, **other} if then.get(k) != other.get(k))


def _changed_between(where: Path, name: str, commit: str, then: dict[str, Any], study_file: str) -> list[str]:
    """Why a commit of the file after `commit` (up to HEAD) is not its design: one that changed it and was reverted
    later may have decided looks or runs while it stood."""
    later = git_output(where, "log", "--format=%H", f"{commit}..HEAD", "--", name)
    if later is None:
        return [f"git could not list the commits of the study file `{study_file}` after `{commit[:12]}`"]
    for sha in later.split():
        blob = _committed(where, sha, name)
        try:
            design = _design(_parsed(blob)) if blob is not None else None
        except (ValueError, yaml.YAMLError):
            design = None
        if design != then:
            differ = "" if design is None else ": its " + ", ".join(_differing(then, design))
            return [f"the study file `{study_file}` was committed otherwise than at `{commit[:12]}`, its last commit "
                    f"before the first run, in `{sha[:12]}`{differ} (changed after the first run, even if changed "
                    "back since)"]
    return []


def registered_study(study_file: str, first: datetime) -> RegisteredStudy:
    """The study file's last commit strictly before `first` (the first record's start), read as a study, and the
    differences of the file now from it in the keys that decide verdicts."""
    path = Path(study_file).resolve()
    where, name = path.parent, path.name
    before = (first - timedelta(seconds=1)).isoformat()   # git's --before includes its own second
    commit = git_output(where, "log", "-1", f"--before={before}", "--format=%H", "--", name)
    if not commit:
        return RegisteredStudy(None, None, [f"the study file `{study_file}` has no commit before the first run "
                                            "started, so its design and analysis were not fixed before it"])
    blob = _committed(where, commit, name)
    if blob is None:
        return RegisteredStudy(None, commit, [f"git could not show the study file `{study_file}` as of commit "
                                              f"`{commit[:12]}`"])
    try:
        then, now = _design(_parsed(blob)), _design(_parsed(path.read_bytes()))
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: too large, not UTF-8
        return RegisteredStudy(None, commit, [f"the study file `{study_file}` as of commit `{commit[:12]}` could "
                                              f"not be compared with the file now ({exc})"])
    problems = []
    from_env = sorted(k for k in {**then, **now} if _placeholders(then.get(k)) or _placeholders(now.get(k)))
    if from_env:
        problems.append(f"the study file `{study_file}` takes {', '.join(from_env)} from the environment "
                        "(${oc.env:...}), which no commit fixes: write the values out")
    changed = _differing(then, now)
    if changed:
        problems.append(f"the study file `{study_file}` changed its {', '.join(changed)} since commit "
                        f"`{commit[:12]}`, its last before the first run (only {', '.join(FREE_KEYS)} may change)")
    else:  # a change committed and later reverted may have shaped runs in between
        problems += _changed_between(where, name, commit, then, study_file)
    # the same design: the file now stands for the registration (read with today's schema, which an old commit's
    # free keys, an option since renamed, need not meet)
    return RegisteredStudy(None if problems else load_study(path), commit, problems)
