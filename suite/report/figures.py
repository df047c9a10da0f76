"""Figures (matplotlib, Agg) as PNG (200 dpi) and PDF: identical data gives identical bytes (no software or date
metadata). Many methods are drawn as small multiples (one panel each, the reference in grey in every panel) rather
than as overlapping lines; every colour and line style is in a legend; ±std bands are clipped to the quantity's
valid range; axes carry units."""
from __future__ import annotations

import math
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from suite.report.load import Col
from suite.report.vocabulary import SCALE, num, task_display

__all__ = ["band", "grid", "method_colors", "method_styles", "plot_curves", "plot_drop_rates", "plot_layers",
           "plot_seed_strips", "plot_size_curves", "pyplot", "save"]

PANELS_PER_ROW = 5
DPI = 200
METRIC_RANGE = (-SCALE, SCALE)          # x100 scores; correlations and MCC can be negative
STYLES = ("-", "--", ":", "-.")
REFERENCE_COLOR = "black"            # the reference method in every small multiple (dotted)
ONE_EPOCH_MARKS = {"dev": "o", "train": "s", "reference": "D"}     # a curve of one point: a marker per series
ONE_EPOCH_SHIFT = {"dev": -0.08, "reference": 0.0, "train": 0.08}  # epochs: the three points side by side


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def method_colors(methods: Sequence[str]) -> dict[str, Any]:
    plt = pyplot()
    cmap = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(methods)}


