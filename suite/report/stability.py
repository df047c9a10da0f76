"""Fine-tuning stability (Mosbach et al. 2021, "On the stability of fine-tuning BERT"): failed runs, seed spread,
worst seed, per method and task, with a per-seed figure per task.

A run counts as failed when it did not finish, finished without a score, or collapsed: ended not above the task's
collapse floor (`suite.stats.collapse`: the majority-class or constant-mean score plus the study's `collapse_floor:`
margin, 1 point by default). Mosbach et al. call a run failed when it does not beat the majority classifier; the
margin adds what a few dev examples' worth of noise can give.
"""
from __future__ import annotations

import math

from suite.report.cells import Cell
from suite.report.comparisons import floors
from suite.report.facts import ModelFacts
from suite.report.figures import plot_seed_strips
from suite.report.formatting import DASH, fmt, table
from suite.report.registry_info import higher_is_better, task_display
from suite.stats import collapse


def failed_runs(cell: Cell, floor: float, higher: bool) -> int | None:
    """Runs that failed or collapsed; None when the floor is unknown (collapse cannot be judged)."""
    if not math.isfinite(floor):
        return None
    return cell.failed + cell.no_score + collapse.rate(cell.values, floor, higher)[0]


def stability_text(cell: Cell, floor: float, higher: bool) -> str:
    runs = cell.n + cell.failed + cell.no_score
    if not runs:
        return DASH
    failed = failed_runs(cell, floor, higher)
    worst = (cell.values.min() if higher else cell.values.max()) if cell.n else float("nan")
    share = f"{failed}/{runs}" if failed is not None else f"?/{runs}"
    return f"{share} · {fmt(cell.std)} · {fmt(worst)}"


def collapse_margin_text(rep) -> str:
    declared = rep.options.collapse_floor
    if declared is None:
        return f"{collapse.DEFAULT_MARGIN:g} point"
    return f"{declared:g} points" if isinstance(declared, (int, float)) else "the declared points (per task)"


def stability(rep, facts: ModelFacts, mslug: str) -> None:
    sel, bases, cells = facts.sel, facts.baselines, facts.cells
    floor = floors(sel, bases, rep.options.collapse_floor)
    rows = [[rep.method_label(m, sel), *[stability_text(cells[m, t], floor[t], higher_is_better(t))
                                         for t in sel.tasks]] for m in sel.methods]
    headers = ["method", *[task_display(t) for t in sel.tasks]]
    rep.tables[sel.model, "stability"] = (headers, rows)
    rep.add("### Stability across seeds", "",
            "Per method and task: failed runs / runs · seed std · worst seed (headline metric x100): the collapse "
            "rate per method. A run counts as failed when it did not finish, has no score, or collapsed: ends within "
            f"{collapse_margin_text(rep)} of the majority-class (or constant-mean) predictor or below it (Mosbach et "
            "al. 2021; `collapse_floor:`); \"?\": no baseline to judge collapse. Leaderboard cells with both "
            "collapsed and healthy runs show the median.",
            "", table(rows, headers), "")
    path = rep.figure(f"seeds_{mslug}.png")
    if rep.draw and plot_seed_strips({t: {m: cells[m, t] for m in sel.methods} for t in sel.tasks}, bases,
                        {t: higher_is_better(t) for t in sel.tasks}, f"every seed's score, {sel.model}", path):
        rep.link(path, "per-seed scores per task")
