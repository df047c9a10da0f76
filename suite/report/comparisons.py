"""Every comparison of a method with the reference method in one model's leaderboard, with its verdict.

Per task: `suite.stats.evidence.compare_runs` over seeds and dev examples (runs paired by seed; the dev-example part
from the predictions runs keep beside their records). Per benchmark average: the same on each seed's average over the
averaged tasks (seeds that ran every averaged task for both methods); its dev-example variance is the sum of the
tasks' over the number of tasks squared (the tasks' dev sets are independent). The p-values are adjusted within
families (`suite.stats.families`), and each comparison gets a verdict: better / worse / equivalent / undecided.
"""
from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Mapping

import numpy as np
import pandas as pd

from suite.report import significance as sig
from suite.report.formatting import SCALE
from suite.report.registry_info import higher_is_better
from suite.stats import collapse, families
from suite.stats.evidence import DEFAULT_MARGIN, Evidence, RunOutcome, compare_runs, evidence_arrays, verdict
from suite.stats.power import effect_size, seeds_needed

ASO_MIN_SEEDS = 5     # below this almost stochastic order is 0 whenever the two sets of scores do not overlap


@dataclasses.dataclass
class Comparison:
    method: str
    column: str               # task name, or an average's header
    n: int                    # seeds in both cells
    diff: float = math.nan    # mean paired difference (method - reference), x100
    low: float = math.nan     # 95% interval over seeds and dev examples
    high: float = math.nan
    se: float = math.nan
    df: float = math.nan
    p: float = math.nan       # two-sided test of no difference
    p_adj: float = math.nan   # adjusted within the comparison's family
    p_equiv: float = math.nan  # TOST of |diff| < margin
    p_equiv_adj: float = math.nan
    margin: float = DEFAULT_MARGIN
    family: str = families.ALL
    verdict: str = "undecided"
    # total seeds with which an undecided comparison would be decided with 80% power if its true difference were
    # the observed one (inf: none up to 10,000; NaN: not estimable or already decided)
    seeds_needed: float = math.nan
    example_se: float = math.nan   # dev-example part of se (NaN: no predictions, evidence over seeds only)
    effect_size: float = math.nan  # diff over one seed's sd with the dev-example noise included (suite.stats.power)
    aso: float = math.nan     # epsilon_min of "method better than reference", only where outcomes are bimodal
    # a study run with --until-decided: `verdict` is its sequential design's (whose error rate holds over the looks)
    # and `sequential` the reason it stopped; `fixed_verdict` treats all the seeds as one fixed-size sample
    sequential: str = ""
    fixed_verdict: str = "undecided"

    @property
    def tested(self) -> bool:
        return math.isfinite(self.p)

    @property
    def significant(self) -> bool:
        return self.verdict in ("better", "worse")


def per_task(value: float | Mapping[str, float] | None, task: str, default: float) -> float:
    """A study value that is one number or a mapping task -> number (with an optional `default` entry)."""
    if value is None:
        return default
    if isinstance(value, Mapping):
        return float(value.get(task, value.get("default", default)))
    return float(value)


def outcomes(sub: pd.DataFrame) -> dict[int, RunOutcome]:
    ok = sub[(sub["status"] == "ok") & np.isfinite(sub["score"].astype(float))]
    return {int(r.seed): RunOutcome(float(r.score) * SCALE, r.predictions or None) for r in ok.itertuples()}


def from_evidence(method: str, column: str, ev: Evidence) -> Comparison:
    return Comparison(method, column, ev.n_seeds, ev.diff, ev.low, ev.high, ev.se, ev.df, ev.p, margin=ev.margin,
                      p_equiv=ev.p_equiv, example_se=ev.example_se if ev.example_se > 0 else math.nan,
                      effect_size=effect_size(ev))


def seed_averages(cells: dict, method: str, tasks: list[str]) -> dict[float, float]:
    """{seed: mean over `tasks` of the method's score at that seed}, for seeds that ran all of them."""
    per_task_ = [cells[method, t].by_seed() for t in tasks]
    if not tasks or not all(per_task_):
        return {}
    seeds = set.intersection(*(set(d) for d in per_task_))
    return {s: float(np.mean([d[s] for d in per_task_])) for s in seeds}


