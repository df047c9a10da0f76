"""The leaderboard table with its baseline rows and notes, its costs and parameters in a small table below it, the
reference tasks' table, and the in-run step times shown as context; the differences to the reference method and the
comparisons behind them follow the leaderboard (`suite.report.differences`).

Reference tasks: tasks a study runs for context (e.g. ones the model does not learn at its budget), shown against
their majority-class level in their own table and left out of the leaderboard's comparisons and averages.
"""
from __future__ import annotations

import math

import pandas as pd

from suite.report import differences
from suite.report.costs import GPU_MEMORY_KINDS, geometric_mean
from suite.report.facts import Average, Baseline, Cell, ModelFacts, Options
from suite.report.header import machine_keys
from suite.report.load import Col
from suite.report.selection import Selection, has_variation, setting_text
from suite.report.vocabulary import (
    DASH,
    Part,
    Table,
    average_note,
    fmt,
    higher_is_better,
    metric_order,
    reconstruction_note,
    table,
    task_display,
    task_order,
    unique,
)

__all__ = ["COSTS", "in_run_costs", "reference_tasks", "section"]

NEAR_MAJORITY = "°"        # a cell not distinguishable from the majority-class (or constant-mean) predictor


def _best_key(means: dict[str, float], higher: bool, excluded: set[str] = frozenset()) -> str | None:
    """The best entry at the displayed precision if no other ties it and it is not excluded; else None."""
    shown = {k: round(v, 2) for k, v in means.items() if math.isfinite(v)}
    if not shown:
        return None
    ranked = sorted(shown.items(), key=lambda kv: -kv[1] if higher else kv[1])
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None
    return None if ranked[0][0] in excluded else ranked[0][0]


def _average_text(avg: Average, method: str, best: str | None) -> str:
    value, k = avg.values[method]
    text = DASH if not k else fmt(value)
    if k and method == best:
        text = f"**{text}**"
    if k and k < len(avg.tasks):
        text += f" ({k} of {len(avg.tasks)})"
    return text


def _baseline_rows(sel: Selection, bases: dict[str, Baseline], n_avgs: int, n_rest: int) -> list[list[str]]:
    if not any(b.available for b in bases.values()):
        return []
    kinds = sorted({b.constant_kind for b in bases.values() if b.available}, key=("majority", "constant_mean").index)
    name = " / ".join("majority class" if k == "majority" else "constant mean" for k in kinds)
    const = [fmt(bases[t].constant) if bases[t].available else DASH for t in sel.tasks]
    chance = [fmt(bases[t].chance) if bases[t].available else DASH for t in sel.tasks]
    return [[f"*{name} (baseline)*", *const, *[DASH] * (n_avgs + n_rest)],
            ["*chance (baseline)*", *chance, *[DASH] * (n_avgs + n_rest)]]


PARAMS = ["extra params", "training-only params"]
COSTS = "#### Costs and parameters"


