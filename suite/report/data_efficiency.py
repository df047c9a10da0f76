"""Data efficiency: dev score against training-set size, per method, on the tasks that ran several sizes.

A task qualifies when at least three values of `train.max_train_samples` were run with the leaderboard's other
training settings for that task (learning rate, batch size, ...) and each method's leaderboard hyper-parameters.
The epochs may change with the size: a study that keeps the number of optimizer steps fixed trains small sets for
more epochs, so that size is not confounded with how long the model trains; the table says which. Each
method is compared with the reference at every size with the leaderboard's test over seeds and dev examples
(`suite.stats.evidence.compare_runs`); all those tests form one family, corrected together (the report's
correction), separately from the leaderboard's.

A curve may fix its data draws (`train.data_seed`): where a task's curve runs have fixed draws, only those are used
(the leaderboard's runs, drawn per seed, are a different design), and runs are paired by (draw, seed), each pair one
unit of the test, whose inference is then about those draws. Give each draw seeds of its own (draw 0 seeds 1-3,
draw 1 seeds 4-6): with the same seeds under every draw (crossed), pairs sharing a seed share an initialisation and
are not independent, and the test's p-values come out too small.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from suite.report import significance as sig
from suite.report.cells import Cell
from suite.report.comparisons import outcomes
from suite.report.figures import band, grid, method_colors, method_styles, save
from suite.report.formatting import SCALE, fmt, table
from suite.report.registry_info import task_display
from suite.report.selection import Selection
from suite.stats.evidence import RunOutcome, compare_runs

SIZE = "max_train_samples"
DRAW = "data_seed"
MIN_SIZES = 3


def _rest(train_key: str) -> str:
    """A training-settings key without the train-set size, the epochs (which may scale with it) and the data draw."""
    d = json.loads(train_key)
    for key in (SIZE, "epochs", DRAW):
        d.pop(key, None)
    return json.dumps(d, sort_keys=True)


def _one_epochs_per_size(sub: pd.DataFrame, leaderboard_epochs) -> pd.DataFrame:
    """Where a size ran at several epoch counts, the one with the most runs (ties: the leaderboard's, then the
    fewest epochs)."""
    keep = []
    for _, at in sub.groupby("size"):
        counts = at["epochs"].value_counts()
        pick = min(counts.index, key=lambda e: (-counts[e], e != leaderboard_epochs, e))
        keep.append(at[at["epochs"] == pick])
    return pd.concat(keep)


def size_curves(sel: Selection, df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """{task: its ok records at every train-set size (column `size`)} for tasks with at least MIN_SIZES sizes."""
    ok = df[(df["status"] == "ok") & (df["hp"] == df["method"].map(sel.hp_by_method))]
    found = {}
    for task in sel.tasks:
        sub = ok[ok["task"] == task]
        if task not in sel.train_by_task or not len(sub):
            continue
        sub = sub[sub["train"].map(_rest) == _rest(sel.train_by_task[task])]
        sizes = sub["train_dict"].map(lambda d: d.get(SIZE))
        sub = sub.assign(size=sizes, epochs=sub["train_dict"].map(lambda d: d.get("epochs")),
                         draw=sub["train_dict"].map(lambda d: d.get(DRAW)))
        sub = sub[sizes.notna()]  # `null` (the whole train set) has no place on the axis
        if sub["draw"].notna().any():  # a curve with fixed draws: the runs drawn per seed are another design
            sub = sub[sub["draw"].notna()]
        if sub["size"].nunique() >= MIN_SIZES:
            found[task] = _one_epochs_per_size(sub, json.loads(sel.train_by_task[task]).get("epochs"))
    return found


def curve_runs(sel: Selection, df: pd.DataFrame, curves: dict[str, pd.DataFrame]) -> pd.Index:
    """The index of the records the data-efficiency section shows, failed runs included (the ablation tables leave
    them to it): per curve task, the runs of each method the curve draws at a training setting its curve has.
    `curves`: `size_curves(sel, df)`."""
    keep = []
    for task, sub in curves.items():
        for m in _methods(sel, sub):
            settings = set(sub.loc[sub["method"] == m, "train"])
            keep.append(df.index[(df["task"] == task) & (df["method"] == m) & (df["hp"] == sel.hp_by_method[m])
                                 & df["train"].isin(settings)])
    return keep[0].append(keep[1:]) if keep else pd.Index([])


def _methods(sel: Selection, sub: pd.DataFrame) -> list[str]:
    return [m for m in sel.methods if sub[sub["method"] == m]["size"].nunique() >= 2]


def paired_outcomes(sub: pd.DataFrame) -> dict:
    """Runs keyed by seed, or by (draw, seed) where the draw is fixed: the units the test pairs."""
    if "draw" not in sub or sub["draw"].isna().all():
        return outcomes(sub)
    ok = sub[(sub["status"] == "ok") & np.isfinite(sub["score"].astype(float))]
    return {(int(r.draw), int(r.seed)): RunOutcome(float(r.score) * SCALE, r.predictions or None)
            for r in ok.itertuples()}


def compare(rep, sel: Selection, curves: dict[str, pd.DataFrame]) -> dict[tuple[str, str, int], tuple[float, float]]:
    """{(task, method, size): (mean paired difference to the reference x100, corrected p)}."""
    keys, diffs, ps = [], [], []
    for task, sub in curves.items():
        for size in sorted(sub["size"].unique()):
            at = sub[sub["size"] == size]
            ref = paired_outcomes(at[at["method"] == rep.baseline])
            for m in _methods(sel, sub):
                if m == rep.baseline:
                    continue
                ev = compare_runs(task, paired_outcomes(at[at["method"] == m]), ref)
                if ev.n_seeds >= 2 and math.isfinite(ev.p):
                    keys.append((task, m, int(size)))
                    diffs.append(ev.diff)
                    ps.append(ev.p)
    adjusted = sig.adjust(np.asarray(ps), rep.correction) if ps else []
    return {k: (d, float(p)) for k, d, p in zip(keys, diffs, adjusted)}


def section(rep, facts, mslug: str) -> None:
    """`facts`: the model's `suite.report.facts.ModelFacts` (not imported: facts imports this module)."""
    sel, curves = facts.sel, facts.curves
    if not curves:
        return
    tests = compare(rep, sel, curves)
    rep.add("### Data efficiency", "",
            f"Dev headline metric x100 (mean ± std over runs, runs in brackets) at each training-set size, with "
            f"the other training settings of the leaderboard (the epochs, where they change with the size, in the "
            f"column headers).{draws_note(curves)} In brackets after a cell: the mean paired difference "
            f"to {rep.baseline} at that size; **bold**: significant after {rep.correction} correction over all "
            f"{len(tests)} comparisons of this section (the leaderboard's test over seeds and dev examples, "
            f"α = {rep.alpha}).", "")
    for task, sub in curves.items():
        sizes = sorted(int(s) for s in sub["size"].unique())
        rows = []
        for m in _methods(sel, sub):
            row = [rep.method_label(m, sel)]
            for size in sizes:
                cell = Cell.of(sub[(sub["method"] == m) & (sub["size"] == size)])
                text = cell.text()
                if (task, m, size) in tests:
                    d, p = tests[task, m, size]
                    diff = f"{fmt(d, sign=True)}, p {p:.2g}"
                    text += f" [**{diff}**]" if p < rep.alpha else f" [{diff}]"
                row.append(text)
            rows.append(row)
        base = facts.baselines.get(task)
        rep.add(f"#### {task_display(task)}", "", table(rows, ["method", *size_headers(sub, sizes)]), "")
        if base is not None and base.available:
            rep.add(f"{base.constant_kind.replace('_', ' ')} baseline: {fmt(base.constant)}", "")
    path = rep.figure(f"data_efficiency_{mslug}.png")
    if rep.draw:  # --no-figures: tables only
        plot(rep, facts, curves, path)
        rep.link(path, "dev score against training-set size")


