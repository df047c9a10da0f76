"""Finding run folders and reading their records into one DataFrame row per run.

Every record is parsed by `suite.run.record.RunRecord.from_dict`; a file that is not a valid record is named (with the
reason) and skipped, and leftover `.tmp-*.json` files of an interrupted write are not records at all.

The split a run is scored on: its held-out test split when it has one (`train.test_holdout`; the record's `heldout`),
else dev. A row's `score`, `final`, `baseline` and `predictions` are that split's, so the tables, comparisons and
example-level statistics read one split without asking which; `scored_on` names it, and `dev_score` / `dev_final`
keep the dev metrics beside.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import zipfile
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from suite.api.errors import ReportError
from suite.report.vocabulary import key_of, num
from suite.run.layout import COMMANDS, RUNS
from suite.run.record import (
    InvalidRecord,
    RunRecord,
    check_nested_types,
    heldout_predictions,
    load_predictions,
)
from suite.run.settings import with_added_defaults

TMP_PREFIX = ".tmp-"   # Store writes through such files and renames them

__all__ = ["Analyses", "AttentionStats", "DataSizes", "Loaded", "RecordedBaseline",
           "Setting", "load"]
CONSTANT_KINDS = ("majority", "constant_mean")


def _layers(values: Any) -> tuple | None:
    """A value per layer as recorded (a JSON list), as a tuple; None for anything else."""
    return tuple(values) if isinstance(values, list) else None


@dataclasses.dataclass(frozen=True, order=True)
class Setting:
    """A run's hyper-parameters or its training settings. Runs are grouped, compared and sorted by the canonical text
    of the values (`key`), so that two records of one configuration meet whatever order their JSON had."""
    key: str
    values: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "Setting":
        return cls(key_of(dict(values)), MappingProxyType(dict(values)))

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def without(self, names: Iterable[str]) -> "Setting":
        """The setting with the values of `names` taken out."""
        left_out = set(names)
        return Setting.of({k: v for k, v in self.values.items() if k not in left_out})


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A run's dev metrics at its last epoch (name -> value; "score": the headline); none for a run that failed."""
    values: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, final: Mapping[str, Any]) -> "Metrics":
        return cls(MappingProxyType({k: num(v) for k, v in final.items()}))

    def get(self, name: str) -> float:
        return self.values.get(name, math.nan)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.values)


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One epoch of a run's history: losses and headline scores (in [0, 1]; NaN: not recorded)."""
    epoch: int | None
    train_loss: float
    dev_loss: float
    dev_score: float
    train_subset_score: float
    drop_rates: tuple | None      # the method's drop rate per layer at this epoch, where it logged one

    @classmethod
    def of(cls, e: Mapping[str, Any]) -> "Epoch":
        return cls(e.get("epoch"), num(e.get("train_loss")), num(e.get("dev_loss")),
                   num((e.get("dev") or {}).get("score")), num((e.get("train_subset") or {}).get("score")),
                   _layers((e.get("method") or {}).get("drop_rate_per_layer")))


@dataclasses.dataclass(frozen=True)
class AttentionStats:
    """The attention statistics a run recorded on dev batches (suite/run/attention_stats.py)."""
    mean: Mapping[str, float]                # statistic -> mean over layers
    per_layer: Mapping[str, tuple | None]    # statistic -> its value per layer

    @classmethod
    def of(cls, attention: Any) -> "AttentionStats | None":
        if not isinstance(attention, dict):
            return None
        return cls(MappingProxyType({k: num(v) for k, v in (attention.get("mean") or {}).items()}),
                   MappingProxyType({k: _layers(v) for k, v in (attention.get("per_layer") or {}).items()}))


@dataclasses.dataclass(frozen=True)
class Analyses:
    """A run's end-of-run analyses (suite/run/analyses), each one's part as the analysis wrote it."""
    parts: Mapping[str, Any]

    @classmethod
    def of(cls, analyses: Any) -> "Analyses | None":
        return cls(MappingProxyType(dict(analyses))) if isinstance(analyses, dict) else None

    def get(self, name: str) -> Any:
        return self.parts.get(name)