def section(facts: ModelFacts, options: Options) -> Part:
    """The leaderboard (scores), its costs and parameters below it, then (with the reference method among the
    model's) the differences and comparisons. The exported table (leaderboard.csv and .tex) holds both in one."""
    sel, board, cells, avgs, bases = facts.sel, facts.board, facts.cells, list(facts.averages), facts.baselines
    part = Part()
    marked = {(m, t) for m in sel.methods for t in sel.tasks if (m, t) in facts.above and not facts.above[m, t].better}
    best = {t: _best_key({m: cells[m, t].mean for m in sel.methods}, higher_is_better(t),
                        {m for m in sel.methods if (m, t) in marked}) for t in sel.tasks}
    best_avg = {a.benchmark: _best_key({m: a.values[m][0] for m in a.full(sel.methods)}, True) for a in avgs}
    floor = facts.floors
    cost_headers, cost_cells, cost_note = facts.costs.headers, facts.costs.cells, facts.costs.note
    scores = ["method", *[task_display(t) for t in sel.tasks], *[a.header for a in avgs]]
    rows = []
    for m in sel.methods:
        rows.append([sel.label(m),
                     *[cells[m, t].text(bold=best[t] == m, mark=NEAR_MAJORITY if (m, t) in marked else "",
                                        floor=floor[t], higher=higher_is_better(t)) for t in sel.tasks],
                     *[_average_text(a, m, best_avg[a.benchmark]) for a in avgs], *cost_cells.get(m, []),
                     _param_text(board, m, Col.EXTRA), _param_text(board, m, Col.TRAINING_ONLY)])
    rows += _baseline_rows(sel, bases, len(avgs), len(cost_headers) + len(PARAMS))
    full = part.tables["leaderboard"] = Table([*scores, *cost_headers, *PARAMS], rows)
    part.add("### Leaderboard", "", full.columns(scores).markdown(), "")
    part.add(*_reference_warnings(facts, options))
    notes = ([_cells_note(sel, board), _baseline_note(options, bases), *_average_notes(avgs)]
             + _reference_note(facts, options) + _method_notes(sel, facts.ablation)
             + [f"Each method's costs and parameters: the table below ({COSTS.lstrip('# ')}); leaderboard.csv and "
                "leaderboard.tex hold both tables' columns in one table."])
    part.add(*[f"- {n}" for n in notes], "")
    methods = {sel.label(m) for m in sel.methods}
    part.add(COSTS, "", full.columns(["method", *cost_headers, *PARAMS], lambda row: row[0] in methods).markdown(), "",
             f"- {cost_note}", "- Extra params: parameters the method adds to the model (saved with it); "
             "training-only params: parameters used only while training (e.g. a generator network).", "")
    if options.baseline not in sel.methods:
        part.add(f"No `{options.baseline}` runs for this model: no differences or significance tests "
                 f"(choose another reference with --baseline).", "")
        return part
    part.extend(differences.section(facts, options))
    return part


def _cells_note(sel: Selection, board: pd.DataFrame) -> str:
    names = {t: {k for f in board.loc[board[Col.TASK] == t, Col.FINAL] for k in f.names} for t in sel.tasks}
    combined = [f"{task_display(t)}: mean of {', '.join(keys)}" for t in sel.tasks
                if len(keys := metric_order(t, names[t])) > 1]
    return ("Cells: headline dev metric x100 at the last epoch (the task's official metric, or the mean of its "
            "official metrics" + (f": {'; '.join(combined)}" if combined else "") + "), as mean ± sample std "
            "(number of seeds); \"–\" in place of a std: a single seed; a \"–\" cell: no run; failed (k): runs "
            "that did not finish; no score (k): finished runs without a finite score.")


def _baseline_note(options: Options, bases: dict[str, Baseline]) -> str:
    sources = {b.source for b in bases.values()}
    missing = sorted({b.source for b in bases.values() if not b.available})
    where = ("from the records (the runner scores them on the dev labels it evaluated on)" if sources == {"records"}
             else "from the dev labels the runs were evaluated on (read from the data folder, subset as the runner "
                  "subsets them)" if "data" in sources or "records" in sources else "")
    text = (f"Baseline rows: a predictor that always outputs the dev set's majority class (classification) or the "
            f"dev mean (regression; its correlations are undefined and count as 0), and uniformly random "
            f"predictions (chance, mean of 100 seeded draws), {where}. {NEAR_MAJORITY}: not distinguishable from "
            "the majority / constant predictor (one-sided test over seeds and dev examples, p ≥ "
            f"{options.alpha:g}; over seeds only on regression tasks and for runs without predictions; a single "
            "seed: not above it). Bold: the best mean of a column, only when no other mean ties it at the shown "
            f"precision and it is not marked {NEAR_MAJORITY}.")
    if missing:
        text += " Baseline unavailable for " + ", ".join(
            f"{task_display(t)} ({b.source})" for t, b in bases.items() if not b.available) + "."
    return text


