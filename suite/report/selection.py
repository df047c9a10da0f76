"""Which records the leaderboard uses, and which settings the ablation tables show.

Per method the leaderboard uses its default hyper-parameters (the method's `Config()`); a method run only with other
settings shows the most-run one and says so. Per (model, task) it uses one set of training settings for every
method: the one the most methods ran (then most ok runs, then the latest finished run).
"""
from __future__ import annotations

import dataclasses
import json

import pandas as pd

from suite.report.formatting import key_of
from suite.report.registry_info import default_hparams, task_order
from suite.report.tuned import FOLDED
from suite.run.settings import changed_settings, setting_value


@dataclasses.dataclass
class Selection:
    model: str
    tasks: list[str]
    methods: list[str]
    train_by_task: dict[str, str]     # task -> training-settings key used in the leaderboard
    hp_by_method: dict[str, str]      # method -> hyper-parameter key used in the leaderboard
    hp_is_default: dict[str, bool]
    reference_tasks: list[str] = dataclasses.field(default_factory=list)  # shown apart, never compared

    def board(self, df: pd.DataFrame, tasks: list[str] | None = None) -> pd.DataFrame:
        """The model's records that the leaderboard uses (or the reference table, given its tasks)."""
        tasks = set(self.tasks if tasks is None else tasks)
        keep = df.apply(lambda r: r["task"] in tasks and self.train_by_task.get(r["task"]) == r["train"]
                        and self.hp_by_method.get(r["method"]) == r["hp"], axis=1)
        return df[keep.astype(bool)] if len(df) else df


def _hparams_used(sub: pd.DataFrame, method: str) -> tuple[str, bool]:
    """The method's leaderboard setting and whether it counts as the method's own (no brackets in its label): the runs
    its tuning selected (suite.report.tuned), else its defaults, else its most-run setting."""
    if FOLDED in sub:
        selected = sub[sub[FOLDED].map(bool)]
        if len(selected):
            return selected["hp"].value_counts().index[0], True
    default = default_hparams(method)
    if default is not None and default in set(sub["hp"]):
        return default, True
    counts = sub.assign(ok=sub["status"] == "ok").groupby("hp").agg(ok=("ok", "sum"), n=("ok", "size"))
    counts = counts.reset_index().sort_values(["ok", "n", "hp"], ascending=[False, False, True])
    return counts["hp"].iloc[0], False


def _train_used(sub: pd.DataFrame) -> str:
    stats = (sub.assign(ok=sub["status"] == "ok")
             .groupby("train").agg(methods=("method", "nunique"), ok=("ok", "sum"), n=("ok", "size"),
                                   latest=("finished", "max")).reset_index())
    stats = stats.sort_values(["methods", "ok", "n", "latest", "train"], ascending=[False, False, False, False, True])
    return stats["train"].iloc[0]


def select(df: pd.DataFrame, model: str, baseline: str, reference_tasks=()) -> Selection:
    """`reference_tasks` (e.g. tasks the model does not learn) get their own table, out of comparisons and averages."""
    dm = df[df["model"] == model]
    tasks = task_order(dm["task"].unique())
    methods = sorted(dm["method"].unique(), key=lambda m: (m != baseline, m))
    hp_by_method, is_default = {}, {}
    for method in methods:
        hp_by_method[method], is_default[method] = _hparams_used(dm[dm["method"] == method], method)
    train_by_task = {}
    for task in tasks:
        sub = dm[(dm["task"] == task) & (dm["hp"] == dm["method"].map(hp_by_method))]
        if not len(sub):  # this task only has other hyper-parameter settings: they are listed after the tables
            sub = dm[dm["task"] == task]
        train_by_task[task] = _train_used(sub)
    reference = [t for t in tasks if t in set(reference_tasks)]
    return Selection(model, [t for t in tasks if t not in reference], methods, train_by_task, hp_by_method,
                     is_default, reference)


def setting_text(hp: dict, method: str) -> str:
    """The hyper-parameters that differ from the method's defaults (all of them for unknown methods), written by the
    rule that also names the rows of `run`'s closing summary (`suite.run.settings.changed_settings`)."""
    default = default_hparams(method)
    return changed_settings(hp, json.loads(default) if default else None)


def lookup(row, key: str):
    """A run's value of an ablation key (`train.*` or a hyper-parameter's name); "tuned" where its cell's tuning
    chose it (the value per cell is in the Tuning section)."""
    if (key if key.startswith("train.") else f"{row['method']}.{key}") in (row.get(FOLDED) or ()):
        return "tuned"
    if key.startswith("train."):
        return row["train_dict"].get(key[len("train."):])
    return row["hp_dict"].get(key)


def varying_keys(sub: pd.DataFrame) -> list[str]:
    """Hyper-parameters (by name) and training fields (`train.*`) taking two or more values within one task."""
    keys: set[str] = set()
    for _, t in sub.groupby(["model", "task"]):
        for col, prefix in (("hp_dict", ""), ("train_dict", "train.")):
            names = {k for d in t[col] for k in d}
            for k in names:
                if len({key_of({"v": d.get(k)}) for d in t[col]}) > 1:
                    keys.add(prefix + k)
    return sorted(keys, key=lambda k: (k.startswith("train."), k))


def has_variation(df: pd.DataFrame, model: str, method: str) -> bool:
    return bool(varying_keys(df[(df["model"] == model) & (df["method"] == method)]))


def train_diff(d: dict, ref: dict) -> str:
    return ", ".join(f"train.{k}={setting_value(v)}" for k, v in sorted(d.items()) if ref.get(k, object()) != v)
