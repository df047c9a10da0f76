"""Sections built around figures: data efficiency (score against training-set size), stability across seeds,
overfitting (training curves) and attention statistics. Each is a function of one model's facts and the report's
options that returns its part of the document.

Data efficiency: dev score against training-set size, per method, on the tasks that ran several sizes
(`suite.report.selection.size_curves`). The epochs may change with the size: a study that keeps the number of
optimizer steps fixed trains small sets for more epochs, so that size is not confounded with how long the model
trains; the table says which. Each method is compared with the reference at every size (`suite.stats.curves`).
Where a curve fixes its data draws (`train.data_seed`), runs are paired by (draw, seed), each pair one unit of the
test, whose inference is then about those draws. Give each draw seeds of its own (draw 0 seeds 1-3, draw 1 seeds
4-6): with the same seeds under every draw (crossed), pairs sharing a seed share an initialisation and are not
independent, and the test's p-values come out too small.

Stability (Mosbach et al. 2021, "On the stability of fine-tuning BERT"): the runs lost to training, seed spread, worst
seed, per method and task, with a per-seed figure per task. A run is counted when it failed (did not finish: the one
meaning of "failed" in the report), finished without a score, or collapsed: ended not above the task's collapse floor
(`suite.stats.collapse`: the majority-class or constant-mean score plus the study's `collapse_floor:` margin, 1 point
by default). Mosbach et al. call such a collapsed run "failed" when it does not beat the majority classifier; the
margin adds what a few dev examples' worth of noise can give.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from suite.report.facts import Cell, ModelFacts, Options
from suite.report.figures import (
    method_colors,
    plot_curves,
    plot_drop_rates,
    plot_layers,
    plot_seed_strips,
    plot_size_curves,
)
from suite.report.load import Col
from suite.report.selection import Selection
from suite.report.vocabulary import (
    DASH,
    FIGURES,
    Part,
    Table,
    fmt,
    higher_is_better,
    slug,
    table,
    task_display,
)
from suite.run.record_parts import AttentionStats
from suite.stats import collapse

__all__ = ["attention", "data_efficiency", "overfitting", "stability"]

def data_efficiency(facts: ModelFacts, options: Options) -> Part:
    sel, curves, tests, part = facts.sel, facts.curves, facts.curve_tests, Part()
    if not curves:
        return part
    part.add("### Data efficiency", "",
             f"Dev headline metric x100 (mean ± std over runs, runs in brackets) at each training-set size, with "
             f"the other training settings of the leaderboard (the epochs, where they change with the size, in the "
             f"column headers).{_draws_note(curves)} In brackets after a cell: the mean paired difference "
             f"to {options.baseline} at that size; **bold**: significant after {options.correction} correction over "
             f"all {len(tests)} comparisons of this section (the leaderboard's test over seeds and dev examples, "
             f"α = {options.alpha}).", "")
    for task, sub in curves.items():
        sizes = sorted(int(s) for s in sub[Col.SIZE].unique())
        rows = []
        for m in facts.curve_methods[task]:
            row = [sel.label(m)]
            for size in sizes:
                cell = Cell.of(sub[(sub[Col.METHOD] == m) & (sub[Col.SIZE] == size)])
                text = cell.text()
                if (task, m, size) in tests:
                    d, p = tests[task, m, size]
                    diff = f"{fmt(d, sign=True)}, p {p:.2g}"
                    text += f" [**{diff}**]" if p < options.alpha else f" [{diff}]"
                row.append(text)
            rows.append(row)
        base = facts.baselines.get(task)
        part.add(f"#### {task_display(task)}", "", table(rows, ["method", *_size_headers(sub, sizes)]), "")
        if base is not None and base.available:
            part.add(f"{base.constant_kind.replace('_', ' ')} baseline: {fmt(base.constant)}", "")
    path = options.figure(f"data_efficiency_{slug(facts.model)}.png")
    if options.figures:  # --no-figures: tables only
        plot_size_curves(curves, facts.curve_methods,
                         lambda task, m, size: Cell.of(curves[task][(curves[task][Col.METHOD] == m)
                                                                    & (curves[task][Col.SIZE] == size)]),
                         {t: b.constant for t, b in facts.baselines.items() if b.available}, sel.model, path)
        part.link(path, "dev score against training-set size")
    return part


def _draws_note(curves: dict[str, pd.DataFrame]) -> str:
    """Which tasks' curves fix their data draws, and what a run is then."""
    fixed = {task: sorted(int(d) for d in sub[Col.DRAW].dropna().unique()) for task, sub in curves.items()
             if sub[Col.DRAW].notna().any()}
    if not fixed:
        return ""
    named = "; ".join(f"{task_display(t)}: draws {', '.join(map(str, d))}" for t, d in fixed.items())
    return (f" Fixed data draws ({named}): a run is one (draw, seed), the test pairs the methods' runs by it and "
            "speaks of these draws; the leaderboard's runs (a draw per seed) are not on these curves.")


