"""Finding run folders and reading them once: their records into one DataFrame row per run, and the state files the
stages beside the records left (the tuning selection, the looks of `run --until-decided`), all into `Loaded`.

Every record is read by `suite.run.record.read_record`, the suite's one reader; a file that is not a valid record is
named (with the reason) and skipped, and leftover `.tmp-*.json` files of an interrupted write are not records at all.

The split a run is scored on is `RunRecord.scored`'s: its held-out test split when it has one (`train.test_holdout`),
else dev. A row's `score`, `final`, `baseline` and `predictions` are that split's, so the tables, comparisons and
example-level statistics read one split without asking which; `scored_on` names it, and `dev_score` / `dev_final`
keep the dev metrics beside. A row's `outcome` is the run as every verdict scores it (`RunOutcome.of`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import sys
import zipfile
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from suite.api.errors import ReportError
from suite.report.vocabulary import key_of
from suite.run.layout import (
    COMMANDS,
    RUNS,
    SELECTION,
    TUNING,
    UNTIL_DECIDED,
    SelectionFile,
    UntilDecidedFile,
    read_state,
)
from suite.run.record import InvalidRecord, RunRecord, load_predictions, read_record, record_files
from suite.run.record_parts import Metrics, num
from suite.run.settings import NEVER_HASHED, with_added_defaults
from suite.stats.evidence import RunOutcome

__all__ = ["ADDED_BY_SELECTION", "LOADED", "Col", "Loaded", "Setting", "load"]
SELECTION_PATH = Path(TUNING) / SELECTION  # beside the records, at the output root


class Col(StrEnum):
    """The run table's columns (`Loaded.frame`), each read by its name here, never by its text (a test holds it)."""
    MODEL = "model"                  # the model's name as the run gave it
    TASK = "task"
    METHOD = "method"
    HP = "hp"                        # `Setting`: the method's hyper-parameters, defaults added
    TRAIN = "train"                  # `Setting`: the training settings that change numbers, and the data source
    SEED = "seed"
    STATUS = "status"                # "ok", or how the run ended
    SCORE = "score"                  # headline of the split the run is scored on (nan unless ok)
    FINAL = "final"                  # `Metrics` of that split at the end of training
    SCORED_ON = "scored_on"          # that split's name: dev, or the held-out test split
    DEV_SCORE = "dev_score"          # headline on dev, whatever split is scored
    DEV_FINAL = "dev_final"          # `Metrics` on dev at the end of training
    BEST_SCORE = "best_score"        # headline of the best epoch on dev
    GAP = "gap"                      # train-subset minus dev score at the end (the generalisation gap)
    WALL_S = "wall_s"                # seconds the whole run took
    STEP_S = "step_s"                # seconds per training step
    PEAK_MB = "peak_mb"              # peak memory, of the kind PEAK_KIND names
    PEAK_KIND = "peak_kind"
    STEP_MODE = "step_mode"          # how steps ran (captured: replayed CUDA graphs)
    TOTAL_PARAMS = "total_params"
    EXTRA = "extra"                  # parameters the method adds to the model
    TRAINING_ONLY = "training_only"  # parameters used in training only
    HISTORY = "history"              # `Epoch`s, empty unless ok
    ATTENTION = "attention"          # `AttentionStats` or None
    ANALYSES = "analyses"            # `Analyses` or None
    DROP_RATES = "drop_rates"
    ENV = "env"                      # `Environment`: versions, device, commit
    DATA = "data"                    # `DataSizes`
    STARTED = "started"              # ISO time, "" when not recorded
    FINISHED = "finished"
    LABEL = "label"                  # the run's display name
    ERROR = "error"                  # "" unless it failed
    HASH = "hash"                    # the run's identity (the record's path when it has none)
    FILE = "file"                    # the record's file name
    BASELINE = "baseline"            # `RecordedBaseline` of the scored split
    OUTCOME = "outcome"              # `RunOutcome`: the run as every verdict scores it, None unless ok
    PREDICTIONS = "predictions"      # path of its readable predictions file, or ""
    # added by suite.report.selection, not by `load`
    TUNED = "tuned"                  # per folded row, the keys its cell's tuning chose (`fold_selected`)
    SIZE = "size"                    # a curve run's training-set size (`size_curves`)
    EPOCHS = "epochs"                # a curve run's epochs
    DRAW = "draw"                    # a curve run's fixed data draw, or None


