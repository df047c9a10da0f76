"""Sections built around figures: overfitting (training curves) and attention statistics."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from suite.report.cells import Cell
from suite.report.figures import method_colors, plot_curves, plot_drop_rates, plot_layers
from suite.report.formatting import DASH, fmt, num, slug, table
from suite.report.registry_info import task_display
from suite.report.selection import Selection

FIGURES = "figures"
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


def overfitting(rep, sel: Selection, board: pd.DataFrame, mslug: str) -> None:
    cells = {(m, t): Cell.of(board[(board["method"] == m) & (board["task"] == t)], "gap")
             for m in sel.methods for t in sel.tasks}
    colors = method_colors(sel.methods)
    rep.add("### Overfitting", "",
            "Generalisation gap at the last epoch: headline metric on a fixed train subset minus on dev, x100 "
            "(mean ± std over seeds; larger: more overfitting).", "",
            table([[rep.method_label(m, sel), *[cells[m, t].text() for t in sel.tasks]] for m in sel.methods],
                  ["method", *[task_display(t) for t in sel.tasks]]), "")
    for t in sel.tasks:
        bt = board[board["task"] == t]
        paths = [rep.figure(f"{kind}_{mslug}_{slug(t)}.png") for kind in ("curves", "loss")]
        title = f"{task_display(t)}, {sel.model}"
        if rep.draw and plot_curves(bt, sel.methods, colors, f"{title}: headline metric per epoch", paths[0],
                                    rep.baseline):
            plot_curves(bt, sel.methods, colors, f"{title}: loss per epoch", paths[1], rep.baseline, kind="loss")
            rep.add(f"#### {task_display(t)}", "",
                    "Per epoch, mean over seeds with a ±std band, one panel per method (the reference's dev curve "
                    "in grey): headline metric on dev and on the fixed train subset; training loss (running mean "
                    "over the epoch, with dropout) and dev loss.", "")
            rep.link(paths[0], f"{task_display(t)} headline metric per epoch")
            rep.link(paths[1], f"{task_display(t)} loss per epoch")


def attention_table(rep, sel: Selection, with_stats: pd.DataFrame, columns: list[str]) -> str:
    rows = []
    for m in sel.methods:
        sub = with_stats[with_stats["method"] == m]
        if not len(sub):
            continue
        row = [rep.method_label(m, sel)]
        for s in columns:
            vals = np.asarray([num((a.get("mean") or {}).get(s)) for a in sub["attention"]], dtype=float)
            vals = vals[np.isfinite(vals)]
            row.append(fmt(float(np.mean(vals)), 3) if len(vals) else DASH)
        rows.append(row + [str(len(sub))])
    return table(rows, ["method", *columns, "runs"])


def common_runs(with_stats: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The runs on the (task, seed) pairs every method ran, and those tasks.

    Methods get different seeds per task (a sequential design extends some comparisons) and some run fewer tasks;
    pooled over everything, a method's mean would weight the tasks differently from another's, and the statistics
    differ far more between tasks (sequence lengths) than between methods. Empty when no pair is shared."""
    pairs = None
    for _, sub in with_stats.groupby("method", sort=False):
        own = set(zip(sub["task"], sub["seed"]))
        pairs = own if pairs is None else pairs & own
    keep = with_stats[[pair in (pairs or set()) for pair in zip(with_stats["task"], with_stats["seed"])]]
    return keep, sorted(set(keep["task"]))


def attention_blocks(rep, sel: Selection, with_stats: pd.DataFrame, mslug: str, model: str) -> list[str]:
    shared, tasks = common_runs(with_stats)
    if len(shared):
        seeds = shared.groupby("task")["seed"].nunique()
        scope = ("mean over layers and over the tasks and seeds every method shown ran (" + ", ".join(
            f"{task_display(t)}: {seeds[t]} seed(s)" for t in tasks) + "), so that no method's mean weights the "
            "tasks differently")
        with_stats = shared
    else:
        scope = ("mean over layers, tasks and seeds; the methods share no (task, seed) run, so each mean covers "
                 "its own runs and the rows are not comparable")
    names = sorted({k for a in with_stats["attention"] for k in a["per_layer"]})
    ordered = [s for s in ATTENTION_ORDER if s in names] + [s for s in names if s not in ATTENTION_ORDER]
    shape = [s for s in ordered if not s.startswith("mass_")]
    mass = [s for s in ordered if s.startswith("mass_")]
    getter = lambda r, s: r["attention"]["per_layer"].get(s)  # noqa: E731
    colors = method_colors(sel.methods)
    blocks = [f"Attention statistics of the fine-tuned models on dev batches (`suite/run/attention_stats.py`; "
              f"definitions in docs/reports.md), {scope}:",
              "", attention_table(rep, sel, with_stats, shape + mass), ""]
    path = rep.figure(f"attention_{mslug}.png")
    axes = {s: ATTENTION_AXES.get(s, (s, (-math.inf, math.inf))) for s in shape} | {s: MASS_AXIS for s in mass}
    labels, clips = {s: a[0] for s, a in axes.items()}, {s: a[1] for s, a in axes.items()}
    if rep.draw and plot_layers(with_stats, shape, getter, sel.methods, colors, f"attention per layer, {model} "
                   "(mean over tasks and seeds, ±std)", path, labels, clips):
        rep.figures.append(path)
        blocks += [f"![attention statistics per layer]({FIGURES}/{path.name})", ""]
    path = rep.figure(f"attention_mass_{mslug}.png")
    if rep.draw and mass and plot_layers(with_stats, mass, getter, sel.methods, colors,
                            f"attention mass per layer, {model} (mean over tasks and seeds, ±std)", path,
                            labels, clips):
        rep.figures.append(path)
        blocks += [f"![attention mass on special tokens and punctuation]({FIGURES}/{path.name})", ""]
    return blocks


def has_drop_rates(sub: pd.DataFrame) -> bool:
    return bool(sub["method_record"].map(lambda r: isinstance(r.get("drop_rate_per_layer"), list)).any()) or any(
        isinstance((e.get("method") or {}).get("drop_rate_per_layer"), list) for h in sub["history"] for e in h)


def drop_rate_blocks(rep, sel: Selection, ok: pd.DataFrame, mslug: str, model: str) -> list[str]:
    blocks = []
    for m in sel.methods:
        sub = ok[ok["method"] == m]
        if not has_drop_rates(sub):
            continue
        path = rep.figure(f"drop_rate_{mslug}_{slug(m)}.png")
        if rep.draw and plot_drop_rates(sub, sel.tasks, f"{m}: drop rate per layer, {model}", path):
            rep.figures.append(path)
            blocks += [f"Drop rate per layer of `{m}`:", "", f"![{m} drop rate per layer]({FIGURES}/{path.name})",
                       ""]
    return blocks


def attention(rep, sel: Selection, board: pd.DataFrame, mslug: str, model: str) -> None:
    ok = board[board["status"] == "ok"]
    with_stats = ok[ok["attention"].map(lambda a: isinstance(a, dict) and bool(a.get("per_layer")))]
    blocks = attention_blocks(rep, sel, with_stats, mslug, model) if len(with_stats) else []
    blocks += drop_rate_blocks(rep, sel, ok, mslug, model)
    if blocks:
        rep.add("### Attention", "", *blocks)