def _size_headers(sub: pd.DataFrame, sizes: list[int]) -> list[str]:
    """"N examples", with "x E epochs" when the epochs change with the size."""
    epochs = {int(s): int(sub.loc[sub[Col.SIZE] == s, Col.EPOCHS].iloc[0]) for s in sizes}
    if len(set(epochs.values())) == 1:
        return [f"{s} examples" for s in sizes]
    return [f"{s} examples × {epochs[s]} epoch{'' if epochs[s] == 1 else 's'}" for s in sizes]


def _lost_runs(cell: Cell, floor: float, higher: bool) -> int | None:
    """Runs that failed, have no score or collapsed; None when the floor is unknown (collapse cannot be judged)."""
    if not math.isfinite(floor):
        return None
    return cell.failed + cell.no_score + collapse.rate(cell.values, floor, higher)[0]


def _stability_text(cell: Cell, floor: float, higher: bool) -> str:
    runs = cell.n + cell.failed + cell.no_score
    if not runs:
        return DASH
    lost = _lost_runs(cell, floor, higher)
    worst = (cell.values.min() if higher else cell.values.max()) if cell.n else float("nan")
    share = f"{lost}/{runs}" if lost is not None else f"?/{runs}"
    return f"{share} · {fmt(cell.std)} · {fmt(worst)}"


def _collapse_margin_text(options: Options) -> str:
    declared = options.collapse_floor
    if declared is None:
        return f"{collapse.DEFAULT_MARGIN:g} point"
    return f"{declared:g} points" if isinstance(declared, (int, float)) else "the declared points (per task)"


def stability(facts: ModelFacts, options: Options) -> Part:
    sel, bases, cells, floor, part = facts.sel, facts.baselines, facts.cells, facts.floors, Part()
    rows = [[sel.label(m), *[_stability_text(cells[m, t], floor[t], higher_is_better(t)) for t in sel.tasks]]
            for m in sel.methods]
    headers = ["method", *[task_display(t) for t in sel.tasks]]
    part.tables["stability"] = Table(headers, rows)
    part.add("### Stability across seeds", "",
             "Per method and task: failed, no-score or collapsed runs / runs · seed std · worst seed (headline metric "
             "x100): the collapse rate per method. Failed: did not finish; no score: finished without a finite "
             "score; collapsed: ends "
             f"within {_collapse_margin_text(options)} of the majority-class (or constant-mean) predictor or below "
             "it (Mosbach et al. 2021; `collapse_floor:`); \"?\": no baseline to judge collapse. Leaderboard cells "
             "with both collapsed and healthy runs show the median.",
             "", table(rows, headers), "")
    path = options.figure(f"seeds_{slug(facts.model)}.png")
    if options.figures and plot_seed_strips({t: {m: cells[m, t] for m in sel.methods} for t in sel.tasks}, bases,
                                            {t: higher_is_better(t) for t in sel.tasks},
                                            f"every seed's score, {sel.model}", path):
        part.link(path, "per-seed scores per task")
    return part


# Column/panel order of the attention statistics (others follow alphabetically); mass_* go to their own figure.
ATTENTION_ORDER = ("sparsity", "entropy", "null_rows", "attended_keys", "head_diversity",
                   "mass_cls", "mass_sep", "mass_punct")
