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
split (`train.test_holdout`) keeps its predictions there too, under HELDOUT; `load_predictions(path)` gives the dev
sets' and `load_predictions(path + "#heldout")` the held-out split's, each as a run's predictions on one dev set.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suite.run.record_parts import (
    Analyses,
    AttentionStats,
    DataSizes,
    Environment,
    Epoch,
    Metrics,
    Parameters,
    RecordedBaseline,
    Timing,
    nested_type_problem,
    num,
)

# what the rest of the suite uses; other names are this module's own
__all__ = ["HELDOUT", "InvalidRecord", "NewerRecord", "RECORD_VERSION", "RunRecord", "TMP_PREFIX",
           "heldout_predictions", "load_predictions", "predictions_filename", "read_record", "record_files",
           "save_predictions", "with_artifacts"]

if TYPE_CHECKING:
    import numpy as np  # imported where used: dry runs read records without it

    from suite.run.settings import RunConfig

RECORD_VERSION = 2
STATUSES = ("ok", "failed")
HELDOUT = "heldout"  # the held-out test split's group in the predictions sidecar (never a dev set's suffix)
TMP_PREFIX = ".tmp-"  # the store writes through such files and renames them: never a record


class InvalidRecord(ValueError):
    """A file in a runs folder that is not a valid run record; the message names the file and the problem."""


class NewerRecord(InvalidRecord):
    """A record written by a newer suite: valid there, unreadable here. It must be kept, never replaced."""


