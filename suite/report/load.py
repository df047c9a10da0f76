"""Finding run folders and reading their records into one DataFrame row per run.

Every record is parsed by `suite.run.record.RunRecord.from_dict`; a file that is not a valid record is named (with the
reason) and skipped, and leftover `.tmp-*.json` files of an interrupted write are not records at all.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import zipfile
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from suite.api.errors import ReportError
from suite.report.formatting import key_of, num
from suite.run.record import InvalidRecord, RunRecord
from suite.run.settings import with_added_defaults

TMP_PREFIX = ".tmp-"   # Store writes through such files and renames them


def run_folders(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, Path]]:
    """(output root, folder of records) for each path: an output folder with runs/, or a runs folder itself."""
    out = []
    for p in map(Path, paths):
        if (p / "runs").is_dir():
            out.append((p, p / "runs"))
        elif p.is_dir() and any(p.glob("*.json")):
            out.append((p.parent, p))
        else:
            raise ReportError(f"{p}: no run records (expected {p / 'runs'}/*.json, as written by "
                              f"`python -m suite run --out {p}`)")
    return out


def output_files(paths: Sequence[str | os.PathLike], name: str | Path) -> list[Path]:
    """The files called `name` at the output roots of the folders reported (a folder given as OUT/runs counts as OUT),
    where a stage beside the records left one (the tuning selection, the until-decided state)."""
    found = []
    for d in map(Path, paths):
        root = d.parent if d.name == "runs" and not (d / "runs").is_dir() else d
        if (root / name).is_file():
            found.append(root / name)
    return found


def _gap(rec: RunRecord) -> float:
    gap = num(rec.generalisation_gap)
    if math.isnan(gap) and rec.history:
        last = rec.history[-1]
        gap = num((last.get("train_subset") or {}).get("score")) - num((last.get("dev") or {}).get("score"))
    return gap


OUTCOME_NEUTRAL = frozenset({"analyses", "analysis_examples"})


def flatten(rec: RunRecord, path: Path) -> dict[str, Any]:
    """One DataFrame row: the fields the report groups by, plus the record's parts the sections read."""
    cfg = rec.config
    hp, train = with_added_defaults(str(cfg["method"]), dict(cfg.get("hparams") or {}), dict(cfg.get("train") or {}))
    # what the run analysed afterwards does not change its numbers: not a setting records are grouped by
    train_all = {**{k: v for k, v in train.items() if k not in OUTCOME_NEUTRAL}, "data_source": cfg.get("data_source")}
    ok = rec.status == "ok"
    final, timing, params = rec.final or {}, rec.timing or {}, rec.parameters or {}
    return {
        "model": str(cfg.get("model")), "task": str(cfg["task"]), "method": str(cfg["method"]),
        "hp": key_of(hp), "hp_dict": hp, "train": key_of(train_all), "train_dict": train_all,
        "seed": cfg.get("seed"), "status": rec.status,
        "score": num(final.get("score")) if ok else math.nan,
        "final": final if ok else {}, "best": rec.best or {},
        "gap": _gap(rec) if ok else math.nan,
        "wall_s": num(rec.wall_s), "step_s": num(timing.get("step_s")), "peak_mb": num(timing.get("peak_memory_mb")),
        "peak_kind": timing.get("peak_memory_kind"),
        "total_params": num(params.get("total")), "extra": num(params.get("extra")),
        "training_only": num(params.get("training_only")),
        "history": (rec.history or []) if ok else [], "attention": rec.attention if ok else None,
        "analyses": rec.analyses if ok else None,
        "method_record": rec.method_record or {}, "env": rec.environment or {},
        "data": rec.data or {}, "started": rec.started or "", "finished": rec.finished or "",
        "label": rec.label or f"{cfg['task']}/{cfg['method']}/seed{cfg.get('seed')}",
        "error": rec.error or "", "hash": rec.hash or str(path), "file": path.name,
        "baselines": rec.baselines or {},
        "predictions": str(path.parent / rec.predictions) if ok and rec.predictions else "",
    }