def compare_model(options, sel, board, cells: dict, avgs: list, bases: Mapping,
                  sequential: Mapping = MappingProxyType({})) -> dict[tuple[str, str], Comparison]:
    """{(method, task or average header): Comparison} for every method except the reference. `sequential`:
    `suite.report.sequential_section.verdicts` of the folders reported."""
    base = options.baseline
    out: dict[tuple[str, str], Comparison] = {}
    evidence: dict[tuple[str, str], Evidence] = {}
    runs = {(m, t): outcomes(board[(board["method"] == m) & (board["task"] == t)])
            for m in sel.methods for t in sel.tasks}
    for i, m in enumerate(x for x in sel.methods if x != base):
        for j, t in enumerate(sel.tasks):
            ev = compare_runs(t, runs[m, t], runs[base, t], per_task(options.margin, t, DEFAULT_MARGIN),
                              seed=1000 * i + j, higher_is_better=higher_is_better(t))
            evidence[m, t], out[m, t] = ev, from_evidence(m, t, ev)
        for a_ in avgs:
            a, b = sig.paired(seed_averages(cells, m, a_.tasks), seed_averages(cells, base, a_.tasks))
            k = max(len(a_.tasks), 1) ** 2
            example_var = sum(evidence[m, t].example_se ** 2 for t in a_.tasks) / k
            shared = sum(evidence[m, t].example_shared_se ** 2 for t in a_.tasks) / k
            arr = evidence_arrays(a - b, example_var, per_task(options.margin, a_.header, DEFAULT_MARGIN))
            ev = Evidence(len(a), *(float(arr[k]) for k in ("diff", "se", "df", "low", "high", "p", "p_equiv")),
                          margin=per_task(options.margin, a_.header, DEFAULT_MARGIN),
                          seed_sd=float(arr["seed_sd"]), example_se=math.sqrt(example_var),
                          example_shared_se=math.sqrt(shared))
            evidence[m, a_.header], out[m, a_.header] = ev, from_evidence(m, a_.header, ev)
    ran = {(m, t): found for (model, m, t, ref), found in sequential.items() if model == sel.model and ref == base}
    decide(out, evidence, options.primary, options.correction, options.alpha, {a_.header for a_ in avgs}, ran)
    if options.aso:
        add_aso(out, sel, cells, bases, options.collapse_floor, base)
    return out


def family_of(method: str, column: str, primary, averages) -> str:
    """A method or task named primary covers its task comparisons. A benchmark average is derived from those, so it
    is primary only where the list names the column itself (or METHOD:column): the family is the one `run
    --until-decided` spends its alpha over."""
    family = families.family_of(method, column, primary)
    if family == families.PRIMARY and column in averages and not any(
            entry in (column, f"{method}:{column}") for entry in primary):
        return families.EXPLORATORY
    return family


def decide(comparisons: dict, evidence: dict, primary, correction: str, alpha: float,
           averages: set[str] = frozenset(), sequential: Mapping = MappingProxyType({})) -> None:
    """Families, adjusted p-values, verdicts, and seeds needed for the undecided. `averages`: the headers of the
    benchmark-average columns; `sequential`: {(method, task): (verdict, stopping reason)} of a sequential design,
    whose verdict replaces the fixed-sample one (kept as `fixed_verdict`)."""
    for c in comparisons.values():
        c.family = family_of(c.method, c.column, primary, averages)
    for family in {c.family for c in comparisons.values()}:
        keys = sorted(k for k, c in comparisons.items() if c.family == family)
        how = families.correction_of(family, correction)
        p_adj = families.adjust([comparisons[k].p for k in keys], how)
        p_equiv_adj = families.adjust([comparisons[k].p_equiv for k in keys], how)
        tested = sum(comparisons[k].tested for k in keys)
        for k, p, pe in zip(keys, p_adj, p_equiv_adj):
            c, ev = comparisons[k], evidence[k]
            c.p_adj, c.p_equiv_adj = float(p), float(pe)
            c.verdict = c.fixed_verdict = verdict(dataclasses.replace(ev, p=float(p), p_equiv=float(pe)), alpha)
            if k in sequential:
                c.verdict, c.sequential = sequential[k]
            if c.verdict == "undecided" and tested:
                # the level the correction tests the first (Holm: alpha / m) or the last (BH: alpha) step at
                c.seeds_needed = seeds_needed(ev, alpha / tested if how == "holm" else alpha)


def floors(sel, bases: Mapping, collapse_floor) -> dict[str, float]:
    """Each task's collapse floor (x100): its constant predictor's score plus the declared margin."""
    return {t: collapse.floor(bases[t].constant if t in bases else math.nan,
                              per_task(collapse_floor, t, collapse.DEFAULT_MARGIN), higher_is_better(t))
            for t in sel.tasks}


def add_aso(comparisons: dict, sel, cells: dict, bases: Mapping, collapse_floor, base: str) -> None:
    """epsilon_min, only for task comparisons with bimodal outcomes (collapsed and healthy runs) on either side and
    at least ASO_MIN_SEEDS seeds on both: there the mean difference mixes how often a method collapses with how
    well it does otherwise, and almost stochastic order says whether one score distribution dominates the other.
    Elsewhere it adds nothing the interval does not say (at 3-5 seeds it is 0 whenever the scores do not overlap)."""
    fl = floors(sel, bases, collapse_floor)
    keys = [k for k in sorted(comparisons) if k[1] in sel.tasks]
    chosen = []
    for m, t in keys:
        a, b = cells[m, t].values, cells[base, t].values
        higher = higher_is_better(t)
        if min(len(a), len(b)) >= ASO_MIN_SEEDS and (collapse.bimodal(a, fl[t], higher)
                                                     or collapse.bimodal(b, fl[t], higher)):
            chosen.append((m, t))
    for i, (m, t) in enumerate(chosen):
        a, b, higher = cells[m, t].values, cells[base, t].values, higher_is_better(t)
        comparisons[m, t].aso = sig.aso_epsilon(a if higher else -a, b if higher else -b, len(chosen), seed=i)


def family_sizes(comparisons: dict) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for c in comparisons.values():
        sizes[c.family] = sizes.get(c.family, 0) + c.tested
    return sizes


def within_reach(comparisons: dict, seeds: int) -> list[Comparison]:
    """Undecided comparisons that at most `seeds` seeds would decide."""
    return [c for c in comparisons.values()
            if c.verdict == "undecided" and math.isfinite(c.seeds_needed) and c.seeds_needed <= seeds]