def _reference_note(facts: ModelFacts, options: Options) -> list[str]:
    """Whether the reference learned each task at all: a comparison against a reference that does not beat the
    majority class says nothing about the methods. The same test as the leaderboard's mark
    (`suite.stats.constant`)."""
    sel = facts.sel
    if options.baseline not in sel.methods:
        return []
    parts = []
    for t in sel.tasks:
        v = facts.above.get((options.baseline, t))
        if v is None:
            continue
        no_score = facts.cells[options.baseline, t].no_score
        test = "no test" if v.runs == 1 else f"p = {v.p:.2g}" + (", over seeds only" if v.seeds_only else "")
        runs = f"{v.runs} seed{'s' if v.runs != 1 else ''}" + (f", {no_score} without a score" if no_score else "")
        parts.append(f"{task_display(t)} {v.margin:+.2f} ({runs}, {test})"
                     + ("" if v.better else f" — not better at p < {options.alpha:g}"))
    if not parts:
        return []
    return [f"The reference `{options.baseline}` against the majority / constant predictor (its margin in points, "
            "positive = better; one-sided test over seeds and dev examples, the constant predictor re-scored on "
            "the same resampled examples; over seeds only on regression tasks and where the runs kept no "
            "predictions; runs without a score counted at the predictor's score): "
            + "; ".join(parts) + "."]


def _reference_warnings(facts: ModelFacts, options: Options) -> list[str]:
    """A line of its own where the reference does not beat the majority / constant predictor (the test of
    `_reference_note`): every difference on that task is then one to a predictor that learned nothing."""
    sel = facts.sel
    if options.baseline not in sel.methods:
        return []
    lost = [(t, v) for t in sel.tasks if (v := facts.above.get((options.baseline, t))) is not None and not v.better]
    return [f"- **Warning: the reference `{options.baseline}` scores at the majority / constant predictor on "
            f"{task_display(t)}** ({v.margin:+.2f} points, {v.runs} seed{'s' if v.runs != 1 else ''}, not better "
            f"at p < {options.alpha:g}): it learned nothing there, so every difference to it on {task_display(t)} is "
            "one to a constant predictor; train it longer or on more examples before reading those rows."
            for t, v in lost] + ([""] if lost else [])


def _average_notes(avgs: list[Average]) -> list[str]:
    notes = []
    for a in avgs:
        names = ", ".join(task_display(t) for t in a.tasks) or "none"
        notes.append(f"{a.header}: unweighted mean of the per-task means over {names}"
                     + "".join(f"; {task_display(t)}: {average_note(t)}" if average_note(t)
                               else f"; {task_display(t)} left out of the average" for t in a.left_out)
                     + "; (k of N): the method has results for only k of those tasks, so its average is not "
                       "comparable (and not bolded).")
    return notes


def _method_notes(sel: Selection, ablation: pd.DataFrame) -> list[str]:
    notes = []
    for m in sel.methods:
        if not sel.hp_is_default[m]:
            text = setting_text(sel.hp_by_method[m].values, m) or "(as recorded)"
            notes.append(f"`{m}`: no runs with its default hyper-parameters; the row shows {text}.")
    swept = [m for m in sel.methods if has_variation(ablation, sel.model, m)]
    if swept:
        tuned = Col.TUNED in ablation and ablation[Col.TUNED].map(bool).any()
        notes.append("Methods with several settings (see the ablation tables): "
                     + ", ".join(f"`{m}`" for m in swept) + "; the leaderboard uses "
                     + ("the setting each cell's tuning selected where it has one (the Tuning section), else "
                        if tuned else "")
                     + "their default hyper-parameters where present.")
    notes += [f"† `{m}`: {reconstruction_note(m).rstrip('.')}." for m in sel.methods if reconstruction_note(m)]
    return notes


def _param_text(board: pd.DataFrame, method: str, column: str) -> str:
    vals = unique(board.loc[(board[Col.METHOD] == method) & (board[Col.STATUS] == "ok"), column].dropna().astype(int))
    if not vals:
        return DASH
    return f"{vals[0]:,}" if len(vals) == 1 else f"{vals[0]:,}–{vals[-1]:,}"


def reference_tasks(facts: ModelFacts, options: Options) -> Part:
    sel, part = facts.sel, Part()
    if not sel.reference_tasks:
        return part
    board, tasks, bases = facts.reference_board, sel.reference_tasks, facts.reference_baselines
    methods = [m for m in sel.methods if (board[Col.METHOD] == m).any()]
    rows = []
    for m in methods:
        row = [sel.label(m)]
        for t in tasks:
            cell = Cell.of(board[(board[Col.METHOD] == m) & (board[Col.TASK] == t)])
            near = (m, t) in facts.above and not facts.above[m, t].better
            row.append(cell.text(mark=NEAR_MAJORITY if near else ""))
        rows.append(row)
    rows.append(["*majority class / constant mean (baseline)*",
                 *[fmt(bases[t].constant) if bases[t].available else DASH for t in tasks]])
    part.add("### Reference tasks", "",
             f"Run for context and left out of the comparisons, differences and averages above: "
             f"{', '.join(task_display(t) for t in tasks)}. Cells as in the leaderboard; {NEAR_MAJORITY}: not "
             f"distinguishable from the majority / constant predictor (the leaderboard's one-sided test, p ≥ "
             f"{options.alpha:g}).", "", table(rows, ["method", *[task_display(t) for t in tasks]]), "")
    return part