@dataclasses.dataclass
class Loaded:
    frame: pd.DataFrame
    unreadable: list[str]          # record files that could not be parsed or are not valid records
    duplicates: int                # records of the same job found more than once (the best one is kept)
    commands: list[str]
    problems: dict[str, str] = dataclasses.field(default_factory=dict)   # file name -> why it was skipped


def parse_record(d, source: str) -> RunRecord:
    """`RunRecord.from_dict`, except that a finished run without a finite score (a correlation of constant
    predictions is undefined) stays a finished run: the report shows it as "no score" and counts it as collapsed."""
    final = d.get("final") if isinstance(d, dict) and d.get("status") == "ok" else None
    if isinstance(final, dict) and "score" in final and num(final["score"]) != num(final["score"]):
        rec = RunRecord.from_dict({**d, "final": {**final, "score": 0.0}}, source=source)
        rec.final = final
        return rec
    return RunRecord.from_dict(d, source=source)


NUMBER = (int, float, type(None))
OPTIONAL_DICT = (dict, type(None))
OPTIONAL_STR = (str, type(None))
# The types of the record's parts the report reads ("[]": each item of a list, "*": each value of a dict). A
# hand-edited record with another type there is named and skipped instead of crashing a section of the report.
NESTED_TYPES: dict[str, type | tuple[type, ...]] = {
    "config.model": OPTIONAL_STR, "config.task": str, "config.method": str, "config.seed": (int, type(None)),
    "config.hparams": OPTIONAL_DICT, "config.train": OPTIONAL_DICT, "label": str, "hash": str,
    "environment": OPTIONAL_DICT, "history": (list, type(None)), "history[]": dict,
    "history[].dev": OPTIONAL_DICT, "history[].train_subset": OPTIONAL_DICT, "history[].method": OPTIONAL_DICT,
    "final": OPTIONAL_DICT, "final.score": NUMBER, "best": OPTIONAL_DICT, "timing": OPTIONAL_DICT,
    "timing.step_s": NUMBER, "timing.peak_memory_mb": NUMBER, "parameters": OPTIONAL_DICT, "parameters.*": NUMBER,
    "data": OPTIONAL_DICT, "attention": OPTIONAL_DICT, "attention.mean": OPTIONAL_DICT,
    "attention.per_layer": OPTIONAL_DICT, "analyses": OPTIONAL_DICT, "method_record": OPTIONAL_DICT,
    "baselines": OPTIONAL_DICT, "predictions": OPTIONAL_STR, "started": OPTIONAL_STR, "finished": OPTIONAL_STR,
    "error": OPTIONAL_STR, "generalisation_gap": NUMBER, "version": int,
}