def method_styles(methods: Sequence[str]) -> dict[str, str]:
    """Colour and line style together tell 15+ methods apart (tab20's pairs of similar hues get different styles)."""
    return {m: STYLES[(i // 2) % len(STYLES)] if len(methods) > 10 else "-" for i, m in enumerate(methods)}


def save(fig, path: Path) -> None:
    """PNG at `path` and a PDF beside it, both without software or date metadata."""
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    fig.savefig(path.with_suffix(".pdf"), metadata={"Creator": None, "Producer": None, "CreationDate": None})
    pyplot().close(fig)


def band(ax, x, mean, std, color, style="-", label=None, clip=(-math.inf, math.inf), marker="o"):
    ax.plot(x, mean, style, color=color, label=label, linewidth=1.5, marker=marker, markersize=2.5)
    if np.isfinite(std).any():
        s = np.nan_to_num(std)
        ax.fill_between(x, np.clip(mean - s, *clip), np.clip(mean + s, *clip), color=color, alpha=0.15, linewidth=0)


def grid(n: int, per_row: int = PANELS_PER_ROW, width: float = 3.0, height: float = 2.4, sharey: bool = False):
    plt = pyplot()
    ncols = min(n, per_row)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols + 1.5, height * nrows + 0.8), squeeze=False,
                             sharex=True, sharey=sharey, layout="constrained")
    axes = axes.ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def epoch_table(board_task: pd.DataFrame) -> pd.DataFrame | None:
    rows = []
    for _, r in board_task[board_task[Col.STATUS] == "ok"].iterrows():
        for e in r[Col.HISTORY]:
            rows.append({Col.METHOD: r[Col.METHOD], "epoch": e.epoch, "train_loss": e.train_loss,
                         "dev_loss": e.dev_loss, "dev_score": e.dev_score * SCALE,
                         "train_subset_score": e.train_subset_score * SCALE})
    return pd.DataFrame(rows).groupby([Col.METHOD, "epoch"]).agg(["mean", "std"]) if rows else None


def curve(c: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (c.index.to_numpy(dtype=float), c[(column, "mean")].to_numpy(), c[(column, "std")].to_numpy())


def plot_curves(board_task: pd.DataFrame, methods: list[str], colors: dict, title: str, path: Path,
                reference: str, kind: str = "score") -> bool:
    """Small multiples, one panel per method: solid = dev, dashed = train (loss) or train subset (metric), mean
    over seeds with a ±std band; the reference method's dev curve in grey in every panel."""
    curves = epoch_table(board_task)
    if curves is None:
        return False
    present = [m for m in methods if m in curves.index.get_level_values(0)]
    solid, dashed = ("dev_loss", "train_loss") if kind == "loss" else ("dev_score", "train_subset_score")
    clip = (0.0, math.inf) if kind == "loss" else METRIC_RANGE
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # one epoch: each series is one point, a line style shows nothing, so each gets its own marker and a small
    # offset in x (dev left, train right, the reference between), and its ±std as an error bar
    one_epoch = curves.index.get_level_values(1).nunique() == 1
    marks = ONE_EPOCH_MARKS if one_epoch else {"dev": "o", "train": "o", "reference": None}
    with plt.style.context("default"):
        fig, axes = grid(len(present), sharey=True)   # one scale: panels compare at a glance
        for ax, m in zip(axes, present):
            if reference in present and m != reference:
                x, mean, _ = curve(curves.loc[reference], solid)
                ax.plot(x + (ONE_EPOCH_SHIFT["reference"] if one_epoch else 0), mean, ":", color=REFERENCE_COLOR,
                        linewidth=1.2, marker=marks["reference"], markersize=5, fillstyle="none")
            for column, style, series in ((solid, "-", "dev"), (dashed, "--", "train")):
                x, mean, std = curve(curves.loc[m], column)
                if one_epoch:
                    ax.errorbar(x + ONE_EPOCH_SHIFT[series], mean, yerr=np.nan_to_num(std), fmt=marks[series],
                                color=colors[m], markersize=6, capsize=3, fillstyle="full" if series == "dev"
                                else "none")
                else:
                    band(ax, x, mean, std, colors[m], style, clip=clip)
            ax.set_title(m, fontsize="small")
            ax.set_xlabel("epoch", fontsize="small")
            if one_epoch:
                epoch = curves.index.get_level_values(1)[0]
                ax.set_xlim(epoch - 0.5, epoch + 0.5)
                ax.set_xticks([epoch])
            else:
                ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        ylabel = "loss (per example, nats)" if kind == "loss" else "headline metric (x100)"
        fig.supylabel(ylabel)
        spread = (Line2D([], [], color="black", marker="|", linestyle="none", markersize=8,
                         label="±1 std over seeds") if one_epoch
                  else Patch(color="black", alpha=0.15, label="±1 std over seeds"))
        lines = dict.fromkeys(("-", "--", ":"), "none") if one_epoch else {s: s for s in ("-", "--", ":")}
        handles = [Line2D([], [], color="black", linestyle=lines["-"], marker=marks["dev"] if one_epoch else None,
                          label="dev"),
                   Line2D([], [], color="black", linestyle=lines["--"], marker=marks["train"] if one_epoch else None,
                          fillstyle="none",
                          label="train (running mean, with dropout)" if kind == "loss" else "fixed train subset"),
                   Line2D([], [], color=REFERENCE_COLOR, linestyle=lines[":"], marker=marks["reference"],
                          fillstyle="none", label=f"{reference}: dev (reference)"),
                   spread]
        fig.legend(handles=handles, loc="outside lower center", ncols=4, frameon=False, fontsize="small")
        fig.suptitle(title)
        save(fig, path)
    return True


def per_layer(records: pd.DataFrame, getter) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """method -> (mean, std) over records of a per-layer list; records of another depth are left out."""
    out = {}
    for m, sub in records.groupby(Col.METHOD, sort=True):
        arrays = [np.asarray([num(v) for v in vals], dtype=float) for vals in map(getter, sub.to_dict("records"))
                  if isinstance(vals, tuple) and vals]
        if not arrays:
            continue
        depth = Counter(len(a) for a in arrays).most_common(1)[0][0]
        stack = np.stack([a for a in arrays if len(a) == depth])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # all-nan layers, single records
            out[m] = (np.nanmean(stack, axis=0), np.nanstd(stack, axis=0, ddof=1) if len(stack) > 1
                      else np.full(depth, np.nan))
    return out


def plot_layers(records: pd.DataFrame, stats: list[str], getter, methods: list[str], colors: dict, title: str,
                path: Path, ylabels: dict[str, str], clips: dict[str, tuple[float, float]]) -> bool:
    """One panel per statistic, one line per method (colour and line style, both in the legend)."""
    panels = [(s, per_layer(records, lambda r, s=s: getter(r, s))) for s in stats]
    panels = [(s, d) for s, d in panels if d]
    if not panels:
        return False
    plt = pyplot()
    styles = method_styles(methods)
    with plt.style.context("default"):
        fig, axes = grid(len(panels), per_row=3, width=4.2, height=3.2)
        for ax, (stat, data) in zip(axes, panels):
            for m in methods:
                if m in data:
                    band(ax, np.arange(len(data[m][0])), *data[m], colors[m], styles[m], label=m,
                         clip=clips.get(stat, (-math.inf, math.inf)))
            ax.set(ylabel=ylabels.get(stat, stat), title=stat)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        fig.supxlabel("layer (0 = closest to the embeddings)")
        handles, labels = [], []
        for ax in axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(h), labels.append(lab)
        fig.legend(handles, labels, loc="outside right center", frameon=False, fontsize="small",
                   title="method (band: ±1 std)")
        fig.suptitle(title)
        save(fig, path)
    return True


def epoch_rates(records: pd.DataFrame) -> dict[int, np.ndarray]:
    """epoch -> mean drop rate per layer over the records that logged one per epoch."""
    epochs: dict[int, list[list]] = {}
    for r in records.to_dict("records"):
        for e in r[Col.HISTORY]:
            if e.drop_rates:
                epochs.setdefault(int(e.epoch or 0), []).append(e.drop_rates)
    out = {}
    for e in sorted(epochs):
        depth = Counter(len(a) for a in epochs[e]).most_common(1)[0][0]
        stack = np.asarray([[num(v) for v in a] for a in epochs[e] if len(a) == depth], dtype=float)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[e] = np.nanmean(stack, axis=0)
    return out


def plot_drop_rates(records: pd.DataFrame, tasks: list[str], title: str, path: Path) -> bool:
    """Final drop rate per layer per task (±std over seeds); per epoch (mean over tasks and seeds) only when the
    method logged rates per epoch (a fixed schedule has none: then one panel)."""
    final = per_layer(records.assign(**{Col.METHOD: records[Col.TASK]}), lambda r: r[Col.DROP_RATES])
    epochs = epoch_rates(records)
    if not final and not epochs:
        return False
    plt = pyplot()
    with plt.style.context("default"):
        panels = int(bool(final)) + int(bool(epochs))
        fig, axes = plt.subplots(1, panels, figsize=(5 * panels + 1, 3.8), squeeze=False, layout="constrained")
        axes = list(axes.ravel())
        if final:
            ax, colors = axes.pop(0), method_colors(tasks)
            styles = method_styles(tasks)
            curves = [final[t][0] for t in tasks if t in final]
            if len(curves) > 1 and all(np.array_equal(c, curves[0]) for c in curves):   # a fixed schedule
                one = "all tasks (identical)"
                final, tasks, colors, styles = {one: next(iter(final.values()))}, [one], {one: "tab:blue"}, {one: "-"}
            for t in tasks:
                if t in final:
                    band(ax, np.arange(len(final[t][0])), *final[t], colors[t], styles[t], label=task_display(t),
                         clip=(0.0, 1.0))
            ax.set(xlabel="layer (0 = closest to the embeddings)", ylabel="drop rate (probability)",
                   title="end of training, per task (band: ±1 std)")
            ax.legend(frameon=False, fontsize="small", title="task")
        if epochs:
            ax, cmap = axes.pop(0), plt.get_cmap("viridis")
            for i, (e, rates) in enumerate(epochs.items()):
                ax.plot(np.arange(len(rates)), rates, color=cmap(i / max(len(epochs) - 1, 1)), label=f"epoch {e}")
            ax.set(xlabel="layer (0 = closest to the embeddings)", ylabel="drop rate (probability)",
                   title="per epoch (mean over tasks and seeds)")
            ax.legend(frameon=False, fontsize="small")
        for ax in fig.axes:
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        save(fig, path)
    return True


def plot_seed_strips(cells_by_task: dict[str, dict], bases: dict, higher: dict[str, bool], title: str,
                     path: Path) -> bool:
    """One panel per task: every seed's score per method (dots) over a box of its seeds, and the
    majority / constant-mean predictor as a vertical line (or, far from the seeds, its value at the edge)."""
    tasks = [t for t, cells in cells_by_task.items() if any(c.n for c in cells.values())]
    if not tasks:
        return False
    plt = pyplot()
    from matplotlib.lines import Line2D

    with plt.style.context("default"):
        methods = list(next(iter(cells_by_task.values())))
        fig, axes = plt.subplots(1, len(tasks), figsize=(2.6 * len(tasks) + 2.5, 0.28 * len(methods) + 1.6),
                                 squeeze=False, sharey=True, layout="constrained")
        far = False
        for ax, t in zip(axes.ravel(), tasks):
            cells = cells_by_task[t]
            ys = np.arange(len(methods))[::-1]
            data = [cells[m].values for m in methods]
            ax.boxplot([d if len(d) else [np.nan] for d in data], positions=ys, vert=False, widths=0.6,
                       showfliers=False, medianprops={"color": "black"})
            for y, d in zip(ys, data):
                ax.plot(d, np.full(len(d), y), "o", color="tab:blue", markersize=3, alpha=0.8)
            if bases[t].available:
                far |= mark_baseline(ax, bases[t].constant, np.concatenate([np.asarray(d, dtype=float) for d in data]))
            ax.set_title(task_display(t), fontsize="small")
            ax.set_xlabel("headline metric (x100)")
            ax.grid(alpha=0.3, axis="x")
        axes.ravel()[0].set_yticks(np.arange(len(methods))[::-1], methods, fontsize="small")
        handles = [Line2D([], [], marker="o", linestyle="", color="tab:blue", label="one seed"),
                   Line2D([], [], color="black", label="box: quartiles and median of the seeds"),
                   Line2D([], [], color="tab:red", linestyle="--", label="majority class / constant mean"
                          + (" (far off: its value at the edge)" if far else ""))]
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False, fontsize="small")
        fig.suptitle(title)
        save(fig, path)
    return True


FAR = 1.5   # spans of the seeds' scores beyond which the baseline is named at the panel's edge instead of drawn


def mark_baseline(ax, constant: float, scores: np.ndarray) -> bool:
    """The majority / constant predictor as a vertical line; where it lies more than FAR spans of the seeds' scores
    away from them, its value with an arrow at the panel's edge instead (True), so that the seeds' spread stays
    readable."""
    finite = scores[np.isfinite(scores)]
    lo, hi = (finite.min(), finite.max()) if len(finite) else (constant, constant)
    span = max(hi - lo, 1.0)   # a point at least: identical seeds are not blown up to fill the panel
    if lo - FAR * span <= constant <= hi + FAR * span:
        ax.axvline(constant, color="tab:red", linestyle="--", linewidth=1)
        return False
    ax.set_xlim(lo - 0.15 * span, hi + 0.15 * span)
    below = constant < lo
    ax.annotate(f"← {constant:.1f}" if below else f"{constant:.1f} →", xy=(0.01 if below else 0.99, 0.02),
                xycoords="axes fraction", ha="left" if below else "right", va="bottom", color="tab:red",
                fontsize="x-small")
    return True


def plot_size_curves(curves: dict[str, pd.DataFrame], methods: dict[str, list[str]], cells, constants: dict,
                     model: str, path: Path) -> None:
    """One panel per task: each method's dev score (mean ± std band) against the training-set size (log scale), and
    the majority / constant predictor; `cells(task, method, size)` the cell at one size, `constants` task -> score
    (x100, NaN: none)."""
    shown = list(dict.fromkeys(m for task in curves for m in methods[task]))
    colors, styles = method_colors(shown), method_styles(shown)
    fig, axes = grid(len(curves), width=3.6, height=2.8)
    for ax, (task, sub) in zip(axes, curves.items()):
        for m in methods[task]:
            at = [(s, cells(task, m, s)) for s in sorted(sub[Col.SIZE].unique())]
            x = np.asarray([s for s, _ in at], dtype=float)
            band(ax, x, np.asarray([c.mean for _, c in at]), np.asarray([c.std for _, c in at]), colors[m],
                 styles[m], label=m)
        constant = constants.get(task, math.nan)
        if math.isfinite(constant):
            ax.axhline(constant, color="grey", linestyle=":", linewidth=1, label="majority / constant")
        ax.set_xscale("log", base=2)
        sizes = sorted(int(s) for s in sub[Col.SIZE].unique())
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_title(f"{task_display(task)}, {model}", fontsize=9)
        ax.set_xlabel("training examples")
        ax.set_ylabel("dev headline metric x100")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=7)
    save(fig, path)
