"""The run record: what one finished (or failed) run leaves behind, as a typed object with a version.

Every writer (the runner, the failed-record path of the executors) builds a `RunRecord`; every reader (the grid's
resume check, the looks, the power table, the status display, the report) reads a record file through
`read_record(path)`, which validates it (`RunRecord.from_dict` and the JSON types of its parts) and names the file
when it is not a record. Version 1 records (written before the version field existed) load as they are: every field
added since has a default.

Readers never index the record's JSON: its parts come typed from the accessors here (`suite.run.record_parts`), and
two rules live here once: the split a run is scored on (`RunRecord.scored`: its held-out test split when it kept
one, else dev) and its tuning-split score (`RunRecord.tune_score`).

Per-example dev predictions live in a sidecar `.npz` next to the record (`predictions` names it), so that the
record stays small and readable while statistics can still work at the example level. A run with a held-out test
split (`train.test_holdout`) keeps its predictions there too, under HELDOUT, with each row's carving group (`group`,
from version 3: rows of one sentence group share a source, and the example se is jackknifed by group);
`load_predictions(path)` gives the dev sets' and `load_predictions(path + "#heldout")` the held-out split's, each as
a run's predictions on one dev set.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from suite.run.record_codec import NO_JSON, PartError, json_fields, read_fields, read_json, wrong_type
from suite.run.record_parts import (
    Analyses,
    Artifacts,
    AttentionStats,
    Baselines,
    Best,
    DataSizes,
    Environment,
    Epoch,
    Executor,
    Metrics,
    Parameters,
    RecordedBaseline,
    Timing,
    num,
)

# what the rest of the suite uses; other names are this module's own
__all__ = ["HELDOUT", "InvalidRecord", "NewerRecord", "RECORD_VERSION", "REFUSED", "RunRecord", "TMP_PREFIX",
           "heldout_predictions", "load_predictions", "predictions_filename", "read_record", "record_files",
           "save_predictions", "set_aside"]

if TYPE_CHECKING:
    import numpy as np  # imported where used: dry runs read records without it

    from suite.run.settings import RunConfig

RECORD_VERSION = 3  # 3: held-out predictions keep each row's carving group (`group`); older ones load as rows
STATUSES = ("ok", "failed")
HELDOUT = "heldout"  # the held-out test split's group in the predictions sidecar (never a dev set's suffix)
TMP_PREFIX = ".tmp-"  # the store writes through such files and renames them: never a record


class InvalidRecord(ValueError):
    """A file in a runs folder that is not a valid run record; the message names the file and the problem."""


class NewerRecord(InvalidRecord):
    """A record written by a newer suite: valid there, unreadable here. It must be kept, never replaced."""


@dataclasses.dataclass
class RunRecord:
    config: dict[str, Any]      # the job (RunConfig.to_dict): read back by RunConfig.from_dict, hashed by its rules
    hash: str
    label: str
    status: str                                        # "ok" or "failed"
    # what the machine and its libraries reported (suite.run.device.environment, a GPU's settings): its keys follow
    # the device, and only the report's header reads them (`env`)
    environment: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    started: str | None = None
    finished: str | None = None
    wall_s: float | None = None
    history: tuple[Epoch, ...] = ()                     # one entry per epoch
    final: Metrics = dataclasses.field(default_factory=Metrics)     # dev metrics at the selected epoch
    best: Best = dataclasses.field(default_factory=Best)            # best epoch by dev score (reference)
    tune: Metrics | None = None       # tuning-split metrics at the selected epoch (train.holdout), beside dev
    heldout: Metrics | None = None    # held-out test split's metrics (train.test_holdout) of the final model
    heldout_baselines: Baselines | None = None  # majority / constant / chance scores on the held-out test split
    generalisation_gap: float | None = None
    timing: Timing = dataclasses.field(default_factory=Timing)
    data: DataSizes = dataclasses.field(default_factory=DataSizes)            # split sizes actually used
    parameters: Parameters = dataclasses.field(default_factory=Parameters)
    attention: AttentionStats | None = None
    method_record: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the method's own facts (its keys)
    baselines: Baselines = dataclasses.field(default_factory=Baselines)     # majority / constant / chance scores
    # the distributions behind the method and the task (Registry.origin: their names and versions, as reported)
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    analyses: Analyses | None = None
    artifacts: Artifacts | None = None   # files the run left beside its record (saved model, test predictions)
    executor: Executor = dataclasses.field(default_factory=Executor)
    error: str | None = None
    traceback: str | None = None
    version: int = 1
    predictions: str | None = None     # the sidecar's file name (the store names it last, when it writes the arrays)
    predictions_sha256: str | None = None  # the sidecar's digest as written: the report reads no other file under it
    # per-example dev predictions {suffix: {"index", "label", "logits"}}, kept in memory until the store writes
    # them to the sidecar file named by `predictions`; never part of the JSON
    prediction_arrays: dict[str, dict[str, np.ndarray]] | None = dataclasses.field(default=None, repr=False,
                                                                                     compare=False, metadata=NO_JSON)
    # top-level keys this suite does not define (an older or a newer writer's), written back as read
    unknown: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, metadata=NO_JSON)
    # the JSON's keys in the order read (None: built by the runner)
    read_order: tuple[str, ...] | None = dataclasses.field(default=None, repr=False, compare=False,
                                                           metadata=NO_JSON)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    # --- the job, from its config -------------------------------------------------------------------------
    @property
    def task(self) -> str:
        return str(self.config["task"])

    @property
    def method(self) -> str:
        return str(self.config["method"])

    @property
    def model(self) -> str | None:
        return self.config.get("model")

    @property
    def seed(self) -> int | None:
        return self.config.get("seed")

    @property
    def data_source(self) -> str | None:
        return self.config.get("data_source")

    @property
    def hparams(self) -> dict[str, Any]:
        """The method's hyper-parameters as the run recorded them (a copy)."""
        return dict(self.config.get("hparams") or {})

    @property
    def train(self) -> dict[str, Any]:
        """The training settings as the run recorded them (a copy)."""
        return dict(self.config.get("train") or {})

    @property
    def setting(self) -> dict[str, Any]:
        """Everything the job's config holds but its seed: runs of one setting differ only by seed (a copy)."""
        return {k: v for k, v in self.config.items() if k != "seed"}

    # --- what it measured (the fields hold it typed; the rules that read several fields are here) --------------
    @property
    def scored(self) -> "Scored":
        """The split the run is scored on: its held-out test split when it kept one (`train.test_holdout`), else
        dev. Every verdict (the report's, the looks', the power table's) reads this split."""
        if self.heldout is not None:
            return Scored(HELDOUT, self.heldout, (self.heldout_baselines or Baselines()).recorded)
        return Scored("dev", self.final, self.baselines.recorded)

    @property
    def tune_score(self) -> float:
        """The tuning-split score at the selected epoch (`train.holdout`); NaN for a failed run or one that recorded
        none (neither can be selected)."""
        return self.tune.score if self.ok and self.tune is not None else math.nan

    @property
    def gap(self) -> float:
        """Train-subset minus dev score (the generalisation gap), from the last epoch where it was not recorded."""
        gap = num(self.generalisation_gap)
        if math.isnan(gap) and self.history:
            gap = self.history[-1].train_subset_score - self.history[-1].dev_score
        return gap

    @property
    def env(self) -> Environment:
        return Environment.of(self.environment)

    @property
    def drop_rates(self) -> tuple | None:
        """The method's final drop rate per layer, where it logged one."""
        rates = self.method_record.get("drop_rate_per_layer")
        return tuple(rates) if isinstance(rates, list) else None

    @property
    def attempts(self) -> int:
        """How many times an executor started the run (1 unless it was retried)."""
        return self.executor.attempts or 1

    @property
    def oom_retried(self) -> bool:
        """Whether the run was started again after an out-of-memory error."""
        return bool(self.executor.oom_retries)

    def note_executor(self, **facts: Any) -> None:
        """What the executor adds to the record (`outputs_returned`, `oom_retries`, ...)."""
        self.executor = Executor.from_json({**self.executor.to_json(), **facts}, "executor")

    def ran_by(self, facts: dict[str, Any]) -> None:
        """The executor that ran the run (`executor_info`), its facts before those the run noted itself."""
        self.executor = Executor.from_json({**facts, **self.executor.to_json()}, "executor")

    def artifact_files(self, source: str = "") -> dict[str, Any]:
        """The files the run left beside its record ({} when none); InvalidRecord when `artifacts` holds something
        else than file names (edited by hand)."""
        found = self.artifacts
        if found is None:
            return {}
        if found.unreadable is not None:
            raise InvalidRecord(f"{source or self.label}: artifacts is not the object of file names a run record "
                                f"holds (a JSON {type(found.unreadable).__name__}; edited by hand?)")
        return found.to_json()

    @property
    def saved_model(self) -> str | None:
        """The folder (beside the record) of the model the run kept (`--save-model`); None when it kept none."""
        return (self.artifacts.model if self.artifacts is not None else None) or None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the keys in the order read (a record built by the runner: its fields in order, those that
        are None left out), unknown ones kept."""
        return json_fields(self, defaults=True)

    @classmethod
    def from_dict(cls, d: Any, source: str = "") -> "RunRecord":
        where = f"{source}: " if source else ""
        if not isinstance(d, dict):
            raise InvalidRecord(f"{where}not a run record (a JSON {type(d).__name__}, expected an object)")
        missing = [k for k in ("config", "hash", "label", "status") if k not in d]
        if missing:
            raise InvalidRecord(f"{where}not a run record: missing {', '.join(missing)}")
        if d["status"] not in STATUSES:
            raise InvalidRecord(f"{where}status {d['status']!r} is not one of {', '.join(STATUSES)}")
        if not isinstance(d["config"], dict) or not {"task", "method", "seed"} <= set(d["config"]):
            raise InvalidRecord(f"{where}config lacks task, method or seed")
        version = d.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_VERSION:
            # before its parts are read: a newer suite's parts may be typed otherwise, and its record must be kept
            raise NewerRecord(f"{where}record version {version} is newer than this suite reads "
                              f"({RECORD_VERSION}): upgrade the suite")
        try:
            rec = cls(**read_fields(cls, d, ""))
        except PartError as exc:
            raise InvalidRecord(f"{where}{exc}") from None
        if rec.ok:
            if "score" not in rec.final.values or not rec.history:
                raise InvalidRecord(f"{where}an ok record without final metrics or history")
            if not _finite(d["final"]["score"]):
                raise InvalidRecord(f"{where}an ok record whose final score is {d['final']['score']!r}")
            if rec.heldout is not None and not _finite(rec.heldout.values.get("score")):
                raise InvalidRecord(f"{where}an ok record whose held-out test score (heldout.score) is not a number")
        return rec

    @classmethod
    def started_now(cls, job: "RunConfig", environment: dict[str, Any] | None = None) -> "RunRecord":
        return cls(config=job.to_dict(), hash=job.hash, label=job.label, status="failed",
                   environment=environment or {}, started=_now(), version=RECORD_VERSION)

    @classmethod
    def failed(cls, job: "RunConfig", error: str, wall_s: float = 0.0, traceback: str | None = None,
               environment: dict[str, Any] | None = None) -> "RunRecord":
        rec = cls.started_now(job, environment)
        rec.error, rec.traceback, rec.wall_s, rec.finished = error, traceback, wall_s, _now()
        return rec


@dataclasses.dataclass(frozen=True)
class Scored:
    """The split a run is scored on: its name, metrics, learn-nothing baselines and how its predictions are read."""
    name: str                           # "heldout" (train.test_holdout) or "dev"
    metrics: Metrics
    baseline: RecordedBaseline | None

    def predictions(self, sidecar: str | Path) -> str:
        """What the example-level statistics load this split's predictions by, from the run's sidecar."""
        return heldout_predictions(sidecar) if self.name == HELDOUT else str(sidecar)


def read_record(path: str | Path, name: str | None = None, unscored: bool = False) -> RunRecord:
    """The one reader of a record file: InvalidRecord (naming the file, as `name` or else its path, and why) for
    anything that is not a run record; OSError as reading raised it (absent, unreadable: each caller says what that
    means to it).

    A finished run without a finite dev score (a correlation of constant predictions is undefined; the runner no
    longer writes one, it fails such a run) is no record to a grid, which runs the job again; with `unscored` (the
    report) it stays a finished run, shown as "no score" and counted as collapsed."""
    path = Path(path)
    source = str(path) if name is None else name
    try:
        data = read_json(path)
    except PartError as exc:
        raise InvalidRecord(f"{source}: {exc}") from None
    except RecursionError:  # JSON nested deeper than Python's recursion limit
        raise InvalidRecord(f"{source}: not a run record (JSON nested too deeply)") from None
    _check_config(data, source)
    try:
        final = data.get("final") if isinstance(data, dict) and data.get("status") == "ok" else None
        if unscored and isinstance(final, dict) and "score" in final and math.isnan(num(final["score"])):
            rec = RunRecord.from_dict({**data, "final": {**final, "score": 0.0}}, source)
            rec.final = Metrics.from_json(final, "final")
        else:
            rec = RunRecord.from_dict(data, source)
    except InvalidRecord:
        raise
    except (TypeError, AttributeError, ValueError, KeyError, OverflowError) as exc:  # a shape the types miss
        raise InvalidRecord(f"{source}: not a run record ({type(exc).__name__}: {exc})") from None
    _check_own_hash(rec, source)
    return rec


def _check_own_hash(rec: RunRecord, source: str) -> None:
    """The record's config is the job its hash names (`RunConfig.recorded_hashes`): a config edited by hand (a task
    renamed, a setting changed) or a hash pasted from another record is no record of either job."""
    from suite.run.settings import RunConfig

    try:
        found = RunConfig.from_dict(rec.config).recorded_hashes(rec.train)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a config no job of this suite has
        raise InvalidRecord(f"{source}: its config is not a job this suite can rebuild ({type(exc).__name__}: "
                            f"{exc}), so its hash cannot be checked (edited by hand?)") from None
    if rec.hash not in found:
        raise InvalidRecord(f"{source}: its config ({rec.task}/{rec.method}/seed{rec.seed}) hashes to {found[0]}, "
                            f"not to the hash it holds ({rec.hash}): edited by hand, or its method's hash rules are "
                            "not this suite's (a plugin not installed?); restore the record, or move it away")


# The JSON types of the job's settings that readers group runs by (the config is the RunConfig's, kept as read).
CONFIG_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": (str, type(None)), "task": str, "method": str, "seed": (int, type(None)), "hparams": (dict, type(None)),
    "train": (dict, type(None))}


def _check_config(data: Any, source: str) -> None:
    """The job's settings have the types readers read, and the names runs are grouped by are names: model, task and
    method non-empty text."""
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return  # RunRecord.from_dict names what is missing
    for key, types in CONFIG_TYPES.items():
        value = config.get(key)
        if key in config and (isinstance(value, bool) or not isinstance(value, types)):
            raise InvalidRecord(f"{source}: {wrong_type(f'config.{key}', value)}")
    for key in ("model", "task", "method"):
        value = config.get(key)
        if value is not None and not value.strip():
            raise InvalidRecord(f"{source}: config.{key} is {value!r}, not a name (edited by hand?)")


def record_files(folder: str | Path) -> list[Path]:
    """The record files of a runs folder: `*.json` (hidden names too, as glob matched them) without leftover
    temporary files of interrupted writes; none where the folder is missing or unreadable."""
    try:
        # scandir, not glob: glob tests a missing folder without an audited read, so a kept answer
        # (suite.api.startup_cache) would never see the folder appear
        with os.scandir(folder) as entries:
            names = [e.name for e in entries]
    except OSError:
        return []
    paths = (Path(folder) / n for n in names if n.endswith(".json"))
    return sorted(p for p in paths if not p.name.startswith(TMP_PREFIX) and not set_aside(p))


REFUSED = ".refused-"  # NAME.refused-N.json: a file the reader refused, set aside before a rerun replaced it


def set_aside(path: Path) -> bool:
    """Whether a file is one the store set aside (never a record again until renamed back by hand)."""
    stem = path.name[:-len(".json")] if path.name.endswith(".json") else path.name
    head, found, count = stem.rpartition(REFUSED)
    return bool(found) and count.isdigit()


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ---------------------------------------------------------------------------------------------------------
# Per-example predictions (sidecar)
# ---------------------------------------------------------------------------------------------------------

def predictions_filename(record_filename: str) -> str:
    """'rte__vanilla__seed1__minilm__abc.json' -> 'rte__vanilla__seed1__minilm__abc.predictions.npz'."""
    return record_filename[:-len(".json")] + ".predictions.npz" if record_filename.endswith(".json") \
        else record_filename + ".predictions.npz"


def save_predictions(file, predictions: dict[str, dict[str, np.ndarray]]) -> None:
    """Arrays per eval split suffix ('' for the single dev set): index (row in the dev file), label, logits.
    `file` is a path or a binary file object."""
    import numpy as np

    flat = {f"{suffix or 'dev'}/{name}": np.asarray(a) for suffix, arrays in predictions.items()
            for name, a in arrays.items()}
    np.savez_compressed(file, **flat)


def load_predictions(path: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """The inverse of `save_predictions`: {suffix: {"index", "label", "logits"}} ('' is the single dev set), the dev
    sets only. `PATH#heldout` (`heldout_predictions`): the held-out test split's, as {'': ...}, read as a dev set's
    (its index: rows of the train split)."""
    import numpy as np

    path, held = _selected(path)
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path) as data:
        for key in data.files:
            split, name = key.split("/", 1)
            if (split == HELDOUT) == held:
                out.setdefault("" if split in ("dev", HELDOUT) else split, {})[name] = data[key]
    if held and not out:
        raise KeyError(f"{path}: no held-out test predictions")
    return out


def heldout_predictions(sidecar: str | Path) -> str:
    """The name `load_predictions` reads a sidecar's held-out test predictions by."""
    return f"{sidecar}#{HELDOUT}"


def _selected(path: str | Path) -> tuple[str | Path, bool]:
    """(the file, whether the held-out test split's predictions are asked for)."""
    text = str(path)
    if text.endswith(f".npz#{HELDOUT}"):
        return text[:-len(HELDOUT) - 1], True
    return path, False
