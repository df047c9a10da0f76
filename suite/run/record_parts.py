"""The run record's parts, typed to their leaves: what `RunRecord`'s accessors (suite.run.record) return.

The record's JSON keeps its parts as objects (the runner writes them so and old records stay readable); each class
here reads one part into frozen fields, with NaN for a number that is absent or not finite, so that no reader indexes
the JSON itself.
"""
from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Any, Mapping

# what the rest of the suite uses; other names are this module's own
__all__ = ["Analyses", "AttentionStats", "DataSizes", "Environment", "Epoch", "Metrics", "Parameters",
           "RecordedBaseline", "Timing", "nested_type_problem", "num"]

CONSTANT_KINDS = ("majority", "constant_mean")   # the constant predictor: most frequent class, or the mean label


def num(x: Any) -> float:
    """A finite float, or NaN for anything else (None, strings, inf)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _part(value: Any) -> Mapping[str, Any]:
    """A part of the record as recorded: an object, or nothing."""
    return value if isinstance(value, dict) else {}


def _layers(values: Any) -> tuple | None:
    """A value per layer as recorded (a JSON list), as a tuple; None for anything else."""
    return tuple(values) if isinstance(values, list) else None


@dataclasses.dataclass(frozen=True)
class Metrics:
    """Metrics of one split (name -> value; "score": the headline); none for a run that failed."""
    values: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, metrics: Any) -> "Metrics":
        return cls(MappingProxyType({k: num(v) for k, v in _part(metrics).items()}))

    def get(self, name: str) -> float:
        return self.values.get(name, math.nan)

    @property
    def score(self) -> float:
        return self.get("score")

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
    def of(cls, e: Any) -> "Epoch":
        e = _part(e)
        return cls(e.get("epoch"), num(e.get("train_loss")), num(e.get("dev_loss")),
                   num(_part(e.get("dev")).get("score")), num(_part(e.get("train_subset")).get("score")),
                   _layers(_part(e.get("method")).get("drop_rate_per_layer")))


@dataclasses.dataclass(frozen=True)
class AttentionStats:
    """The attention statistics a run recorded on dev batches (suite/run/attention_stats.py)."""
    mean: Mapping[str, float]                # statistic -> mean over layers
    per_layer: Mapping[str, tuple | None]    # statistic -> its value per layer

    @classmethod
    def of(cls, attention: Any) -> "AttentionStats | None":
        if not isinstance(attention, dict):
            return None
        return cls(MappingProxyType({k: num(v) for k, v in _part(attention.get("mean")).items()}),
                   MappingProxyType({k: _layers(v) for k, v in _part(attention.get("per_layer")).items()}))


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
    """Where and with which code a run ran, as the report's header names it ("?", or "unknown" for the commit: not
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
    def of(cls, env: Any) -> "Environment":
        env = _part(env)

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
    def of(cls, data: Any) -> "DataSizes":
        data = _part(data)
        return cls(data.get("train"), data.get("train_subset"), tuple(sorted(_part(data.get("dev")).items())),
                   data.get("heldout"))


@dataclasses.dataclass(frozen=True)
class RecordedBaseline:
    """The scores (in [0, 1]; NaN: not a number) of the predictors that learn nothing, as the runner recorded them."""
    constant_kind: str     # "majority" or "constant_mean"
    constant: float
    chance: float

    @classmethod
    def of(cls, found: Any) -> "RecordedBaseline | None":
        found = _part(found)
        kind = next((k for k in CONSTANT_KINDS if isinstance(found.get(k), dict)), None)
        if kind is None:
            return None
        return cls(kind, num(found[kind].get("score")), num(_part(found.get("chance")).get("score")))


@dataclasses.dataclass(frozen=True)
class Timing:
    """How long a run's steps took and the memory it peaked at (NaN: not recorded)."""
    step_s: float
    peak_mb: float
    peak_kind: str | None
    step_mode: str            # "captured" (replayed CUDA graphs) or "eager"
    steps: int | None = None  # optimizer steps taken

    @classmethod
    def of(cls, timing: Any) -> "Timing":
        timing = _part(timing)
        steps = timing.get("steps")
        return cls(num(timing.get("step_s")), num(timing.get("peak_memory_mb")), timing.get("peak_memory_kind"),
                   str(_part(timing.get("step_mode")).get("mode") or "eager"),
                   steps if isinstance(steps, int) and not isinstance(steps, bool) else None)


@dataclasses.dataclass(frozen=True)
class Parameters:
    """The model's parameter counts: in all, added by the method, used only in training (NaN: not recorded)."""
    total: float
    extra: float
    training_only: float

    @classmethod
    def of(cls, parameters: Any) -> "Parameters":
        parameters = _part(parameters)
        return cls(num(parameters.get("total")), num(parameters.get("extra")), num(parameters.get("training_only")))


NUMBER = (int, float, type(None))
OPTIONAL_DICT = (dict, type(None))
OPTIONAL_STR = (str, type(None))
# The JSON types of the record's parts that readers read ("[]": each item of a list, "*": each value of a dict): a
# hand-edited record with another type there is no record (the report names and skips it, a grid reruns its job)
# instead of crashing whatever reads that part.
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


def nested_type_problem(data: Any) -> str | None:
    """The first part of a record's JSON `data` whose type is not NESTED_TYPES' (a hand-edited record), or None."""
    for path, types in NESTED_TYPES.items():
        for where, value in _values(data, path):
            if not _is(value, types):
                return f"{where} is a JSON {type(value).__name__}, not what a run record holds there (edited by hand?)"
    return None
