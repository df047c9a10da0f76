"""Finding run folders and reading their records into one DataFrame row per run.

Every record is parsed by `suite.run.record.RunRecord.from_dict`; a file that is not a valid record is named (with the
reason) and skipped, and leftover `.tmp-*.json` files of an interrupted write are not records at all.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
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
        "step_s": num(timing.get("step_s")), "peak_mb": num(timing.get("peak_memory_mb")),
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


def read_folder(runs: Path) -> tuple[list[dict], dict[str, str]]:
    """Rows of the valid records in one folder, and {file name: problem} for the others."""
    rows, problems = [], {}
    for path in sorted(runs.glob("*.json")):
        if path.name.startswith(TMP_PREFIX):
            continue
        try:
            rec = parse_record(json.loads(path.read_text()), path.name)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            problems[path.name] = f"{path.name}: not JSON ({exc})"
        except InvalidRecord as exc:
            problems[path.name] = str(exc)
        else:
            rows.append(flatten(rec, path))
    return rows, problems


def read_commands(root: Path, commands: list[str]) -> None:
    cmd_file = root / "commands.txt"
    if cmd_file.is_file():
        for line in cmd_file.read_text().splitlines():
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
        read_commands(root, commands)
    if not rows:
        raise ReportError("no readable run records in " + ", ".join(str(r) for _, r in folders)
                          + "".join(f"; {p}" for p in sorted(problems.values())))
    frame, duplicates = deduplicate(pd.DataFrame(rows))
    return Loaded(frame, sorted(problems), duplicates, commands, problems)
