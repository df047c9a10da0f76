"""What a tuned study's budget says: the Tuning section's protocol sentence and per-method table (how many
configurations each method tried, which learning rates, how many tuning seeds), and the Expected validation
performance section (Dodge et al. 2019, "Show your work").

Expected validation performance: per (model, task, method), the expected best tuning-split score when k of the
configurations the method tried are drawn at random (with replacement), k = 1..N, from each configuration's mean
score over the tuning seeds as the selection file holds it (`suite.stats.evp`). Where two methods' curves cross, the
ranking depends on how many configurations each was given, so a difference at one budget may be an artefact of that
budget. The section reads the selection files the Tuning section reads (OUT/tuning/selection.json, read once into
`Loaded.selections` and held against their tuning records by `suite.report.selection.selections`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from suite.report.vocabulary import DASH, SCALE, Part, Table, fmt, slug, table, task_display
from suite.run.layout import SelectedCell, TuningProtocol
from suite.stats.evp import MIN_TUNING_SEEDS, expected_best

__all__ = ["KIND", "method_rows", "section", "seeds_warning", "tuned_with"]

LR = "train.lr"
KIND = "expected_performance"  # the exported table (document.EXPORTS)
BANDS = 4                      # a panel with at most this many methods draws their ±std bands


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def tuned_with(p: TuningProtocol) -> str:
    """How each method's configurations were chosen, for the Tuning section's first sentence."""
    seeds = f"tuning seed{'s' if len(p.seeds) != 1 else ''} {', '.join(map(str, p.seeds))}"
    if p.budget == "all":
        return (f"on its whole grid (the shared settings crossed with its own hyper-parameters; each method's number "
                f"of configurations is in the table below) x {seeds}")
    how = ("a stratified draw, every learning rate at least once" if p.draw == "stratified"
           else "a uniform draw, which may leave a learning rate untried")  # no name: the draw before strata
    return f"with the same budget ({p.budget} configurations per method; from a larger grid, {how}) x {seeds}"


def seeds_warning(p: TuningProtocol) -> list[str]:
    """A paragraph when the selection rests on fewer than MIN_SEEDS tuning seeds, else nothing."""
    from suite.stats.evp import MIN_TUNING_SEEDS as MIN_SEEDS

    if len(p.seeds) >= MIN_SEEDS:
        return []
    return [f"**The selection rests on {len(p.seeds)} tuning seed{'s' if len(p.seeds) != 1 else ''}, fewer than "
            f"{MIN_SEEDS}**: a configuration's score on one seed mixes its quality with that seed's luck, which can "
            f"pick the configuration (Bouthillier et al. 2021); docs/protocol.md recommends {MIN_SEEDS} or more.",
            ""]


def method_rows(p: TuningProtocol, cells: Sequence[SelectedCell]) -> list[str]:
    """The per-method table: search space, grid points, configurations tried and learning rates tried."""
    tried: dict[str, list] = {}
    for cell in cells:
        tried.setdefault(cell.method, [c.settings for c in cell.configurations])
    lines = ["| method | search space | grid points | configurations tried | learning rates tried |",
             "|---|---|---:|---:|---|"]
    for method, space in p.space.items():
        points = math.prod(len(set(map(str, v))) for v in space.values())
        settings = tried.get(method, [])
        lrs = list(dict.fromkeys(space.get(LR, [])))
        seen = [lr for lr in lrs if any(s.get(LR) == lr for s in settings)]
        missing = [lr for lr in lrs if lr not in seen]
        text = f"{len(seen)} of {len(lrs)}" + (f" (never {', '.join(map(_value, missing))})" if missing else "")
        lines.append(f"| {method} | " + "; ".join(f"{k}: " + ", ".join(map(_value, v)) for k, v in space.items())
                     + f" | {points} | {len(settings) if settings else DASH} | {text if settings else DASH} |")
    return lines


def _curves(cells: Sequence[SelectedCell]) -> dict[tuple[str, str], dict[str, tuple[np.ndarray, np.ndarray, bool]]]:
    """(model, task) -> method -> (expected best x100 at k = 1..N, its std, higher is better)."""
    found: dict[tuple[str, str], dict] = {}
    for cell in cells:
        means, stds = expected_best([c.mean for c in cell.configurations], cell.higher_is_better)
        if len(means):
            found.setdefault((cell.model, cell.task), {})[cell.method] = (SCALE * means, SCALE * stds,
                                                                          cell.higher_is_better)
    return found


def _leaders(curves: dict[str, tuple[np.ndarray, np.ndarray, bool]]) -> str:
    """Which method has the best expected score at each k (among those that tried k or more)."""
    depth = max(len(m) for m, _, _ in curves.values())
    runs: list[list] = []
    for k in range(1, depth + 1):
        at = {m: c[0][k - 1] for m, c in curves.items() if len(c[0]) >= k}
        higher = next(iter(curves.values()))[2]
        best = (max if higher else min)(at, key=at.get)
        if runs and runs[-1][0] == best:
            runs[-1][2] = k
        else:
            runs.append([best, k, k])
    text = "; ".join(f"k = {a}" + (f"–{b}" if b > a else "") + f": {m}" for m, a, b in runs)
    if len(runs) == 1:
        return f"{runs[0][0]} leads at every k."
    return f"Best expected score by k: {text}. **The leader changes with the budget.**"


def _task_table(curves: dict[str, tuple[np.ndarray, np.ndarray, bool]], spread: bool = True
                ) -> tuple[list[str], list[list[str]]]:
    """The task's rows; `spread`: with ± the sd of the best of k draws (only where the configurations' scores rest
    on MIN_TUNING_SEEDS tuning seeds or more: below that the spread is one seed's luck, not an uncertainty)."""
    depth = max(len(m) for m, _, _ in curves.values())
    headers = ["method", "N", *[f"k = {k}" for k in range(1, depth + 1)]]
    rows = [[m, str(len(mean)), *[(f"{fmt(mean[k])} ± {fmt(std[k])}" if spread else fmt(mean[k])) if k < len(mean)
                                  else DASH
                                  for k in range(depth)]] for m, (mean, std, _) in curves.items()]
    return headers, rows


