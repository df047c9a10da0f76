"""Scores of predictors that learn nothing (majority class / constant mean, chance), per task of a leaderboard.

New records carry them (`record.baselines`, computed by the runner from the dev labels it evaluated on). For older
records they are computed here from the same dev labels: the task's dev split read from the data folder
(`--data-dir` or $SUITE_DATA_DIR) and subset exactly as the runner subsets it (`max_eval_samples`, `data_seed`).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from suite.report.formatting import SCALE, num
from suite.report.registry_info import task_spec

CONSTANT_KINDS = ("majority", "constant_mean")


@dataclasses.dataclass
class Baseline:
    """x100 scores of the constant predictor (majority or constant mean) and of chance; NaN when unavailable."""
    constant_kind: str
    constant: float
    chance: float
    source: str            # "records", "data" or the reason none could be computed

    @property
    def available(self) -> bool:
        return math.isfinite(self.constant)


def from_records(board_task: pd.DataFrame) -> Baseline | None:
    for found in board_task["baselines"]:
        kind = next((k for k in CONSTANT_KINDS if isinstance(found.get(k), dict)), None)
        if kind is not None:
            chance = num((found.get("chance") or {}).get("score")) * SCALE
            return Baseline(kind, num(found[kind].get("score")) * SCALE, chance, "records")
    return None


def dev_labels(spec, train: dict[str, Any], data_dir) -> dict[str, np.ndarray]:
    """The dev labels a run with training settings `train` was evaluated on, per eval-split suffix."""
    from suite.run.data import read_local_split, resolve_data_dir, seeded_subset

    local = resolve_data_dir(data_dir)
    if local is None:
        raise FileNotFoundError("no data folder (give --data-dir or set $SUITE_DATA_DIR)")
    out = {}
    for suffix, split in spec.eval_splits.items():
        labels = read_local_split(spec, split, local)["label"]
        keep = seeded_subset(len(labels), train.get("max_eval_samples"), int(train.get("data_seed") or 0))
        out[suffix] = np.asarray([labels[i] for i in keep])
    return out


def from_data(task: str, train_key: str, data_dir) -> Baseline:
    from suite.run.baselines import baseline_scores

    spec = task_spec(task)
    if spec is None:
        return Baseline("majority", math.nan, math.nan, "unknown task")
    kind = "constant_mean" if spec.is_regression else "majority"
    try:
        scores = baseline_scores(spec, dev_labels(spec, json.loads(train_key), data_dir))
    except Exception as exc:  # noqa: BLE001  missing data folder or files: the report says so and goes on
        return Baseline(kind, math.nan, math.nan, f"unavailable: {str(exc).splitlines()[0][:160]}")
    return Baseline(kind, scores[kind]["score"] * SCALE, scores["chance"]["score"] * SCALE, "data")


def task_baselines(board: pd.DataFrame, tasks: list[str], train_by_task: dict[str, str], data_dir,
                   cache: dict) -> dict[str, Baseline]:
    """{task: Baseline} for the leaderboard's records of each task (`cache` avoids re-reading the data)."""
    out = {}
    for t in tasks:
        found = from_records(board[board["task"] == t])
        if found is None:
            key = (t, train_by_task[t], str(data_dir))
            if key not in cache:
                cache[key] = from_data(t, train_by_task[t], data_dir)
            found = cache[key]
        out[t] = found
    return out
