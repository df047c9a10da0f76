"""What a task is (`TaskSpec`, `LocalSplit`), the task registry and task groups: what a task author writes.

A task is data: a `TaskSpec` registered with `register_task` from a module in `tasks/` (or a plugin's entry point in
the `suite.tasks` group). Reading its files and batching its examples live in `suite.run.data` and
`suite.run.batching`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from suite.api.registry import Registry, normalise

TASKS: Registry["TaskSpec"] = Registry("task", "suite.tasks", "suite.tasks", key=normalise)
TASK_GROUPS: dict[str, list[str]] = {}  # e.g. "glue" -> its nine tasks


@dataclasses.dataclass(frozen=True)
class LocalSplit:
    """Where a split lives in a local folder of TSVs and which columns hold what.

    `columns` maps each hub column (text fields and `label`) to a header name, or to a 0-based column index for
    files without a header. `labels` maps the file's label strings to hub label ids (None: the value is the id,
    or a float score for regression).
    """

    file: str
    columns: dict[str, str | int]
    header: bool = True
    labels: dict[str, int] | None = None


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str                                  # canonical name, e.g. "sst2"
    display: str                               # e.g. "SST-2"
    text_fields: tuple[str, ...]
    label_names: tuple[str, ...] | None        # None for regression
    metrics: tuple[str, ...]                   # official metrics, names from suite.api.metrics.METRICS
    hub: tuple[str, str] | None                # (dataset path, config); None: local files only
    train_split: str = "train"
    eval_splits: dict[str, str] = dataclasses.field(default_factory=lambda: {"": "validation"})
    local_dir: str = ""
    local: dict[str, LocalSplit] = dataclasses.field(default_factory=dict)  # hub split name -> file layout
    higher_is_better: bool = True
    headline: str = "score"                    # mean of the official metrics (GLUE leaderboard convention)
    benchmark: str = ""                        # names the average column ("GLUE"); "" = averaged with nothing
    in_average: bool = True                    # whether the task enters its benchmark's average ...
    average_note: str = ""                     # ... and, when it does not, why (reports print it)
    score_range: tuple[float, float] | None = None  # valid regression labels (STS-B: 0 to 5); checked on reading
    data_dir: str = ""                         # the task's own data folder (a plugin's), used instead of --data-dir

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    def metric_keys(self) -> list[str]:
        """Names of the metrics one evaluation reports, e.g. accuracy_m / accuracy_mm for MNLI."""
        return [f"{m}_{s}" if s else m for s in self.eval_splits for m in self.metrics]


def register_task(spec: TaskSpec, groups: Sequence[str] = ()) -> TaskSpec:
    TASKS.add(spec.name, spec)
    for g in groups:
        TASK_GROUPS.setdefault(g, []).append(spec.name)
    return spec


def get_task(name: str) -> TaskSpec:
    return TASKS.get(name)


def select_tasks(patterns: str | Sequence[str]) -> list[str]:
    TASKS.load()
    return TASKS.select(patterns, groups=TASK_GROUPS)
