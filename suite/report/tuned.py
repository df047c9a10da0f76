"""A tuned study's final runs on the leaderboard.

The leaderboard uses one set of training settings per task and one hyper-parameter setting per method. In a study
with a tuning stage (docs/protocol.md) each (model, task, method) instead ran the configuration its tuning selected
(OUT/tuning/selection.json): learning rates and the methods' own rates differ from cell to cell. The rows of runs
that match their cell's selection have the searched keys taken out of their `train` and `hp` keys (and dicts), so
that every method's selected runs of a task share one leaderboard row and column; which values each cell ran is the
Tuning section's table. Runs of another configuration keep their keys and show up as runs outside the leaderboard
settings.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from suite.report.formatting import key_of
from suite.report.load import output_files

SELECTION = Path("tuning") / "selection.json"
TRAIN = "train."
FOLDED = "tuned"  # the frame's column naming, per folded row, the keys its cell's tuning chose


def selections(paths: Sequence[str | os.PathLike]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(model, task, method) -> the selected configuration ({"train.lr": ..., "METHOD.KEY": ...}) of every tuning
    stage beside the folders reported."""
    found = {}
    for path in output_files(paths, SELECTION):
        for cell in json.loads(path.read_text()).get("cells", []):
            if cell.get("selected") is not None:
                found[str(cell["model"]), str(cell["task"]), str(cell["method"])] = cell["selected"]
    return found


def _split(method: str, selected: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training settings, the method's hyper-parameters) of a selected configuration."""
    train = {k[len(TRAIN):]: v for k, v in selected.items() if k.startswith(TRAIN)}
    own = {k[len(method) + 1:]: v for k, v in selected.items() if k.startswith(method + ".")}
    return train, own


def _number(x: Any) -> float | None:
    """A number, or a number written as text (a search space may quote "1e-4"; the run trained on the float)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(x) if isinstance(x, str) else None
    except ValueError:
        return None


def _same(a: Any, b: Any) -> bool:
    na, nb = _number(a), _number(b)
    if na is not None and nb is not None and (not isinstance(a, str) or not isinstance(b, str)):
        return na == nb
    return a == b


def fold_selected(frame: pd.DataFrame, paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """The frame with each selected run's searched keys taken out of its train/hp keys (see the module's text);
    unchanged when no folder has a tuning stage."""
    chosen = selections(paths)
    if not chosen or not len(frame):
        return frame
    missing = sorted({f"{t}/{m}" for t, m in zip(frame["task"], frame["method"])}
                     - {f"{t}/{m}" for _, t, m in chosen})
    if missing:  # runs of cells whose tuning stage never ran, or a selection file written before they were tuned
        print(f"warning: no tuning selection for {', '.join(missing)}: their runs are reported as they ran; give "
              "the study's command again (it writes every cell's selection) to fold them", file=sys.stderr)
    frame = frame.assign(**{FOLDED: [()] * len(frame)})
    for i, row in frame.iterrows():
        selected = chosen.get((row["model"], row["task"], row["method"]))
        if selected is None:
            continue
        train, own = _split(row["method"], selected)
        train_dict, hp_dict = row["train_dict"], row["hp_dict"]
        if not (all(_same(train_dict.get(k), v) for k, v in train.items())
                and all(_same(hp_dict.get(k), v) for k, v in own.items())):
            continue
        kept_train = {k: v for k, v in train_dict.items() if k not in train}
        kept_hp = {k: v for k, v in hp_dict.items() if k not in own}
        frame.at[i, "train_dict"], frame.at[i, "train"] = kept_train, key_of(kept_train)
        frame.at[i, "hp_dict"], frame.at[i, "hp"] = kept_hp, key_of(kept_hp)
        frame.at[i, FOLDED] = tuple(selected)
    return frame


def setup_note(board: pd.DataFrame) -> str:
    """The Setup section's sentence on what was tuned per cell ('' for an untuned study)."""
    if FOLDED not in board or not len(board):
        return ""
    keys = sorted({k for ks in board[FOLDED] for k in ks}, key=lambda k: (not k.startswith(TRAIN), k))
    if not keys:
        return ""
    return (" Tuned per task and method, each cell's values in the Tuning section below: "
            + ", ".join(f"`{k}`" for k in keys) + ".")