ADDED_BY_SELECTION = frozenset({Col.TUNED, Col.SIZE, Col.EPOCHS, Col.DRAW})
LOADED = frozenset(Col) - ADDED_BY_SELECTION  # the columns `load` gives every row


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


def flatten(rec: RunRecord, path: Path) -> dict[Col, Any]:
    """One DataFrame row: the fields the report groups by, plus the record's parts the sections read (every column
    of `LOADED` but the two `read_row` adds)."""
    hp, train = with_added_defaults(rec.method, rec.hparams, rec.train)
    # a setting that changes none of the run's numbers (never hashed) is no setting records are grouped by
    train_all = {**{k: v for k, v in train.items() if k not in NEVER_HASHED}, "data_source": rec.data_source}
    ok, scored, timing, counts = rec.ok, rec.scored, rec.timing, rec.parameters
    return {
        Col.MODEL: str(rec.model), Col.TASK: rec.task, Col.METHOD: rec.method,
        Col.HP: Setting.of(hp), Col.TRAIN: Setting.of(train_all),
        Col.SEED: rec.seed, Col.STATUS: rec.status,
        Col.SCORE: scored.metrics.score if ok else math.nan,
        Col.FINAL: scored.metrics if ok else Metrics(), Col.SCORED_ON: scored.name,
        Col.DEV_SCORE: rec.final.score if ok else math.nan, Col.DEV_FINAL: rec.final if ok else Metrics(),
        Col.BEST_SCORE: rec.best.score,
        Col.GAP: rec.gap if ok else math.nan,
        Col.WALL_S: num(rec.wall_s), Col.STEP_S: num(timing.step_s), Col.PEAK_MB: num(timing.peak_memory_mb),
        Col.PEAK_KIND: timing.peak_memory_kind,
        Col.STEP_MODE: timing.mode,
        Col.TOTAL_PARAMS: num(counts.total), Col.EXTRA: num(counts.extra),
        Col.TRAINING_ONLY: num(counts.training_only),
        Col.HISTORY: rec.history if ok else (),
        Col.ATTENTION: rec.attention if ok else None,
        Col.ANALYSES: rec.analyses if ok else None,
        Col.DROP_RATES: rec.drop_rates, Col.ENV: rec.env,
        Col.DATA: rec.data, Col.STARTED: rec.started or "", Col.FINISHED: rec.finished or "",
        Col.LABEL: rec.label or f"{rec.task}/{rec.method}/seed{rec.seed}",
        Col.ERROR: rec.error or "", Col.HASH: rec.hash or str(path), Col.FILE: path.name,
        Col.BASELINE: scored.baseline,
    }


@dataclasses.dataclass(frozen=True)
class Loaded:
    frame: pd.DataFrame
    unreadable: list[str]          # record files that could not be parsed or are not valid records
    duplicates: int                # records of the same job found more than once (the best one is kept)
    commands: list[str]
    problems: dict[str, str] = dataclasses.field(default_factory=dict)   # file name -> why it was skipped
    # the state files the stages beside the records left (tuning selection, until-decided looks), each read once
    selections: tuple[tuple[Path, SelectionFile], ...] = ()
    until_decided: tuple[tuple[Path, UntilDecidedFile], ...] = ()