@dataclasses.dataclass
class RunRecord:
    config: dict[str, Any]
    hash: str
    label: str
    status: str                                        # "ok" or "failed"
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    started: str | None = None
    finished: str | None = None
    wall_s: float | None = None
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)   # one entry per epoch
    final: dict[str, Any] = dataclasses.field(default_factory=dict)           # dev metrics at the last epoch
    best: dict[str, Any] = dataclasses.field(default_factory=dict)            # best epoch by dev score (reference)
    tune: dict[str, Any] | None = None          # tuning-split metrics at the selected epoch (train.holdout), beside dev
    heldout: dict[str, Any] | None = None       # held-out test split's metrics (train.test_holdout) of the final model
    heldout_baselines: dict[str, Any] | None = None  # majority / constant / chance scores on the held-out test split
    generalisation_gap: float | None = None
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)            # split sizes actually used
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)      # total, extra, training_only
    attention: dict[str, Any] | None = None                                   # attention statistics
    method_record: dict[str, Any] = dataclasses.field(default_factory=dict)
    baselines: dict[str, Any] = dataclasses.field(default_factory=dict)       # majority / constant / chance scores
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)      # distributions behind method and task
    predictions: str | None = None                                            # sidecar file name
    analyses: dict[str, Any] | None = None
    artifacts: dict[str, Any] | None = None   # files the run left beside its record (saved model, test predictions)
    executor: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None
    version: int = 1
    # per-example dev predictions {suffix: {"index", "label", "logits"}}, kept in memory until the store writes
    # them to the sidecar file named by `predictions`; never part of the JSON
    prediction_arrays: dict[str, dict[str, np.ndarray]] | None = dataclasses.field(default=None, repr=False,
                                                                                     compare=False)

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

    # --- what it measured ------------------------------------------------------------------------------------
    @property
    def dev(self) -> Metrics:
        """Dev metrics at the selected epoch (none for a failed run)."""
        return Metrics.of(self.final)

    @property
    def best_dev(self) -> Metrics:
        return Metrics.of(self.best)

    @property
    def dev_baseline(self) -> RecordedBaseline | None:
        """The dev set's learn-nothing scores the runner recorded (the most frequent class, or the mean label)."""
        return RecordedBaseline.of(self.baselines)

    @property
    def scored(self) -> "Scored":
        """The split the run is scored on: its held-out test split when it kept one (`train.test_holdout`), else
        dev. Every verdict (the report's, the looks', the power table's) reads this split."""
        if isinstance(self.heldout, dict):
            return Scored(HELDOUT, Metrics.of(self.heldout), RecordedBaseline.of(self.heldout_baselines))
        return Scored("dev", Metrics.of(self.final), RecordedBaseline.of(self.baselines))

    @property
    def tune_score(self) -> float:
        """The tuning-split score at the selected epoch (`train.holdout`); NaN for a failed run or one that recorded
        none (neither can be selected)."""
        score = self.tune.get("score") if isinstance(self.tune, dict) else None
        return float(score) if self.ok and _finite(score) else math.nan

    @property
    def gap(self) -> float:
        """Train-subset minus dev score (the generalisation gap), from the last epoch where it was not recorded."""
        gap = num(self.generalisation_gap)
        if math.isnan(gap) and self.history:
            last = Epoch.of(self.history[-1])
            gap = last.train_subset_score - last.dev_score
        return gap

    @property
    def epochs(self) -> tuple[Epoch, ...]:
        return tuple(map(Epoch.of, self.history or ()))

    @property
    def attention_stats(self) -> AttentionStats | None:
        return AttentionStats.of(self.attention)

    @property
    def analysis_results(self) -> Analyses | None:
        return Analyses.of(self.analyses)

    @property
    def env(self) -> Environment:
        return Environment.of(self.environment)

    @property
    def sizes(self) -> DataSizes:
        return DataSizes.of(self.data)

    @property
    def timed(self) -> Timing:
        return Timing.of(self.timing)

    @property
    def parameter_counts(self) -> Parameters:
        return Parameters.of(self.parameters)

    @property
    def drop_rates(self) -> tuple | None:
        """The method's final drop rate per layer, where it logged one."""
        rates = (self.method_record or {}).get("drop_rate_per_layer")
        return tuple(rates) if isinstance(rates, list) else None

    @property
    def attempts(self) -> int:
        """How many times an executor started the run (1 unless it was retried)."""
        return int((self.executor or {}).get("attempts") or 1)

    @property
    def oom_retried(self) -> bool:
        """Whether the run was started again after an out-of-memory error."""
        return bool((self.executor or {}).get("oom_retries"))

    def note_executor(self, **facts: Any) -> None:
        """What the executor adds to the record (`outputs_returned`, `oom_retries`, ...)."""
        self.executor = {**(self.executor or {}), **facts}

    def artifact_files(self, source: str = "") -> dict[str, Any]:
        """The files the run left beside its record ({} when none); InvalidRecord when `artifacts` holds something
        else than file names (edited by hand)."""
        found = self.artifacts
        if found is None:
            return {}
        if not isinstance(found, dict) or not all(isinstance(v, (str, dict, list)) for v in found.values()):
            raise InvalidRecord(f"{source or self.label}: artifacts is not the object of file names a run record "
                                f"holds (a JSON {type(found).__name__}; edited by hand?)")
        return dict(found)

    @property
    def saved_model(self) -> str | None:
        """The folder (beside the record) of the model the run kept (`--save-model`); None when it kept none."""
        model = self.artifacts.get("model") if isinstance(self.artifacts, dict) else None
        return model if isinstance(model, str) and model else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; optional fields that are None are left out."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and f.name != "prediction_arrays"}

    @classmethod
    def from_dict(cls, d: Any, source: str = "") -> "RunRecord":
        where = f"{source}: " if source else ""
        if not isinstance(d, dict):
            raise InvalidRecord(f"{where}not a run record (a JSON {type(d).__name__}, expected an object)")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [k for k in ("config", "hash", "label", "status") if k not in d]
        if missing:
            raise InvalidRecord(f"{where}not a run record: missing {', '.join(missing)}")
        if d["status"] not in STATUSES:
            raise InvalidRecord(f"{where}status {d['status']!r} is not one of {', '.join(STATUSES)}")
        if not isinstance(d["config"], dict) or not {"task", "method", "seed"} <= set(d["config"]):
            raise InvalidRecord(f"{where}config lacks task, method or seed")
        if d["status"] == "ok":
            if not isinstance(d.get("final"), dict) or "score" not in d["final"] or not d.get("history"):
                raise InvalidRecord(f"{where}an ok record without final metrics or history")
            if not _finite(d["final"].get("score")):
                raise InvalidRecord(f"{where}an ok record whose final score is {d['final'].get('score')!r}")
            if d.get("heldout") is not None and not (isinstance(d["heldout"], dict)
                                                     and _finite(d["heldout"].get("score"))):
                raise InvalidRecord(f"{where}an ok record whose held-out test score is not a number")
        rec = cls(**{k: v for k, v in d.items() if k in names - {"prediction_arrays"}})
        if rec.version > RECORD_VERSION:
            raise NewerRecord(f"{where}record version {rec.version} is newer than this suite reads "
                                f"({RECORD_VERSION}): upgrade the suite")
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
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRecord(f"{source}: not JSON ({exc})") from None
    except RecursionError:  # JSON nested deeper than Python's recursion limit
        raise InvalidRecord(f"{source}: not a run record (JSON nested too deeply)") from None
    if (problem := nested_type_problem(data)) is not None:
        raise InvalidRecord(f"{source}: {problem}")
    _check_names(data, source)
    try:
        final = data.get("final") if isinstance(data, dict) and data.get("status") == "ok" else None
        if unscored and isinstance(final, dict) and "score" in final and math.isnan(num(final["score"])):
            rec = RunRecord.from_dict({**data, "final": {**final, "score": 0.0}}, source)
            rec.final = final
            return rec
        return RunRecord.from_dict(data, source)
    except InvalidRecord:
        raise
    except (TypeError, AttributeError, ValueError, KeyError) as exc:  # a shape NESTED_TYPES does not cover
        raise InvalidRecord(f"{source}: not a run record ({type(exc).__name__}: {exc})") from None


def _check_names(data: Any, source: str) -> None:
    """The names runs are grouped by are names: model, task and method non-empty text."""
    config = data.get("config") if isinstance(data, dict) else None
    for key in ("model", "task", "method"):
        value = config.get(key) if isinstance(config, dict) else None
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidRecord(f"{source}: config.{key} is {value!r}, not a name (edited by hand?)")


def record_files(folder: str | Path) -> list[Path]:
    """The record files of a runs folder: `*.json` without leftover temporary files of interrupted writes."""
    return sorted(p for p in Path(folder).glob("*.json") if not p.name.startswith(TMP_PREFIX))


def with_artifacts(path: str | Path, rec: RunRecord, artifacts: dict[str, Any]) -> dict[str, Any]:
    """The JSON of the record file at `path` (read as `rec`) with `artifacts` added to its own, every other field
    (unknown ones included) as read: what the store writes back when a finished run gains files (test predictions
    from its saved model)."""
    data = json.loads(Path(path).read_text())
    data["artifacts"] = {**rec.artifact_files(str(path)), **artifacts}
    return data


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