@dataclasses.dataclass(frozen=True)
class Environment:
    """Where and with which code a run ran, as the header names it ("?", or "unknown" for the commit: not
    recorded)."""
    device: str
    gpu: str
    platform: str
    cpu_threads: str
    host: str
    suite: str
    git_commit: str
    python: str
    torch: str
    transformers: str

    @classmethod
    def of(cls, env: Mapping[str, Any]) -> "Environment":
        def text(key: str) -> str:
            return str(env.get(key, "?"))
        return cls(text("device"), str(env.get("gpu") or ""), text("platform"), text("cpu_threads"), text("host"),
                   text("suite"), str(env.get("git_commit") or "unknown"), text("python"), text("torch"),
                   text("transformers"))


@dataclasses.dataclass(frozen=True)
class DataSizes:
    """The split sizes a run used (None: not recorded)."""
    train: int | None = None
    train_subset: int | None = None              # the fixed train subset the generalisation gap is measured on
    dev: tuple[tuple[str, int], ...] = ()        # (eval-split suffix, examples), in order
    heldout: int | None = None                   # the held-out test split (train.test_holdout; None: none)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> "DataSizes":
        return cls(data.get("train"), data.get("train_subset"), tuple(sorted((data.get("dev") or {}).items())),
                   data.get("heldout"))


@dataclasses.dataclass(frozen=True)
class RecordedBaseline:
    """The scores (in [0, 1]; NaN: not a number) of the predictors that learn nothing, as the runner recorded them."""
    constant_kind: str     # "majority" or "constant_mean"
    constant: float
    chance: float

    @classmethod
    def of(cls, found: Mapping[str, Any]) -> "RecordedBaseline | None":
        kind = next((k for k in CONSTANT_KINDS if isinstance(found.get(k), dict)), None)
        if kind is None:
            return None
        return cls(kind, num(found[kind].get("score")), num((found.get("chance") or {}).get("score")))


def run_folders(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, Path]]:
    """(output root, folder of records) for each path: an output folder with runs/, or a runs folder itself."""
    out = []
    for p in map(Path, paths):
        if (p / RUNS).is_dir():
            out.append((p, p / RUNS))
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
    scored = scored_split(rec)
    return {
        "model": str(cfg.get("model")), "task": str(cfg["task"]), "method": str(cfg["method"]),
        "hp": Setting.of(hp), "train": Setting.of(train_all),
        "seed": cfg.get("seed"), "status": rec.status,
        "score": num(scored.metrics.get("score")) if ok else math.nan,
        "final": Metrics.of(scored.metrics) if ok else Metrics(), "scored_on": scored.name,
        "dev_score": num(final.get("score")) if ok else math.nan, "dev_final": Metrics.of(final) if ok else Metrics(),
        "best_score": num((rec.best or {}).get("score")),
        "gap": _gap(rec) if ok else math.nan,
        "wall_s": num(rec.wall_s), "step_s": num(timing.get("step_s")), "peak_mb": num(timing.get("peak_memory_mb")),
        "peak_kind": timing.get("peak_memory_kind"),
        "step_mode": str((timing.get("step_mode") or {}).get("mode") or "eager"),  # captured: replayed CUDA graphs
        "total_params": num(params.get("total")), "extra": num(params.get("extra")),
        "training_only": num(params.get("training_only")),
        "history": tuple(map(Epoch.of, rec.history or ())) if ok else (),
        "attention": AttentionStats.of(rec.attention) if ok else None,
        "analyses": Analyses.of(rec.analyses) if ok else None,
        "drop_rates": _layers((rec.method_record or {}).get("drop_rate_per_layer")),
        "env": Environment.of(rec.environment or {}),
        "data": DataSizes.of(rec.data or {}), "started": rec.started or "", "finished": rec.finished or "",
        "label": rec.label or f"{cfg['task']}/{cfg['method']}/seed{cfg.get('seed')}",
        "error": rec.error or "", "hash": rec.hash or str(path), "file": path.name,
        "baseline": RecordedBaseline.of(scored.baselines),
        "predictions": scored.predictions(str(path.parent / rec.predictions)) if ok and rec.predictions else "",
    }