def _plot(curves: dict[tuple[str, str], dict], model: str, path: Path, spread: bool = True) -> None:
    """One panel per task: each method's expected best tuning-split score against k, with a ±std band (`spread`)."""
    from suite.report.figures import band, grid, method_colors, method_styles, save

    tasks = [key for key in curves if key[0] == model]
    shown = list(dict.fromkeys(m for key in tasks for m in curves[key]))
    colors, styles = method_colors(shown), method_styles(shown)
    fig, axes = grid(len(tasks), per_row=4, width=3.4, height=2.8)
    for ax, key in zip(axes, tasks):
        few = spread and len(curves[key]) <= BANDS  # more methods' bands would hide each other
        for m, (mean, std, _) in curves[key].items():
            band(ax, np.arange(1, len(mean) + 1), mean, std if few else np.full_like(std, np.nan), colors[m],
                 styles[m], label=m)
        ax.set_title(f"{task_display(key[1])}, {model}", fontsize=9)
        ax.set_xlabel("configurations drawn (k)")
        ax.set_ylabel("expected best tuning score x100")
        ax.xaxis.get_major_locator().set_params(integer=True)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=7)
    save(fig, path)


def section(report, options) -> Part:
    """The section for the reported selection files (`Loaded.selections`; an empty Part when none), its table per
    model exported as (model, KIND), its figure per model `evp_MODEL.png`."""
    part = Part()
    for path, data in report.loaded.selections:
        curves = _curves(data.cells)
        if not curves:
            continue
        if not part.lines:
            part.add("", "## Expected validation performance", "",
                     "Per task and method: the expected best tuning-split score (x100, ± its standard deviation where "
                     f"the configurations' scores rest on {MIN_TUNING_SEEDS} or more tuning seeds) "
                     "when k of the N configurations the method tried are drawn at random, with replacement "
                     "(Dodge et al. 2019), from each configuration's mean over the tuning seeds. At k = 1 it is the "
                     "score of a configuration picked blindly, at k = N close to the best tried. Where curves cross, "
                     "which method looks better depends on how many configurations each was given: a ranking at "
                     "one budget may be an artefact of that budget. Scored on the tuning split, never dev.", "")
        seeds = len(data.protocol.seeds)
        spread = seeds >= MIN_TUNING_SEEDS
        part.add(f"From `{path}`: each configuration's mean over {seeds} tuning seed{'s' if seeds != 1 else ''}."
                 + ("" if spread else f" No ± is shown: with fewer than {MIN_TUNING_SEEDS} tuning seeds the spread "
                    "of the best of k draws is that of one seed's scores over the configurations tried, not an "
                    "uncertainty of the expected score."), "")
        for model in dict.fromkeys(model for model, _ in curves):
            depth = max(len(c[0]) for (m, _), by in curves.items() if m == model for c in by.values())
            rows = []
            for (m, task), by_method in curves.items():
                if m != model:
                    continue
                headers, task_rows = _task_table(by_method, spread)
                part.add(f"### {task_display(task)} (`{model}`)", "", table(task_rows, headers), "",
                         _leaders(by_method), "")
                rows += [[task, *r, *[DASH] * (depth + 2 - len(r))] for r in task_rows]
            part.tables[model, KIND] = Table(["task", "method", "N", *[f"k = {k}" for k in range(1, depth + 1)]], rows)
            figure = options.figure(f"evp_{slug(model)}.png")
            if options.figures:
                _plot(curves, model, figure, spread)
                part.link(figure, f"expected best tuning score against the configurations drawn, {model}")
    return part