# y-axis label (with unit) and valid range of each statistic (suite/run/attention_stats.py); others: no unit, no bound
ATTENTION_AXES = {"sparsity": ("share of exactly-zero probabilities", (0.0, 1.0)),
                  "entropy": ("entropy per row (nats)", (0.0, math.inf)),
                  "null_rows": ("share of all-zero rows", (0.0, 1.0)),
                  "attended_keys": ("keys with non-zero probability (count)", (0.0, math.inf)),
                  "head_diversity": ("Jensen-Shannon divergence between heads (nats)", (0.0, math.log(2))),
                  # generalised JS over all H heads (Correia et al.): bounded by ln H
                  "head_disagreement": ("generalised JS divergence across heads (nats)", (0.0, math.inf))}
MASS_AXIS = ("share of attention", (0.0, 1.0))


def overfitting(facts: ModelFacts, options: Options) -> Part:
    sel, board, mslug, part = facts.sel, facts.board, slug(facts.model), Part()
    cells = {(m, t): Cell.of(board[(board[Col.METHOD] == m) & (board[Col.TASK] == t)], "gap")
             for m in sel.methods for t in sel.tasks}
    colors = method_colors(sel.methods)
    part.add("### Overfitting", "",
             "Generalisation gap at the last epoch: headline metric on a fixed train subset minus on dev, x100 "
             "(mean ± std over seeds; larger: more overfitting).", "",
             table([[sel.label(m), *[cells[m, t].text() for t in sel.tasks]] for m in sel.methods],
                   ["method", *[task_display(t) for t in sel.tasks]]), "")
    for t in sel.tasks:
        bt = board[board[Col.TASK] == t]
        paths = [options.figure(f"{kind}_{mslug}_{slug(t)}.png") for kind in ("curves", "loss")]
        title = f"{task_display(t)}, {sel.model}"
        if options.figures and plot_curves(bt, sel.methods, colors, f"{title}: headline metric per epoch",
                                           paths[0], options.baseline):
            plot_curves(bt, sel.methods, colors, f"{title}: loss per epoch", paths[1], options.baseline, kind="loss")
            part.add(f"#### {task_display(t)}", "",
                     "Per epoch, mean over seeds with a ±std band, one panel per method (the reference's dev curve "
                     "in grey): headline metric on dev and on the fixed train subset; training loss (running mean "
                     "over the epoch, with dropout) and dev loss.", "")
            part.link(paths[0], f"{task_display(t)} headline metric per epoch")
            part.link(paths[1], f"{task_display(t)} loss per epoch")
    return part


def _attention_table(sel: Selection, with_stats: pd.DataFrame, columns: list[str]) -> str:
    rows = []
    for m in sel.methods:
        sub = with_stats[with_stats[Col.METHOD] == m]
        if not len(sub):
            continue
        row = [sel.label(m)]
        for s in columns:
            vals = np.asarray([a.mean.get(s, math.nan) for a in sub[Col.ATTENTION]], dtype=float)
            vals = vals[np.isfinite(vals)]
            row.append(fmt(float(np.mean(vals)), 3) if len(vals) else DASH)
        rows.append(row + [str(len(sub))])
    return table(rows, ["method", *columns, "runs"])


