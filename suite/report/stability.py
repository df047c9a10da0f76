"""Fine-tuning stability (Mosbach et al. 2021, "On the stability of fine-tuning BERT"): failed runs, seed spread,
worst seed, per method and task, with a per-seed figure per task.

A run counts as failed when it did not finish, finished without a score, or ended no more than `FAIL_MARGIN` points
above the majority-class (classification) or constant-mean (regression) predictor: Mosbach et al. call a run failed
when it does not beat the majority classifier; the margin adds what a few dev examples' worth of noise can give.
"""
from __future__ import annotations

import numpy as np

from suite.report.baseline_scores import Baseline
from suite.report.cells import Cell
from suite.report.facts import ModelFacts
from suite.report.figures import plot_seed_strips
from suite.report.formatting import DASH, fmt, table
from suite.report.registry_info import higher_is_better, task_display

FAIL_MARGIN = 1.0           # points x100


def failed_runs(cell: Cell, base: Baseline, higher: bool) -> int | None:
    """Runs that failed or collapsed; None when the baseline is unknown (collapse cannot be judged)."""
    broken = cell.failed + cell.no_score
    if not base.available:
        return None
    line = base.constant + FAIL_MARGIN if higher else base.constant - FAIL_MARGIN
    return broken + int(np.sum(cell.values <= line) if higher else np.sum(cell.values >= line))


def stability_text(cell: Cell, base: Baseline, higher: bool) -> str:
    runs = cell.n + cell.failed + cell.no_score
    if not runs:
        return DASH
    failed = failed_runs(cell, base, higher)
    worst = (cell.values.min() if higher else cell.values.max()) if cell.n else float("nan")
    share = f"{failed}/{runs}" if failed is not None else f"?/{runs}"
    return f"{share} · {fmt(cell.std)} · {fmt(worst)}"


def stability(rep, facts: ModelFacts, mslug: str) -> None:
    sel, bases, cells = facts.sel, facts.baselines, facts.cells
    rows = [[rep.method_label(m, sel), *[stability_text(cells[m, t], bases[t], higher_is_better(t))
                                         for t in sel.tasks]] for m in sel.methods]
    headers = ["method", *[task_display(t) for t in sel.tasks]]
    rep.tables[sel.model, "stability"] = (headers, rows)
    rep.add("### Stability across seeds", "",
            "Per method and task: failed runs / runs · seed std · worst seed (headline metric x100). A run counts as "
            f"failed when it did not finish, has no score, or ends within {FAIL_MARGIN:g} point of the majority-class "
            "(or constant-mean) predictor or below it (Mosbach et al. 2021); \"?\": no baseline to judge collapse.",
            "", table(rows, headers), "")
    path = rep.figure(f"seeds_{mslug}.png")
    if rep.draw and plot_seed_strips({t: {m: cells[m, t] for m in sel.methods} for t in sel.tasks}, bases,
                        {t: higher_is_better(t) for t in sel.tasks}, f"every seed's score, {sel.model}", path):
        rep.link(path, "per-seed scores per task")