def draws_note(curves: dict[str, pd.DataFrame]) -> str:
    """Which tasks' curves fix their data draws, and what a run is then."""
    fixed = {task: sorted(int(d) for d in sub["draw"].dropna().unique()) for task, sub in curves.items()
             if sub["draw"].notna().any()}
    if not fixed:
        return ""
    named = "; ".join(f"{task_display(t)}: draws {', '.join(map(str, d))}" for t, d in fixed.items())
    return (f" Fixed data draws ({named}): a run is one (draw, seed), the test pairs the methods' runs by it and "
            "speaks of these draws; the leaderboard's runs (a draw per seed) are not on these curves.")


def size_headers(sub: pd.DataFrame, sizes: list[int]) -> list[str]:
    """"N examples", with "x E epochs" when the epochs change with the size."""
    epochs = {int(s): int(sub.loc[sub["size"] == s, "epochs"].iloc[0]) for s in sizes}
    if len(set(epochs.values())) == 1:
        return [f"{s} examples" for s in sizes]
    return [f"{s} examples × {epochs[s]} epoch{'' if epochs[s] == 1 else 's'}" for s in sizes]


def plot(rep, facts, curves: dict[str, pd.DataFrame], path) -> None:
    sel = facts.sel
    methods = list(dict.fromkeys(m for sub in curves.values() for m in _methods(sel, sub)))
    colors, styles = method_colors(methods), method_styles(methods)
    fig, axes = grid(len(curves), width=3.6, height=2.8)
    for ax, (task, sub) in zip(axes, curves.items()):
        for m in _methods(sel, sub):
            cells = [(s, Cell.of(sub[(sub["method"] == m) & (sub["size"] == s)])) for s in sorted(sub["size"].unique())]
            x = np.asarray([s for s, _ in cells], dtype=float)
            band(ax, x, np.asarray([c.mean for _, c in cells]), np.asarray([c.std for _, c in cells]), colors[m],
                 styles[m], label=m)
        base = facts.baselines.get(task)
        if base is not None and base.available and math.isfinite(base.constant):
            ax.axhline(base.constant, color="grey", linestyle=":", linewidth=1, label="majority / constant")
        ax.set_xscale("log", base=2)
        sizes = sorted(int(s) for s in sub["size"].unique())
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_title(f"{task_display(task)}, {sel.model}", fontsize=9)
        ax.set_xlabel("training examples")
        ax.set_ylabel("dev headline metric x100")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=7)
    save(fig, path)
