"""The run record's parts, typed to their leaves: the types of `RunRecord`'s fields (suite.run.record).

Each part is a frozen dataclass read from the record's JSON and written back by `suite.run.record_codec` (the keys in
their order, the ones the suite does not define kept): a number the run did not record is NaN (the writer's null),
an absent part its empty default, so no reader indexes the JSON itself. Where a part's keys are not the suite's to
name (a task's metrics, a method's own facts), it is a mapping.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from suite.run.record_codec import Part, PartError, json_value, wrong_type

# what the rest of the suite uses; other names are this module's own
__all__ = ["Analyses", "Artifacts", "AttentionStats", "Baselines", "Best", "DataSizes", "Environment", "Epoch",
           "Executor", "Metrics", "Parameters", "RecordedBaseline", "Timing", "num"]

NAN = math.nan
CONSTANT_KINDS = ("majority", "constant_mean")   # the constant predictor: most frequent class, or the mean label


def num(x: Any) -> float:
    """A finite float, or NaN for anything else (None, strings, inf)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


@dataclasses.dataclass(frozen=True)
class Metrics:
    """Metrics of one split (the task's metric names -> value; "score": the headline); none for a run that failed."""
    values: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> "Metrics":
        if not isinstance(data, dict):
            raise PartError(wrong_type(where, data))
        for k, v in data.items():
            if not (v is None or isinstance(v, (int, float)) and not isinstance(v, bool)):
                raise PartError(wrong_type(f"{where}.{k}", v))
        return cls({k: NAN if v is None else v for k, v in data.items()})

    def to_json(self) -> dict[str, Any]:
        return {k: json_value(v) for k, v in self.values.items()}

    def get(self, name: str) -> float:
        return num(self.values.get(name, NAN))

    @property
    def score(self) -> float:
        return self.get("score")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.values)


@dataclasses.dataclass(frozen=True)
class Best(Metrics):
    """Dev metrics at the best epoch by dev score (a reference, never what a run is scored by), with that epoch."""

    @classmethod
    def at(cls, epoch: "Epoch") -> "Best":
        return cls({**epoch.dev.values, "epoch": epoch.epoch})

    @property
    def epoch(self) -> int | None:
        found = self.values.get("epoch")
        return int(found) if math.isfinite(num(found)) else None


@dataclasses.dataclass(frozen=True)
class Epoch(Part):
    """One epoch of a run's history: losses, scores (headline in [0, 1]; NaN: not recorded), time."""
    epoch: int | None = None
    train_loss: float = NAN
    dev_loss: float = NAN
    dev: Metrics = dataclasses.field(default_factory=Metrics)
    train_subset_loss: float = NAN
    train_subset: Metrics = dataclasses.field(default_factory=Metrics)
    epoch_time_s: float = NAN
    train_samples_per_s: float = NAN
    tune_loss: float = NAN
    tune: Metrics | None = None                  # the tuning split (train.holdout); None: the run kept none
    method: Mapping[str, Any] | None = None      # the method's own facts at this epoch (its keys are the method's)

    @property
    def dev_score(self) -> float:
        return self.dev.score

    @property
    def train_subset_score(self) -> float:
        return self.train_subset.score

    @property
    def drop_rates(self) -> tuple | None:
        """The method's drop rate per layer at this epoch, where it logged one."""
        rates = (self.method or {}).get("drop_rate_per_layer")
        return tuple(rates) if isinstance(rates, list) else None


@dataclasses.dataclass(frozen=True)
class AttentionStats(Part):
    """The attention statistics a run recorded on dev batches (suite/run/attention_stats.py), by statistic name."""
    batches: int | None = None
    layers: int | None = None
    per_layer: Mapping[str, tuple[float | None, ...] | None] = dataclasses.field(default_factory=dict)
    mean: Mapping[str, float] = dataclasses.field(default_factory=dict)   # over layers


@dataclasses.dataclass(frozen=True)
class Analyses:
    """A run's end-of-run analyses (suite/run/analyses), each one's part as the analysis wrote it: their keys are the
    analyses' own (plugins add analyses)."""
    parts: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> "Analyses":
        if not isinstance(data, dict):
            raise PartError(wrong_type(where, data))
        return cls(dict(data))

    def to_json(self) -> dict[str, Any]:
        return dict(self.parts)

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
    omp_wait_policy: str  # how idle CPU threads waited (PASSIVE, ACTIVE, default); "?": a record from before it
    cpu: str = "?"        # the CPU's model name; "?": a record from before it
    cpu_bf16: str = "?"   # "True" where the CPU computes bf16 products in hardware (AVX512-BF16 or AMX)

    @property
    def cpu_text(self) -> str:
        """The CPU as a report names it: its model, and whether it computes bf16 in hardware ("": not recorded)."""
        bf16 = {"True": ", bf16 in hardware", "False": ", bf16 emulated"}.get(self.cpu_bf16, "")
        return f"{self.cpu}{bf16}" if self.cpu != "?" else ""

    @classmethod
    def of(cls, env: Mapping[str, Any]) -> "Environment":
        def text(key: str) -> str:
            return str(env.get(key, "?"))
        return cls(text("device"), str(env.get("gpu") or ""), text("platform"), text("cpu_threads"), text("host"),
                   text("suite"), str(env.get("git_commit") or "unknown"), text("python"), text("torch"),
                   text("transformers"), text("omp_wait_policy"), text("cpu"), text("cpu_bf16"))


