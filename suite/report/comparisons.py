"""Every comparison of a method with the reference method in one model's leaderboard, corrected as one family.

Per task: the mean paired difference (pairs by seed) with a bootstrap interval over seeds, the paired t-test, and
almost stochastic order. Per benchmark average: the same on each seed's average over the averaged tasks (seeds that
ran every averaged task for both methods). The p-values of all these tests form one family, adjusted together.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np

from suite.report import significance as sig
from suite.report.examples import example_bootstrap_ci, seed_predictions
from suite.report.registry_info import higher_is_better, task_display


@dataclasses.dataclass
class Comparison:
    method: str
    column: str               # task name, or an average's header
    n: int                    # seeds in both cells
    diff: float = math.nan    # mean paired difference (method - reference), display scale
    low: float = math.nan     # bootstrap interval of `diff`
    high: float = math.nan
    p: float = math.nan       # paired t-test, two-sided
    p_adj: float = math.nan   # after the correction across the table
    aso: float = math.nan     # epsilon_min of "method better than reference" (direction of the task's metric)
    significant: bool = False
    example_low: float = math.nan    # bootstrap interval over dev examples (runs that kept predictions)
    example_high: float = math.nan
    # seeds with which the paired t-test at the first step of the correction would detect `diff` with 80% power
    # (sd pooled over the task's comparisons; inf: more than 10,000; NaN: not estimable)
    seeds_for_diff: float = math.nan

    @property
    def tested(self) -> bool:
        return math.isfinite(self.p)


def compare_pairs(method: str, column: str, a: np.ndarray, b: np.ndarray, seed: int) -> Comparison:
    c = Comparison(method, column, len(a))
    if len(a):
        d = a - b
        c.diff = float(np.mean(d))
        c.low, c.high = sig.bootstrap_ci(d, seed=seed)
        c.p = float(sig.paired_t_p(d))
    return c


def seed_averages(cells: dict, method: str, tasks: list[str]) -> dict[float, float]:
    """{seed: mean over `tasks` of the method's score at that seed}, for seeds that ran all of them."""
    per_task = [cells[method, t].by_seed() for t in tasks]
    if not tasks or not all(per_task):
        return {}
    seeds = set.intersection(*(set(d) for d in per_task))
    return {s: float(np.mean([d[s] for d in per_task])) for s in seeds}


def compare_model(rep, sel, board, cells: dict, avgs: list) -> dict[tuple[str, str], Comparison]:
    """{(method, task or average header): Comparison} for every method except the reference."""
    base = rep.baseline
    out, samples = {}, {}
    for i, m in enumerate(x for x in sel.methods if x != base):
        for j, t in enumerate(sel.tasks):
            a, b = sig.paired(cells[m, t].by_seed(), cells[base, t].by_seed())
            out[m, t] = compare_pairs(m, t, a, b, seed=1000 * i + j)
            samples[m, t] = (cells[m, t].values, cells[base, t].values, higher_is_better(t))
        for a_ in avgs:
            a, b = sig.paired(seed_averages(cells, m, a_.tasks), seed_averages(cells, base, a_.tasks))
            out[m, a_.header] = compare_pairs(m, a_.header, a, b, seed=1000 * i + 999)
            samples[m, a_.header] = (a, b, True)
    correct(out, rep.correction, rep.alpha)
    add_seeds_for_diff(out, sel, cells, base, rep.alpha)
    if rep.aso:
        add_aso(out, samples)
    add_example_intervals(out, sel, board, base)
    return out


def correct(comparisons: dict, correction: str, alpha: float) -> None:
    keys = sorted(comparisons)
    adjusted = sig.adjust(np.array([comparisons[k].p for k in keys]), correction)
    for k, p_adj in zip(keys, adjusted):
        comparisons[k].p_adj = float(p_adj)
        comparisons[k].significant = bool(np.isfinite(p_adj) and p_adj < alpha)


def add_aso(comparisons: dict, samples: dict) -> None:
    """epsilon_min per comparison (the scores' direction made "higher is better"), deepsig-corrected for the
    number of comparisons it is computed for."""
    keys = [k for k in sorted(comparisons) if len(samples[k][0]) > 1 and len(samples[k][1]) > 1]
    for i, k in enumerate(keys):
        a, b, higher = samples[k]
        comparisons[k].aso = sig.aso_epsilon(a if higher else -a, b if higher else -b, len(keys), seed=i)


def add_example_intervals(comparisons: dict, sel, board, base: str) -> None:
    if not (board["predictions"] != "").any():
        return
    preds = {(m, t): seed_predictions(board[(board["method"] == m) & (board["task"] == t)])
             for m in sel.methods for t in sel.tasks}
    for i, (m, t) in enumerate(k for k in sorted(comparisons) if k[1] in sel.tasks):
        if preds[m, t] and preds[base, t]:
            c = comparisons[m, t]
            c.example_low, c.example_high = example_bootstrap_ci(t, preds[m, t], preds[base, t], seed=i)


def family_size(comparisons: dict) -> int:
    return sum(c.tested for c in comparisons.values())


def task_differences(sel, cells: dict, base: str, task: str) -> list[np.ndarray]:
    """Each method's paired differences to the reference on one task."""
    return [np.subtract(*sig.paired(cells[x, task].by_seed(), cells[base, task].by_seed()))
            for x in sel.methods if x != base]


def add_seeds_for_diff(comparisons: dict, sel, cells: dict, base: str, alpha: float) -> None:
    """How many seeds would make each task comparison's observed difference detectable. Observed differences
    overstate true ones on average (the largest are the luckiest), so read it as a lower bound: where it is at
    most the seeds a study can afford, more seeds can decide the comparison."""
    m = family_size(comparisons)
    for t in sel.tasks:
        sd = sig.pooled_sd(task_differences(sel, cells, base, t))
        for x in sel.methods:
            c = comparisons.get((x, t))
            if m and c is not None and c.tested and sd > 0 and c.diff != 0:
                need = sig.seeds_needed(abs(c.diff), sd, alpha / m)
                c.seeds_for_diff = float(need) if need else math.inf


def within_reach(comparisons: dict, seeds: int) -> list[Comparison]:
    """Task comparisons not significant yet whose observed difference `seeds` seeds would detect."""
    return [c for c in comparisons.values()
            if c.tested and not c.significant and math.isfinite(c.seeds_for_diff) and c.seeds_for_diff <= seeds]


def power_lines(comparisons: dict, sel, cells: dict, base: str, alpha: float) -> list[str]:
    """Per task: minimum detectable difference at the table's seed count and seeds needed for 1 point."""
    m = family_size(comparisons)
    if not m:
        return []
    level = alpha / m
    parts = []
    for t in sel.tasks:
        diffs = task_differences(sel, cells, base, t)
        counts = Counter(len(d) for d in diffs if len(d) > 1)
        sd = sig.pooled_sd(diffs)
        if not counts or not sd > 0:
            parts.append(f"{task_display(t)}: no variation between paired seeds to estimate it from")
            continue
        n = counts.most_common(1)[0][0]
        mdd, need = sig.min_detectable(sd, n, level), sig.seeds_needed(1.0, sd, level)
        parts.append(f"{task_display(t)}: {mdd:.1f} points with {n} seeds (sd of paired differences {sd:.2f}); "
                     f"1 point needs {need if need else 'more than 10,000'} seeds")
    return parts
