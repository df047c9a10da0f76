"""The report's tuning section: for a study with a `tune:` block (docs/protocol.md), each method's search space and
budget, every configuration's tuning-split score (mean over the tuning seeds) and the configuration selected.

It reads OUT/tuning/selection.json, which the run command writes after the tuning stage; the tuning records
themselves (OUT/tuning/runs/) never enter the leaderboard.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from suite.report.load import output_files
from suite.report.tuned import SELECTION


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) or v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in settings.items()) or "defaults"


def _score(x: float | None) -> str:
    """A score x 100; a failed run's is NaN, a run without a record yet (or a mean it lacks) None."""
    return "—" if x is None else "failed" if x != x else f"{100 * x:.2f}"


def _space(space: dict[str, list]) -> str:
    return "; ".join(f"{k}: " + ", ".join(map(_value, values)) for k, values in space.items())


def _short(settings: dict[str, Any], method: str) -> str:
    """Selected settings without the method's own prefix (`vanilla.p` -> `p`, `train.lr` -> `lr`)."""
    def key(k: str) -> str:
        return k.split(".", 1)[1] if k.startswith((f"{method}.", "train.")) else k
    return ", ".join(f"{key(k)}={_value(v)}" for k, v in settings.items()) or "defaults"


def _selected_table(cells: list[dict]) -> list[str]:
    """One row per method, one column per task: each cell's selected settings and its tuning-split score."""
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for c in cells:
        best = next((x["mean"] for x in c["configurations"] if x["settings"] == c["selected"]), None)
        rows.setdefault((c["model"], c["method"]), {})[c["task"]] = (
            f"{_short(c['selected'], c['method'])} ({_score(best)})" if c["selected"] is not None
            else "none selected")
    lines = ["| model | method | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    lines += [f"| {model} | {method} | " + " | ".join(by_task.get(t, "–") for t in tasks) + " |"
              for (model, method), by_task in rows.items()]
    return lines


def selection_files(run_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The selection files of the output folders reported."""
    return output_files(run_dirs, SELECTION)


def markdown(run_dirs: Sequence[str | os.PathLike]) -> str:
    """The section as markdown ('' when no folder has a tuning stage)."""
    lines: list[str] = []
    for path in selection_files(run_dirs):
        data = json.loads(path.read_text())
        p = data["protocol"]
        lines += ["", "## Tuning", "",
                  f"Each method was tuned with the same budget ({p['budget']} configurations x tuning seeds "
                  f"{', '.join(map(str, p['seeds']))}) on a tuning split carved from the training data "
                  f"(train.holdout={_value(p['holdout'])}), never on dev; the configuration with the best mean "
                  "tuning-split score is the one the tables above report, run on other seeds and scored on dev "
                  f"(`{path}`).", "",
                  "| method | search space | points | budget |", "|---|---|---:|---:|"]
        lines += [f"| {m} | {_space(space)} | {math.prod(len(set(v)) for v in space.values())} | {p['budget']} |"
                  for m, space in p["space"].items()]
        lines += ["", "Selected per task (tuning-split score x 100 in brackets):", "",
                  *_selected_table(data["cells"]), "", "### Every configuration tried"]
        for cell in data["cells"]:
            lines += ["", f"**{cell['task']} / {cell['method']}** (`{cell['model']}`; tuning-split score x 100, "
                      f"{'higher' if cell['higher_is_better'] else 'lower'} is better): "
                      + (f"selected {_settings(cell['selected'])}" if cell["selected"] is not None
                         else f"nothing selected ({cell['reason']})"), "",
                      "| configuration | mean | per tuning seed | selected |", "|---|---:|---|:---:|"]
            for c in cell["configurations"]:
                seeds = ", ".join(f"{s}: {_score(v)}" for s, v in c["scores"].items())
                chosen = "✓" if c["settings"] == cell["selected"] else ""
                lines.append(f"| {_settings(c['settings'])} | {_score(c['mean'])} | {seeds} | {chosen} |")
    return "\n".join(lines) + ("\n" if lines else "")