def _common_runs(with_stats: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The runs on the (task, seed) pairs every method ran, and those tasks.

    Methods get different seeds per task (a sequential design extends some comparisons) and some run fewer tasks;
    pooled over everything, a method's mean would weight the tasks differently from another's, and the statistics
    differ far more between tasks (sequence lengths) than between methods. Empty when no pair is shared."""
    pairs = None
    for _, sub in with_stats.groupby(Col.METHOD, sort=False):
        own = set(zip(sub[Col.TASK], sub[Col.SEED]))
        pairs = own if pairs is None else pairs & own
    keep = with_stats[[pair in (pairs or set()) for pair in zip(with_stats[Col.TASK], with_stats[Col.SEED])]]
    return keep, sorted(set(keep[Col.TASK]))


def _attention_blocks(part: Part, options: Options, sel: Selection, with_stats: pd.DataFrame, mslug: str,
                      model: str) -> list[str]:
    shared, tasks = _common_runs(with_stats)
    if len(shared):
        seeds = shared.groupby(Col.TASK)[Col.SEED].nunique()
        scope = ("mean over layers and over the tasks and seeds every method shown ran (" + ", ".join(
            f"{task_display(t)}: {seeds[t]} seed(s)" for t in tasks) + "), so that no method's mean weights the "
            "tasks differently")
        with_stats = shared
    else:
        scope = ("mean over layers, tasks and seeds; the methods share no (task, seed) run, so each mean covers "
                 "its own runs and the rows are not comparable")
    names = sorted({k for a in with_stats[Col.ATTENTION] for k in a.per_layer})
    ordered = [s for s in ATTENTION_ORDER if s in names] + [s for s in names if s not in ATTENTION_ORDER]
    shape = [s for s in ordered if not s.startswith("mass_")]
    mass = [s for s in ordered if s.startswith("mass_")]
    getter = lambda r, s: r[Col.ATTENTION].per_layer.get(s)  # noqa: E731
    colors = method_colors(sel.methods)
    blocks = [f"Attention statistics of the fine-tuned models on dev batches (`suite/run/attention_stats.py`; "
              f"definitions in docs/reports.md), {scope}:",
              "", _attention_table(sel, with_stats, shape + mass), ""]
    path = options.figure(f"attention_{mslug}.png")
    axes = {s: ATTENTION_AXES.get(s, (s, (-math.inf, math.inf))) for s in shape} | {s: MASS_AXIS for s in mass}
    labels, clips = {s: a[0] for s, a in axes.items()}, {s: a[1] for s, a in axes.items()}
    if options.figures and plot_layers(with_stats, shape, getter, sel.methods, colors,
                                       f"attention per layer, {model} (mean over tasks and seeds, ±std)", path,
                                       labels, clips):
        part.figures.append(path)
        blocks += [f"![attention statistics per layer]({FIGURES}/{path.name})", ""]
    path = options.figure(f"attention_mass_{mslug}.png")
    if options.figures and mass and plot_layers(with_stats, mass, getter, sel.methods, colors,
                                                f"attention mass per layer, {model} (mean over tasks and seeds, "
                                                "±std)", path, labels, clips):
        part.figures.append(path)
        blocks += [f"![attention mass on special tokens and punctuation]({FIGURES}/{path.name})", ""]
    return blocks


def _has_drop_rates(sub: pd.DataFrame) -> bool:
    return bool(sub[Col.DROP_RATES].map(lambda r: isinstance(r, tuple)).any()) or any(
        isinstance(e.drop_rates, tuple) for h in sub[Col.HISTORY] for e in h)


def _drop_rate_blocks(part: Part, options: Options, sel: Selection, ok: pd.DataFrame, mslug: str,
                      model: str) -> list[str]:
    blocks = []
    for m in sel.methods:
        sub = ok[ok[Col.METHOD] == m]
        if not _has_drop_rates(sub):
            continue
        path = options.figure(f"drop_rate_{mslug}_{slug(m)}.png")
        if options.figures and plot_drop_rates(sub, sel.tasks, f"{m}: drop rate per layer, {model}", path):
            part.figures.append(path)
            blocks += [f"Drop rate per layer of `{m}`:", "", f"![{m} drop rate per layer]({FIGURES}/{path.name})",
                       ""]
    return blocks


def attention(facts: ModelFacts, options: Options) -> Part:
    sel, board, mslug, model, part = facts.sel, facts.board, slug(facts.model), facts.model, Part()
    ok = board[board[Col.STATUS] == "ok"]
    with_stats = ok[ok[Col.ATTENTION].map(lambda a: isinstance(a, AttentionStats) and bool(a.per_layer))]
    blocks = _attention_blocks(part, options, sel, with_stats, mslug, model) if len(with_stats) else []
    blocks += _drop_rate_blocks(part, options, sel, ok, mslug, model)
    if blocks:
        part.add("### Attention", "", *blocks)
    return part