@dataclasses.dataclass(frozen=True)
class Scored:
    """The split a run is scored on: its name, metrics, learn-nothing baselines and how its predictions are read."""
    name: str                       # "heldout" (train.test_holdout) or "dev"
    metrics: Mapping[str, Any]
    baselines: Mapping[str, Any]

    def predictions(self, sidecar: str) -> str:
        """What the example-level statistics load this split's predictions by, from the run's sidecar."""
        return heldout_predictions(sidecar) if self.name == "heldout" else sidecar


def scored_split(rec: RunRecord) -> Scored:
    """The held-out test split when the record has its score, else dev: a run is never scored on dev when it kept
    a held-out test split (dev then shows beside, as `dev_score`)."""
    if isinstance(rec.heldout, dict):
        return Scored("heldout", rec.heldout, rec.heldout_baselines or {})
    return Scored("dev", rec.final or {}, rec.baselines or {})


@dataclasses.dataclass(frozen=True)
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


def _sidecar(path: Path, rec: RunRecord) -> str:
    """The predictions sidecar of an ok record when it can be read in full; else '' (the run is reported without
    example-level statistics) and a one-line warning naming the file."""
    if rec.status != "ok" or not rec.predictions:
        return ""
    sidecar = path.parent / rec.predictions
    scored = scored_split(rec)
    try:
        with zipfile.ZipFile(sidecar) as archive:
            bad = archive.testzip()
            held = any(n.startswith(f"{scored.name}/") for n in archive.namelist())
        why = f"member {bad} is corrupt" if bad is not None else "no held-out test predictions in it"
        if bad is None and (scored.name == "dev" or held):
            why = _shape_problem(scored.predictions(str(sidecar)))
            if why is None:
                return scored.predictions(str(sidecar))
    except (OSError, zipfile.BadZipFile, ValueError, KeyError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    print(f"warning: {sidecar}: predictions file unreadable ({why}); {path.name} is reported without its "
          "per-example predictions", file=sys.stderr)
    return ""


def _shape_problem(predictions: str) -> str | None:
    """Why a sidecar's arrays are not per-example predictions (each split: index and labels one value per example,
    logits one row per example, all numbers), or None."""
    for split, arrays in load_predictions(predictions).items():
        index, label, logits = (arrays.get(k) for k in ("index", "label", "logits"))
        if any(a is None or a.dtype.kind not in "biuf" for a in (index, label, logits)):
            return f"split {split or 'dev'} lacks numeric index, label or logits arrays"
        if index.ndim != 1 or label.shape != index.shape or logits.ndim not in (1, 2) or len(logits) != len(index):
            return (f"split {split or 'dev'} has arrays of shapes index {index.shape}, label {label.shape}, logits "
                    f"{logits.shape}, not one value (or row) per example")
    return None


def check_names(data: Any, source: str) -> None:
    """The names a row is grouped by are names: model, task and method non-empty text (an emptied one crashed a
    section of the report)."""
    config = data.get("config") if isinstance(data, dict) else None
    for key in ("model", "task", "method"):
        value = config.get(key) if isinstance(config, dict) else None
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidRecord(f"{source}: config.{key} is {value!r}, not a name (edited by hand?)")


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
    check_names(data, path.name)
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
    cmd_file = root / COMMANDS
    if cmd_file.is_file():
        try:
            text = cmd_file.read_text(encoding="utf-8")  # as `run` writes it, whatever the locale
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