@dataclasses.dataclass(frozen=True)
class Draw(Part):
    """How the run's rows were drawn from the train split (suite.run.draws.Draw.facts)."""
    subset_draw: str | None = None
    data_seed: int | None = None
    train_rows: int | None = None
    train_rows_sha: str | None = None
    holdout_seed: int | None = None
    tune_rows: int | None = None
    tune_rows_sha: str | None = None
    heldout_seed: int | None = None
    heldout_rows: int | None = None
    heldout_rows_sha: str | None = None
    carve: str | None = None
    heldout_groups: int | None = None         # the held-out rows' sources (sentence groups; rows carved alone: rows)
    heldout_median_words: float | None = None  # words of its median row
    dev_median_words: float | None = None      # and of dev's, which a held-out score is not comparable to


@dataclasses.dataclass(frozen=True)
class DataSizes(Part):
    """The split sizes a run used (None: not recorded)."""
    train: int | None = None
    dev: Mapping[str, int] = dataclasses.field(default_factory=dict)   # dev split name -> examples, in order
    train_subset: int | None = None       # the fixed train subset the generalisation gap is measured on
    draw: Draw | None = None
    tune: int | None = None               # the tuning split (train.holdout; None: none)
    heldout: int | None = None            # the held-out test split (train.test_holdout; None: none)


@dataclasses.dataclass(frozen=True)
class RecordedBaseline:
    """The scores (in [0, 1]; NaN: not a number) of the predictors that learn nothing, as the runner recorded them."""
    constant_kind: str     # "majority" or "constant_mean"
    constant: float
    chance: float


@dataclasses.dataclass(frozen=True)
class Baselines(Part):
    """A split's learn-nothing scores: the constant predictor (most frequent class, or the mean label) and chance."""
    majority: Metrics | None = None
    constant_mean: Metrics | None = None
    chance: Metrics | None = None

    @property
    def recorded(self) -> RecordedBaseline | None:
        kind = next((k for k in CONSTANT_KINDS if getattr(self, k) is not None), None)
        if kind is None:
            return None
        return RecordedBaseline(kind, getattr(self, kind).score, (self.chance or Metrics()).score)


@dataclasses.dataclass(frozen=True)
class StepMode(Part):
    """How a run's training steps ran (suite.run.capture): replayed CUDA graphs, or eagerly and why."""
    mode: str | None = None          # "captured" or "eager"
    reason: str | None = None        # why eager
    graphs: int | None = None
    eager_steps: int | None = None
    replays: int | None = None
    capture_s: float = NAN
    graph_pool_mb: float = NAN       # what the graphs' one memory pool grew by while capturing (CUDA)


@dataclasses.dataclass(frozen=True)
class Timing(Part):
    """How long a run's steps took and the memory it peaked at (NaN: not recorded)."""
    train_s: float = NAN
    eval_s: float = NAN
    steps: int | None = None          # optimizer steps taken
    step_s: float = NAN
    train_samples_per_s: float = NAN
    peak_memory_mb: float = NAN
    peak_memory_kind: str | None = None
    peak_reserved_mb: float = NAN     # CUDA: the most memory the process held, graphs' pool and cache included
    precision: str | None = None
    step_mode: StepMode | None = None   # recorded since step capture existed; before it every step was eager

    @property
    def mode(self) -> str:
        """"captured" (replayed CUDA graphs) or "eager"."""
        return (self.step_mode.mode if self.step_mode is not None else None) or "eager"


@dataclasses.dataclass(frozen=True)
class Parameters(Part):
    """The model's parameter counts: in all, added by the method, used only in training (NaN: not recorded)."""
    total: float = NAN
    extra: float = NAN
    training_only: float = NAN


@dataclasses.dataclass(frozen=True)
class Executor(Part):
    """Which executor ran the run, where, and how often it started it (suite.grid.executors)."""
    name: str | None = None
    worker: int | None = None
    host: str | None = None
    attempts: int | None = None
    pid: int | None = None
    cuda_visible_devices: str | None = None
    oom_retries: int | None = None                  # started again after running out of memory
    outputs_returned: tuple[str, ...] | None = None  # files a remote worker sent back (Ray)


@dataclasses.dataclass(frozen=True)
class Artifacts(Part):
    """The files a run left beside its record (a saved model, test predictions), by name relative to it."""
    model: str | None = None
    model_sha256: str | None = None  # the saved model's files as written (suite.run.test_predictions.files_digest)
    test_predictions: Mapping[str, str] | None = None     # GLUE test set -> predictions file
    test_sets_absent: tuple[str, ...] | None = None
    tracking_error: str | None = None
    # a hand-edited value that is no such object, kept as read: the run's numbers are intact, so the record stays a
    # record and the value is named where the files are needed (`RunRecord.artifact_files`)
    unreadable: Any = dataclasses.field(default=None, repr=False, metadata={"json": False})

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> "Artifacts":
        try:
            return super().from_json(data, where)
        except PartError:
            return cls(unreadable=data)

    def to_json(self) -> Any:
        return self.unreadable if self.unreadable is not None else super().to_json()
