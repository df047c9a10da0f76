"""The interpretability analyses of the leaderboard's runs (suite/analyses, docs/analyses.md), per model:

- attention vs input importance: per method the mean Kendall tau of each attention reading with each importance, and
  the mean entropies (per run the mean over its examples, then the mean over runs);
- variance across seeds: runs of one cell (task, method, settings) paired seed by seed; per dev example the JS
  divergence of their attention and the total-variation distance of their predictions; median and quartiles per
  method and a violin figure;
- what the heads look at: per method, heatmaps (layer x head) of the mass on [CLS], [SEP], punctuation and the
  entropy, averaged over tasks and seeds.

Runs without analyses are left out; the section is absent when no run has any.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from suite.report.facts import ModelFacts, Options
from suite.report.figures import pyplot, save
from suite.report.load import Col
from suite.report.selection import Selection
from suite.report.vocabulary import DASH, Part, fmt, slug, table
from suite.run.analyses import heads as head_stats
from suite.run.analyses.seeds import seed_divergence
from suite.run.record_parts import Analyses

__all__ = ["importance_table", "mean_heads", "section", "seed_pairs"]

TAUS = ("tau_cls_gxi", "tau_cls_loo", "tau_rollout_gxi", "tau_rollout_loo")
ENTROPIES = ("entropy_gxi", "entropy_loo", "entropy_cls", "entropy_rollout")


def _part(board: pd.DataFrame, name: str) -> pd.DataFrame:
    """The board's ok runs that carry analysis `name`, with that part in column `part`."""
    if Col.ANALYSES not in board.columns:
        return board.iloc[0:0]
    part = board[Col.ANALYSES].map(lambda a: a.get(name) if isinstance(a, Analyses) else None)
    keep = part.map(lambda p: isinstance(p, dict) and bool(p))
    return board[keep].assign(part=part[keep])


def _mean(values) -> float:
    vals = np.asarray([v for v in values if v is not None], dtype=float)
    vals = vals[np.isfinite(vals)]
    return float(vals.mean()) if len(vals) else math.nan


def importance_table(sel: Selection, runs: pd.DataFrame, label) -> str:
    rows = []
    for m in sel.methods:
        sub = runs[runs[Col.METHOD] == m]
        if len(sub):
            means = [_mean(p["mean"].get(k) for p in sub["part"]) for k in TAUS + ENTROPIES]
            rows.append([label(m)] + [fmt(v, 3) if math.isfinite(v) else DASH for v in means] + [str(len(sub))])
    heads = ["method", "τ [CLS]·g×i", "τ [CLS]·LOO", "τ rollout·g×i", "τ rollout·LOO",
             "H g×i", "H LOO", "H [CLS]", "H rollout", "runs"]
    return table(rows, heads)


def seed_pairs(runs: pd.DataFrame, tokens: str = "content") -> dict[str, dict[str, list[float]]]:
    """method -> {"jsd": [...], "tvd": [...]} over every pair of seeds of every cell and every analysed example;
    the JSD over content tokens (default) or, `tokens="boundary"`, of the [CLS] row with the boundary tokens."""
    out: dict[str, dict[str, list[float]]] = {}
    for (method, _task, _hp, _train), cell in runs.groupby([Col.METHOD, Col.TASK, Col.HP, Col.TRAIN], sort=True):
        ordered = cell.sort_values(Col.SEED)
        for (_, a), (_, b) in itertools.combinations(ordered.iterrows(), 2):
            if a["part"].get("prediction") and len(a["part"]["prediction"]) == len(b["part"]["prediction"]):
                pair = seed_divergence(a["part"], b["part"], tokens)
                got = out.setdefault(method, {"jsd": [], "tvd": []})
                got["jsd"] += [v for v in pair["jsd"] if math.isfinite(v)]
                got["tvd"] += [v for v in pair["tvd"] if math.isfinite(v)]
    return out


def _quartiles(values: list[float]) -> str:
    if not values:
        return DASH
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return f"{fmt(med, 3)} [{fmt(q1, 3)}, {fmt(q3, 3)}]"


MEASURES = {"content": "JSD of attention over content tokens",
            "boundary": "JSD of [CLS] attention with boundary tokens"}


def seeds_table(sel: Selection, pairs: dict, label, measure: str = MEASURES["content"]) -> str:
    rows = [[label(m), _quartiles(pairs[m]["jsd"]), _quartiles(pairs[m]["tvd"]), str(len(pairs[m]["tvd"]))]
            for m in sel.methods if m in pairs]
    return table(rows, ["method", f"{measure}, median [IQR]", "TVD of predictions, median [IQR]", "pairs"])