def _outcome(path: Path, rec: RunRecord) -> RunOutcome | None:
    """The run as every verdict scores it (`RunOutcome.of`), its predictions kept only when the sidecar can be read
    in full (else a one-line warning naming the file: the run is reported without example-level statistics)."""
    if not rec.ok:
        return None
    outcome = RunOutcome.of(rec, path.parent)
    if not rec.predictions:
        return outcome
    sidecar = path.parent / rec.predictions
    split = rec.scored.name
    try:
        if sidecar.exists() and not sidecar.is_file():  # a folder, a FIFO (never read: it would hang)
            raise ValueError("not a regular file")
        digest = rec.predictions_sha256
        if digest and sidecar.exists() and hashlib.sha256(sidecar.read_bytes()).hexdigest() != digest:
            raise ValueError("its sha256 is not the one its record holds: another run's, or edited")
        with zipfile.ZipFile(sidecar) as archive:
            bad = archive.testzip()
            held = any(n.startswith(f"{split}/") for n in archive.namelist())
        why = f"member {bad} is corrupt" if bad is not None else "no held-out test predictions in it"
        if bad is None and (split == "dev" or held):
            why = _shape_problem(str(outcome.predictions))
            if why is None:
                return outcome
    except (OSError, zipfile.BadZipFile, ValueError, KeyError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    print(f"warning: {sidecar}: predictions file unreadable ({why}); {path.name} is reported without its "
          "per-example predictions", file=sys.stderr)
    return dataclasses.replace(outcome, predictions=None)


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


def read_row(path: Path) -> dict[Col, Any]:
    """The row of one record file (`suite.run.record.read_record`); InvalidRecord (naming the file and why) for
    anything that is not a record."""
    try:
        rec = read_record(path, path.name, unscored=True)
    except OSError as exc:  # a dangling link (git-annex, DVC), a folder named *.json, permissions
        what = "a link to a missing file" if path.is_symlink() and not path.exists() else \
            "a folder" if path.is_dir() else "unreadable"
        raise InvalidRecord(f"{path.name}: {what} ({exc.strerror or exc})") from None
    try:
        row = flatten(rec, path)
    except (TypeError, AttributeError, ValueError, KeyError) as exc:  # a shape NESTED_TYPES does not cover
        raise InvalidRecord(f"{path.name}: not a run record ({type(exc).__name__}: {exc})") from None
    row[Col.OUTCOME] = _outcome(path, rec)
    row[Col.PREDICTIONS] = str(row[Col.OUTCOME].predictions or "") if row[Col.OUTCOME] is not None else ""
    return row


def read_folder(runs: Path) -> tuple[list[dict[Col, Any]], dict[str, str]]:
    """Rows of the valid records in one folder, and {file name: problem} for the others."""
    rows, problems = [], {}
    for path in record_files(runs):
        try:
            rows.append(read_row(path))
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
    frame = frame.assign(_ok=frame[Col.STATUS] == "ok")
    frame = frame.sort_values([Col.HASH, "_ok", Col.FINISHED, Col.FILE], kind="mergesort")
    before = len(frame)
    frame = frame.drop_duplicates(Col.HASH, keep="last").drop(columns="_ok")
    frame["_seed"] = pd.to_numeric(frame[Col.SEED], errors="coerce")
    frame = frame.sort_values([Col.MODEL, Col.TASK, Col.METHOD, Col.HP, Col.TRAIN, "_seed", Col.FILE], kind="mergesort")
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
        tuning = sum(len(record_files(root / TUNING / RUNS)) for root, _ in folders)
        raise ReportError("no readable run records in " + ", ".join(str(r) for _, r in folders)
                          + "".join(f"; {p}" for p in sorted(problems.values()))
                          + (f" (its tuning stage has {tuning} record(s): a study's final rounds start when its "
                             "tuning is complete, and `python -m suite run` with the same options goes on with it; "
                             "the report reads the final rounds' records)" if tuning else ""))
    frame, duplicates = deduplicate(pd.DataFrame(rows))
    return Loaded(frame, sorted(problems), duplicates, commands, problems,
                  tuple((f, read_state(f, SelectionFile)) for f in output_files(paths, SELECTION_PATH)),
                  tuple((f, read_state(f, UntilDecidedFile)) for f in output_files(paths, UNTIL_DECIDED)))


def tuning_started(paths: Sequence[str | os.PathLike]) -> list[str]:
    """When each tuning record of the folders reported started (OUT/tuning/runs/): a pre-registration must be older
    than a study's first run, and a tuned study's first run is a tuning run. One that cannot be read is warned about
    and counts as a record that does not say when it started."""
    started = []
    for root, _ in run_folders(paths):
        for path in record_files(root / TUNING / RUNS):
            try:
                started.append(read_record(path).started or "")
            except (InvalidRecord, OSError, ValueError) as exc:
                print(f"warning: {path}: not a readable tuning record ({exc})", file=sys.stderr)
                started.append("")
    return started


def output_files(paths: Sequence[str | os.PathLike], name: str | Path) -> list[Path]:
    """The files called `name` at the output roots of the folders reported (a folder given as OUT/runs counts as OUT),
    where a stage beside the records left one (the tuning selection, the until-decided state)."""
    found = []
    for d in map(Path, paths):
        root = d.parent if d.name == RUNS and not (d / RUNS).is_dir() else d
        if (root / name).is_file():
            found.append(root / name)
    return found
