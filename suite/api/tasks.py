"""What a task is (`TaskSpec`, `LocalSplit`, `TestSet`), the task registry and task groups: what a task author writes.

A task is data: a `TaskSpec` registered with `register_task` from a module in `tasks/` (or a plugin's entry point in
the `suite.tasks` group), scored by metrics registered with `suite.register_metric`, with test sets for
`run --predict-test` declared in the spec or added with `register_test_set`. docs/adding-a-task.md shows a complete
outside task. Reading its files and batching its examples live in `suite.run.data` and `suite.run.batching`.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from suite.api.registry import Registry, normalise

# what the rest of the suite uses; other names are this module's own
__all__ = ["LocalSplit", "TASKS", "TaskSpec", "TestSet", "get_task", "register_task", "select_tasks", "task_groups"]

TASKS: Registry["TaskSpec"] = Registry("task", "suite.tasks", "suite.tasks", key=normalise)


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
class TestSet:
    """One unlabeled test file and how to write its predictions (`run --predict-test`, `suite predict`).

    Predictions are written as `NAME.tsv` with the lines `index<TAB>prediction`, sorted by index, one per row of the
    file. `file` is the file's path inside the task's data folder (its `data_dir`, else `--data-dir`); a tab-separated
    file with a header, read without quoting or NA coercion. `columns` maps the task's text fields to the file's
    header names and `index` names the column the predictions are written with. `output` is `ids` (label ids),
    `names` (label names) or `score` (regression, clipped to the task's `score_range`). `hub` = (dataset, config,
    split) reads it from the Hugging Face hub when the grid reads its data from there.

    Example: `TestSet("Mood", "test.tsv", {"sentence": "text"}, output="names", index="id")`."""

    __test__ = False  # not a pytest test class

    name: str                      # submission file stem, e.g. "MNLI-m"
    file: str                      # path inside the data folder
    columns: dict[str, str]
    output: str = "ids"
    index: str = "index"
    hub: tuple[str, str, str] | None = None   # (dataset, config, split) when read from the hub

    def __post_init__(self):
        if self.output not in ("ids", "names", "score"):
            raise ValueError(f"TestSet.output {self.output!r}: choose ids, names or score")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything the suite knows about a task, as data: its columns and labels, its official metrics, where its
    splits live (hub and local TSV layout), how reports average it, its test sets, and the training budget each
    preset gives it. A task module builds one and calls `register_task`.

    The fields a task must give: `name` (what `--tasks` selects; case, '-' and '_' do not matter), `display` (what
    reports print), `text_fields` (one text column, or two for sentence pairs, in the tokenizer's order),
    `label_names` (in label-id order; None for a regression task, scored by one output), `metrics` (names of
    registered metrics, see `suite.register_metric`; the task's score is their mean over `eval_splits`) and `hub`
    ((dataset, config) on the Hugging Face hub, or None for local files only). Local files are described per split
    by `local` (hub split name -> `LocalSplit`) inside `local_dir` of the data folder; a plugin that ships its data
    sets `data_dir`, which is used instead of `--data-dir`. Every other field has a default; see the comments below
    and docs/adding-a-task.md. Write a task by keyword, as `tasks/glue.py` does (the six fields above may also be
    given by position, in this order).

    Example (a local-only two-class task with its own folder)::

        mood = {"sad": 0, "happy": 1}
        TaskSpec(name="mood", display="Mood", text_fields=("sentence",), label_names=("sad", "happy"),
                 metrics=("macro_f1", "accuracy"), hub=None, data_dir="/path/to/data",
                 local={"train": LocalSplit("train.tsv", {"sentence": "text", "label": "mood"}, labels=mood),
                        "validation": LocalSplit("dev.tsv", {"sentence": "text", "label": "mood"}, labels=mood)})
    """

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
    groups: tuple[str, ...] = ()               # names that select it with others (--tasks glue)
    test_sets: tuple[TestSet, ...] = ()        # unlabeled test files for submissions
    # per preset, the training settings this task gets over the preset's own (e.g. {"quick": {"epochs": 2}})
    budgets: dict[str, dict] = dataclasses.field(default_factory=dict)
    # whether train rows include the phrases of other train rows (SST-2's parse-tree phrases): a split carved by
    # sentence (train.carve) keeps each sentence's phrases with it (suite.run.carving)
    phrase_rows: bool = False

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
    """Add a task (and, optionally, more groups it belongs to) to the registry. Called at import by a module in
    `tasks/` or by a plugin module that an entry point in the `suite.tasks` group names; the metrics the task names
    are checked before any training (an unknown one exits 2 with the registered names)."""
    if groups:
        spec = dataclasses.replace(spec, groups=tuple(dict.fromkeys((*spec.groups, *groups))))
    return TASKS.add(spec.name, spec)


def register_test_set(task: str, test_set: TestSet) -> TestSet:
    """Add a test set to a registered task, the plugin's own or a built-in one (several per task are allowed: MNLI
    m/mm, AX). `run --predict-test` then writes its predictions; a task without any is refused before training."""
    spec = get_task(task)
    TASKS.add(spec.name, dataclasses.replace(spec, test_sets=(*spec.test_sets, test_set)))
    return test_set


def task_groups() -> dict[str, list[str]]:
    """Group name -> its registered tasks in registration order (GLUE's usual column order), from the tasks themselves:
    a removed task leaves no trace in a group."""
    groups: dict[str, list[str]] = {}
    for name in TASKS.names(registration_order=True):
        for g in get_task(name).groups:
            groups.setdefault(g, []).append(name)
    return groups


def get_task(name: str) -> TaskSpec:
    return TASKS.get(name)


def select_tasks(patterns: str | Sequence[str]) -> list[str]:
    return TASKS.select(patterns, groups=task_groups())