def plot_seed_violins(pairs: dict, methods: list[str], title: str, path, measure: str = MEASURES["content"]) -> bool:
    shown = [m for m in methods if m in pairs and pairs[m]["tvd"]]
    if not shown:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(1.0 + 0.6 * len(shown) * 2, 3.2), layout="constrained")
    for ax, key, name in ((axes[0], "jsd", f"{measure} (nats)"), (axes[1], "tvd", "TVD of predictions")):
        data = [pairs[m][key] or [math.nan] for m in shown]
        usable = [i for i, d in enumerate(data) if np.isfinite(d).any()]
        if usable:
            ax.violinplot([data[i] for i in usable], positions=[i + 1 for i in usable], showmedians=True)
        ax.set_xticks(range(1, len(shown) + 1), shown, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(name)
    fig.suptitle(title, fontsize=9)
    save(fig, path)
    return True


def mean_heads(runs: pd.DataFrame, method: str) -> dict[str, np.ndarray]:
    parts = [p for p in runs[runs[Col.METHOD] == method]["part"]]
    out = {}
    for name in head_stats.STATISTICS:
        arrays = [np.asarray(p[name], dtype=float) for p in parts if name in p]
        shapes = {a.shape for a in arrays}
        if arrays and len(shapes) == 1:
            out[name] = np.nanmean(np.stack(arrays), axis=0)
    return out


def plot_head_maps(runs: pd.DataFrame, methods: list[str], title: str, path) -> bool:
    maps = {m: mean_heads(runs, m) for m in methods}
    maps = {m: v for m, v in maps.items() if v}
    if not maps:
        return False
    plt = pyplot()
    stats = head_stats.STATISTICS
    fig, axes = plt.subplots(len(maps), len(stats), figsize=(2.2 * len(stats) + 1, 1.6 * len(maps) + 0.8),
                             squeeze=False, layout="constrained")
    for r, (m, found) in enumerate(sorted(maps.items())):
        for c, name in enumerate(stats):
            ax = axes[r, c]
            if name in found:
                vmax = None if name == "entropy" else 1.0
                im = ax.imshow(found[name], aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax)
                fig.colorbar(im, ax=ax, fraction=0.05)
            ax.set_title(f"{m}: {name}", fontsize=7)
            ax.set_xlabel("head", fontsize=6)
            ax.set_ylabel("layer", fontsize=6)
            ax.tick_params(labelsize=5)
    fig.suptitle(title, fontsize=9)
    save(fig, path)
    return True


def section(facts: ModelFacts, options: Options) -> Part:
    """The analyses section of one model."""
    sel, board, model, mslug, part = facts.sel, facts.board, facts.model, slug(facts.model), Part()
    ok = board[board[Col.STATUS] == "ok"]
    parts = {name: _part(ok, name) for name in ("importance", "seeds", "heads")}
    if not any(len(p) for p in parts.values()):
        return part
    label = sel.label
    part.add("### Interpretability analyses", "", "On a fixed dev subset after training (see docs/analyses.md).", "")
    if len(parts["importance"]):
        part.add("Attention vs input importance (Kendall τ between attention and importance over content tokens; "
                 "H: entropy in nats; mean over runs of each run's mean over its examples):", "",
                 importance_table(sel, parts["importance"], label), "")
    pairs = seed_pairs(parts["seeds"]) if len(parts["seeds"]) else {}
    measure = MEASURES["content"]
    if pairs and not any(p["jsd"] for p in pairs.values()):
        # records written before the content-token measure keep only the [CLS] row with boundary tokens: show that,
        # named as such, rather than an empty column
        pairs, measure = seed_pairs(parts["seeds"], tokens="boundary"), MEASURES["boundary"]
    if pairs:
        note = "" if measure is MEASURES["content"] else (
            " The records predate the content-token measure, so the JSD is that of the [CLS] attention row with the "
            "[CLS]/[SEP] tokens kept, which largely measures attention to those boundary tokens.")
        part.add("Variance across seeds (per dev example and pair of seeds of the same cell):" + note, "",
                 seeds_table(sel, pairs, label, measure), "")
        path = options.figure(f"analysis_seeds_{mslug}.png")
        if options.figures and plot_seed_violins(pairs, sel.methods, f"variance across seeds, {model}", path, measure):
            part.link(path, "JS divergence of attention and TVD of predictions across seeds")
    if len(parts["heads"]):
        path = options.figure(f"analysis_heads_{mslug}.png")
        title = f"what the heads look at, {model} (mean over tasks and seeds)"
        if options.figures and plot_head_maps(parts["heads"], sel.methods, title, path):
            part.link(path, "attention mass on [CLS], [SEP], punctuation and entropy per layer and head")
    return part
