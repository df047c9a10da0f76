"""The run record: what one finished (or failed) run leaves behind, as a typed object with a version.

Every writer (the runner, the failed-record path of the executors) builds a `RunRecord`; every reader (the grid's
resume check, the status display, the report) parses JSON through `RunRecord.from_dict`, which validates it and
names the file when it is not a record. Version 1 records (written before the version field existed) load as they
are: every field added since has a default.

Per-example dev predictions live in a sidecar `.npz` next to the record (`predictions` names it), so that the
record stays small and readable while statistics can still work at the example level. A run with a held-out test
split (`train.test_holdout`) keeps its predictions there too, under HELDOUT; `load_predictions(path)` gives the dev
sets' and `load_predictions(path + "#heldout")` the held-out split's, each as a run's predictions on one dev set.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

# what the rest of the suite uses; other names are this module's own
__all__ = ["HELDOUT", "InvalidRecord", "NewerRecord", "RECORD_VERSION", "RunRecord", "check_nested_types",
           "heldout_predictions", "load_predictions", "predictions_filename", "save_predictions"]

if TYPE_CHECKING:
    import numpy as np  # imported where used: dry runs read records without it

    from suite.run.settings import RunConfig

RECORD_VERSION = 2
STATUSES = ("ok", "failed")
HELDOUT = "heldout"  # the held-out test split's group in the predictions sidecar (never a dev set's suffix)


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


NUMBER = (int, float, type(None))
OPTIONAL_DICT = (dict, type(None))
OPTIONAL_STR = (str, type(None))
# The types of the record's parts the report reads ("[]": each item of a list, "*": each value of a dict): a
# hand-edited record with another type there is named and skipped instead of crashing a section of the report.
NESTED_TYPES: dict[str, type | tuple[type, ...]] = {
    "config.model": OPTIONAL_STR, "config.task": str, "config.method": str, "config.seed": (int, type(None)),
    "config.hparams": OPTIONAL_DICT, "config.train": OPTIONAL_DICT, "label": str, "hash": str,
    "environment": OPTIONAL_DICT, "history": (list, type(None)), "history[]": dict,
    "history[].dev": OPTIONAL_DICT, "history[].train_subset": OPTIONAL_DICT, "history[].method": OPTIONAL_DICT,
    "final": OPTIONAL_DICT, "final.score": NUMBER, "best": OPTIONAL_DICT, "timing": OPTIONAL_DICT,
    "timing.step_s": NUMBER, "timing.peak_memory_mb": NUMBER, "timing.step_mode": OPTIONAL_DICT,
    "parameters": OPTIONAL_DICT, "parameters.*": NUMBER,
    "data": OPTIONAL_DICT, "attention": OPTIONAL_DICT, "attention.mean": OPTIONAL_DICT,
    "attention.per_layer": OPTIONAL_DICT, "analyses": OPTIONAL_DICT, "method_record": OPTIONAL_DICT,
    "baselines": OPTIONAL_DICT, "heldout": OPTIONAL_DICT, "heldout.score": NUMBER, "heldout_baselines": OPTIONAL_DICT,
    "predictions": OPTIONAL_STR, "started": OPTIONAL_STR, "finished": OPTIONAL_STR,
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
    """InvalidRecord naming the first part of `data` whose JSON type is not NESTED_TYPES' (a hand-edited record)."""
    for path, types in NESTED_TYPES.items():
        for where, value in _values(data, path):
            if not _is(value, types):
                raise InvalidRecord(f"{source}: {where} is a JSON {type(value).__name__}, not what a run record "
                                    "holds there (edited by hand?)")