def in_run_costs(facts: ModelFacts, options: Options) -> Part:
    """A labelled context table of in-run step times (and GPU peaks, never CPU RSS) relative to the reference."""
    sel, board, part = facts.sel, facts.board, Part()
    ok = board[board[Col.STATUS] == "ok"]
    base = options.baseline
    if base not in sel.methods or not (ok[Col.METHOD] == base).any():
        return part
    gpu = ok[Col.PEAK_KIND].isin(GPU_MEMORY_KINDS).all() and ok[Col.PEAK_MB].notna().any()
    keys = [repr(k) for k in machine_keys(ok)]   # a ratio across machines measures them too: ratios within one
    means = ok.assign(machine=keys).groupby([Col.METHOD, Col.TASK, "machine"])[[Col.STEP_S, Col.PEAK_MB]].mean()
    modes = ok.groupby(Col.METHOD)[Col.STEP_MODE].agg(lambda x: "/".join(sorted(set(x))))
    mixed = modes.nunique() > 1  # a captured step and an eager one differ by how they run, not only by the method
    machines = sorted(set(keys))
    per_task = ok[ok[Col.METHOD] == base].groupby(Col.TASK)[Col.STEP_S].mean()
    rows = []
    for m in sel.methods:
        row = [sel.label(m) + (f" ({modes.get(m, DASH)})" if mixed else "")]
        for col in (Col.STEP_S, Col.PEAK_MB) if gpu else (Col.STEP_S,):
            per_machine = ([means.loc[(m, t, k), col] / means.loc[(base, t, k), col] for k in machines
                            if (m, t, k) in means.index and (base, t, k) in means.index] for t in sel.tasks)
            found = [g for g in map(geometric_mean, per_machine) if math.isfinite(g)]
            shared = sum(t in per_task.index for t in sel.tasks)
            row.append(f"{fmt(geometric_mean(found))}×" + (f" ({len(found)} of {shared} tasks)"
                                                           if len(found) < shared else "") if found else DASH)
        rows.append(row)
    own = "; ".join(f"{task_display(t)} {fmt(per_task[t] * 1000, 1)} ms/step" for t in task_order(per_task.index))
    headers = ["method", f"in-run step time vs {base}"] + ([f"in-run GPU peak vs {base}"] if gpu else [])
    part.add("#### In-run step times (context, not a cost measurement)", "",
             table(rows, headers), "",
             f"- Wall-clock time per optimizer step inside each run, geometric mean over tasks of the ratio to "
             f"`{base}`'s mean{' on the same machine' if len(machines) > 1 else ''} (`{base}`: {own}"
             f"{', pooled over the machines' if len(machines) > 1 else ''}). These carry whatever else the machine "
             "ran meanwhile (other runs of a `--workers` pool included)"
             + ("" if gpu else "; in-run memory is not shown: on CPU the runs recorded the process's peak resident "
                               "set, which is not one method's cost") + ".",
             *([f"- The runs ran on {len(machines)} machines or device setups (the Machine lines above), so each "
                "ratio is taken between runs of the same task on the same machine, a task's ratio is the geometric "
                f"mean over its machines, and no ratio crosses machines (–: no step time on a machine where `{base}` "
                "ran the same task)."] if len(machines) > 1 else []),
             *(["- The methods' steps ran in different modes (in brackets: `captured`, replayed from CUDA graphs, or "
                "`eager`; `train.capture`, docs/running-grids.md): a ratio between modes measures the mode too. "
                "`python -m suite bench --loop --capture auto,off` compares both for each method."] if mixed else []),
             "")
    return part