def _values(data: Any, path: str) -> list[tuple[str, Any]]:
    """(where, value) of every value at a dotted `path` of NESTED_TYPES in `data` (absent parts: none)."""
    found = [("", data)]
    for part in path.split("."):
        step = []
        for where, value in found:
            name, each = part.removesuffix("[]"), part.endswith("[]")
            if name == "*":
                step += [(f"{where}.{k}", v) for k, v in value.items()] if isinstance(value, dict) else []
                continue
            if not isinstance(value, dict) or name not in value:
                continue
            where, value = f"{where}.{name}".lstrip("."), value[name]
            if each:
                step += [(f"{where}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else []
            else:
                step.append((where, value))
        found = step
    return found


def _is(value: Any, types: type | tuple[type, ...]) -> bool:
    """isinstance, except that JSON's true/false is no number"""
    if isinstance(value, bool):
        return bool in (types if isinstance(types, tuple) else (types,))
    return isinstance(value, types)


def check_nested_types(data: Any, source: str) -> None:
    for path, types in NESTED_TYPES.items():
        for where, value in _values(data, path):
            if not _is(value, types):
                raise InvalidRecord(f"{source}: {where} is a JSON {type(value).__name__}, not what a run record "
                                    "holds there (edited by hand?)")


def _sidecar(path: Path, rec: RunRecord) -> str:
    """The predictions sidecar of an ok record when it can be read in full; else '' (the run is reported without
    example-level statistics) and a one-line warning naming the file."""
    if rec.status != "ok" or not rec.predictions:
        return ""
    sidecar = path.parent / rec.predictions
    try:
        with zipfile.ZipFile(sidecar) as archive:
            bad = archive.testzip()
        if bad is None:
            return str(sidecar)
        why = f"member {bad} is corrupt"
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    print(f"warning: {sidecar}: predictions file unreadable ({why}); {path.name} is reported without its "
          "per-example predictions", file=sys.stderr)
    return ""


def read_record(path: Path) -> dict:
    """The row of one record file; InvalidRecord (naming the file and why) for anything that is not a record."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRecord(f"{path.name}: not JSON ({exc})") from None
    except RecursionError:
        raise InvalidRecord(f"{path.name}: not a run record (JSON nested too deeply)") from None
    except OSError as exc:  # a dangling link (git-annex, DVC), a folder named *.json, permissions
        what = "a link to a missing file" if path.is_symlink() and not path.exists() else \
            "a folder" if path.is_dir() else "unreadable"
        raise InvalidRecord(f"{path.name}: {what} ({exc.strerror or exc})") from None
    check_nested_types(data, path.name)
    try:
        rec = parse_record(data, path.name)
        row = flatten(rec, path)
    except InvalidRecord:
        raise
    except (TypeError, AttributeError, ValueError, KeyError) as exc:  # a shape NESTED_TYPES does not cover
        raise InvalidRecord(f"{path.name}: not a run record ({type(exc).__name__}: {exc})") from None
    row["predictions"] = _sidecar(path, rec)
    return row


def read_folder(runs: Path) -> tuple[list[dict], dict[str, str]]:
    """Rows of the valid records in one folder, and {file name: problem} for the others."""
    rows, problems = [], {}
    for path in sorted(runs.glob("*.json")):
        if path.name.startswith(TMP_PREFIX):
            continue
        try:
            rows.append(read_record(path))
        except InvalidRecord as exc:
            problems[path.name] = str(exc)
    return rows, problems


def read_commands(root: Path, commands: list[str]) -> None:
    cmd_file = root / "commands.txt"
    if cmd_file.is_file():
        try:
            text = cmd_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"warning: {cmd_file}: cannot be read ({exc}); the report names no commands from it",
                  file=sys.stderr)
            return
        for line in text.splitlines():
            if line.strip() and line.strip() not in commands:
                commands.append(line.strip())


def deduplicate(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The same job found twice (overlapping run folders): keep one, preferring an ok record, then the latest."""
    frame = frame.assign(_ok=frame["status"] == "ok")
    frame = frame.sort_values(["hash", "_ok", "finished", "file"], kind="mergesort")
    before = len(frame)
    frame = frame.drop_duplicates("hash", keep="last").drop(columns="_ok")
    frame["_seed"] = pd.to_numeric(frame["seed"], errors="coerce")
    frame = frame.sort_values(["model", "task", "method", "hp", "train", "_seed", "file"], kind="mergesort")
    return frame.drop(columns="_seed").reset_index(drop=True), before - len(frame)


def load(paths: Sequence[str | os.PathLike]) -> Loaded:
    folders = run_folders(paths)
    rows, problems, commands = [], {}, []
    for root, runs in folders:
        found, bad = read_folder(runs)
        rows += found
        problems.update(bad)
        for name in sorted(bad):
            print(f"warning: skipped {runs / name}: {bad[name].removeprefix(name + ': ')}", file=sys.stderr)
        read_commands(root, commands)
    if not rows:
        raise ReportError("no readable run records in " + ", ".join(str(r) for _, r in folders)
                          + "".join(f"; {p}" for p in sorted(problems.values())))
    frame, duplicates = deduplicate(pd.DataFrame(rows))
    return Loaded(frame, sorted(problems), duplicates, commands, problems)
