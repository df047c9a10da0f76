"""Every comparison of a method with the reference method in one model's leaderboard, with its verdict, and the
data-efficiency table's comparisons; the statistics are `suite.stats`'.

Per task: `suite.stats.evidence.compare_runs` over seeds and dev examples (runs paired by seed; the dev-example part
from the predictions runs keep beside their records). Per benchmark average: `suite.stats.evidence.averaged_evidence`
on each seed's average over the averaged tasks (seeds that ran every averaged task for both methods). The p-values are
adjusted within families (`suite.stats.families`), and each comparison gets a verdict: better / worse / equivalent /
undecided. Where a comparison's outcomes are bimodal, almost stochastic order too (`suite.stats.aso`).
"""
from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Mapping

import numpy as np
import pandas as pd

from suite.report.fragility import fragile_text
from suite.report.load import Col
from suite.report.vocabulary import DASH, fmt, higher_is_better
from suite.stats import aso, collapse, families
from suite.stats.curves import size_tests
from suite.stats.evidence import (
    DEFAULT_MARGIN,
    Evidence,
    RunOutcome,
    averaged_evidence,
    bootstrap_seed,
    compare_runs,
    per_task,
    verdict,
)
from suite.stats.power import effect_size, seeds_needed

__all__ = ["POWER_SIMULATIONS", "SEEDS_ONLY", "SEQUENTIAL", "Comparison", "compare_model", "curve_tests",
           "difference_text", "family_of", "family_sizes", "floors", "verdict_text", "within_reach"]

SEEDS_ONLY = "ˢ"   # no per-example predictions: the interval covers seed noise only
SEQUENTIAL = "‡"   # the verdict of the study's sequential design (run --until-decided)
POWER_SIMULATIONS = 1000   # per primary comparison and family size: Monte-Carlo error at most 1.6 points


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
    # the collapse endpoint: n counts the seeds where neither run degenerated, n_paired all paired seeds
    n_paired: int = 0
    degenerate: int = 0             # the method's degenerate runs among the paired seeds
    degenerate_reference: int = 0
    collapse_p: float = math.nan    # McNemar's exact test of equal rates
    collapse_p_adj: float = math.nan
    collapse_verdict: str = ""      # "degenerates more" / "degenerates less" where the adjusted p < alpha
    collapse_excess: int = 0        # the sign of McNemar's discordant difference: which way the verdict goes
    p_rope: float = math.nan        # Bayesian P(|Δ| < margin) (flat prior), beside the frequentist verdict
    # the paired sign test over every paired seed (suite.stats.sign), which a difference claim needs too from 10
    # paired seeds on; wins minus losses of the method (score orientation)
    p_sign: float = math.nan
    p_sign_adj: float = math.nan
    sign_excess: int = 0
    # what the sign test decides about: the median paired difference over every paired seed and its order-statistic
    # 95% interval (a degenerate run's difference the worst there is: ±inf), the seeds won and lost
    median: float = math.nan
    median_low: float = math.nan
    median_high: float = math.nan
    wins: int = 0
    losses: int = 0
    # a primary comparison: P(better or worse) at a true difference of one seed sd at its paired seeds and own noise,
    # with its level in the family as declared (alpha / m, Holm's first step), and in a family of SMALL_FAMILY
    power_declared: float = math.nan
    power_small: float = math.nan
    fragile: str = ""               # a verdict within 20% of its level, and what flips it (suite.report.fragility)

    @property
    def tested(self) -> bool:
        return math.isfinite(self.p)

    @property
    def significant(self) -> bool:
        return self.verdict in ("better", "worse")


def _outcomes(sub: pd.DataFrame) -> dict[int, RunOutcome]:
    ok = sub[(sub[Col.STATUS] == "ok") & np.isfinite(sub[Col.SCORE].astype(float))]
    # RunOutcome.of, read with the record
    return {int(seed): outcome for seed, outcome in zip(ok[Col.SEED], ok[Col.OUTCOME])}


def _paired_outcomes(sub: pd.DataFrame) -> dict:
    """Runs keyed by seed, or by (draw, seed) where a curve fixes its data draws: the units the test pairs."""
    if Col.DRAW not in sub or sub[Col.DRAW].isna().all():
        return _outcomes(sub)
    ok = sub[(sub[Col.STATUS] == "ok") & np.isfinite(sub[Col.SCORE].astype(float))]
    return {(int(draw), int(seed)): outcome
            for draw, seed, outcome in zip(ok[Col.DRAW], ok[Col.SEED], ok[Col.OUTCOME])}


def _from_evidence(method: str, column: str, ev: Evidence) -> Comparison:
    return Comparison(method, column, ev.n_seeds, ev.diff, ev.low, ev.high, ev.se, ev.df, ev.p, margin=ev.margin,
                      p_equiv=ev.p_equiv, example_se=ev.example_se if ev.has_examples else math.nan,
                      effect_size=effect_size(ev), n_paired=ev.n_paired if ev.n_paired >= 0 else ev.n_seeds,
                      degenerate=ev.degenerate, degenerate_reference=ev.degenerate_reference,
                      collapse_p=ev.collapse_p, p_rope=ev.p_rope, collapse_excess=ev.collapse_excess,
                      p_sign=ev.p_sign, sign_excess=ev.sign_excess, median=ev.median, median_low=ev.median_low,
                      median_high=ev.median_high, wins=ev.wins, losses=ev.losses)


def _seed_averages(cells: Mapping, method: str, tasks: list[str]) -> dict[float, float]:
    """{seed: mean over `tasks` of the method's score at that seed}, for seeds that ran all of them."""
    per_task_ = [cells[method, t].by_seed() for t in tasks]
    if not tasks or not all(per_task_):
        return {}
    seeds = set.intersection(*(set(d) for d in per_task_))
    return {s: float(np.mean([d[s] for d in per_task_])) for s in seeds}


def _compared_everywhere(tasks: list[Evidence]):
    """A filter of {seed: value} to the seeds each task's evidence compared (all of them where none says)."""
    sets = [{float(x) for x in ev.compared} for ev in tasks if ev.n_paired >= 0]
    keep = set.intersection(*sets) if sets else None
    return lambda by_seed: by_seed if keep is None else {s: v for s, v in by_seed.items() if float(s) in keep}


def compare_model(options, sel, board: pd.DataFrame, cells: Mapping, avgs: list, floor: Mapping[str, float],
                  sequential: Mapping = MappingProxyType({})) -> dict[tuple[str, str], Comparison]:
    """{(method, task or average header): Comparison} for every method except the reference (`options.baseline`).
    `sel`: the model's `Selection`, `cells` its `Cell`s, `avgs` its `Average`s, `floor` each task's collapse floor;
    `sequential`: `suite.report.stage_sections.verdicts` of the folders reported."""
    base = options.baseline
    out: dict[tuple[str, str], Comparison] = {}
    evidence: dict[tuple[str, str], Evidence] = {}
    runs = {(m, t): _outcomes(board[(board[Col.METHOD] == m) & (board[Col.TASK] == t)])
            for m in sel.methods for t in sel.tasks}
    for m in (x for x in sel.methods if x != base):
        for t in sel.tasks:
            ev = compare_runs(t, runs[m, t], runs[base, t], per_task(options.margin, t, DEFAULT_MARGIN),
                              seed=bootstrap_seed(t, m, base), higher_is_better=higher_is_better(t))
            evidence[m, t], out[m, t] = ev, _from_evidence(m, t, ev)
        for a_ in avgs:
            # the seeds every averaged task compared (neither run degenerated), as the tasks' own evidence
            healthy = _compared_everywhere([evidence[m, t] for t in a_.tasks])
            ev = averaged_evidence(healthy(_seed_averages(cells, m, a_.tasks)),
                                   healthy(_seed_averages(cells, base, a_.tasks)),
                                   [evidence[m, t] for t in a_.tasks],
                                   per_task(options.margin, a_.header, DEFAULT_MARGIN))
            evidence[m, a_.header], out[m, a_.header] = ev, _from_evidence(m, a_.header, ev)
    ran = {(m, t): found for (model, m, t, ref), found in sequential.items() if model == sel.model and ref == base}

    def bootstrap(method: str, task: str, seeds) -> tuple[float, float, float]:
        """The comparison with a bootstrap's dev-example part (a fragile verdict's alternative)."""
        keep = (lambda arm: {s: r for s, r in arm.items() if s in set(seeds)}) if seeds else dict
        ev = compare_runs(task, keep(runs[method, task]), keep(runs[base, task]),
                          per_task(options.margin, task, DEFAULT_MARGIN), seed=bootstrap_seed(task, method, base),
                          higher_is_better=higher_is_better(task), jackknife=False)
        return ev.se, ev.df, ev.example_se ** 2

    _decide(out, evidence, options.primary, options.correction, options.alpha, {a_.header for a_ in avgs}, ran)
    for (m, column), c in out.items():
        _mark_fragile(c, evidence[m, column], options.alpha, ran.get((m, column)),
                      (lambda seeds, m=m, t=column: bootstrap(m, t, seeds)) if column in sel.tasks else None)
    if options.aso:
        keys = [k for k in sorted(out) if k[1] in sel.tasks]
        found = aso.where_bimodal([((m, t), cells[m, t].values, cells[base, t].values, floor[t], higher_is_better(t))
                                   for m, t in keys])
        for key, epsilon in found.items():
            out[key].aso = epsilon
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


def _decide(comparisons: dict, evidence: dict, primary, correction: str, alpha: float,
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
        # the collapse tests are a family of their own; a comparison where no run degenerated cannot reject (no
        # discordant seed) and, conditioned on that as the exact test is, is left out (Tarone 1990)
        collapse_adj = families.adjust([comparisons[k].collapse_p if comparisons[k].degenerate
                                        + comparisons[k].degenerate_reference else math.nan for k in keys], how)
        # the sign tests are adjusted the same way, so that a claim needs both within the family
        p_sign_adj = families.adjust([comparisons[k].p_sign if comparisons[k].tested else math.nan for k in keys], how)
        tested = sum(comparisons[k].tested for k in keys)
        for k, p, pe, pc, ps in zip(keys, p_adj, p_equiv_adj, collapse_adj, p_sign_adj):
            c, ev = comparisons[k], evidence[k]
            c.p_adj, c.p_equiv_adj, c.collapse_p_adj = float(p), float(pe), float(pc)
            if math.isfinite(pc) and pc < alpha:
                c.collapse_verdict = "degenerates more" if c.collapse_excess > 0 else "degenerates less"
            c.p_sign_adj = float(ps)
            c.verdict = c.fixed_verdict = verdict(dataclasses.replace(ev, p=float(p), p_equiv=float(pe),
                                                                      p_sign=float(ps)), alpha)
            if k in sequential:
                c.verdict, c.sequential = sequential[k][:2]
            if c.verdict == "undecided" and tested:
                # the level the correction tests the first (Holm: alpha / m) or the last (BH: alpha) step at
                c.seeds_needed = seeds_needed(ev, alpha / tested if how == "holm" else alpha)
            if family == families.PRIMARY and c.tested:
                c.power_declared, c.power_small = family_power(ev, alpha, len(keys), k)


def family_power(ev: Evidence, alpha: float, family: int, identity) -> tuple[float, float]:
    """P(better or worse) of a comparison at a true difference of one seed sd, simulated at its paired seeds and its
    own noise (`suite.stats.design_power`), at alpha / family and at alpha / SMALL_FAMILY (NaN: no noise)."""
    from suite.stats.design_power import Noise, simulate
    from suite.stats.sequential import SMALL_FAMILY, Design

    if not (math.isfinite(ev.seed_sd) and ev.seed_sd > 0) or ev.n_paired < 2:
        return math.nan, math.nan
    noise, seed = Noise(ev.seed_sd, ev.example_se), bootstrap_seed("power", *identity)
    return tuple(simulate(noise, Design((ev.n_paired,), alpha / m, futility=0.0), ev.seed_sd, ev.margin,
                          POWER_SIMULATIONS, seed).difference for m in (family, min(family, SMALL_FAMILY)))


def _number(x) -> float:
    return math.nan if x is None else float(x)


def _factor(adjusted: float, raw: float) -> float:
    """The family's adjustment of one p-value (adjusted / raw), which an alternative's raw p-value gets too."""
    return adjusted / raw if raw > 0 and math.isfinite(adjusted) else 1.0


def _mark_fragile(c: Comparison, ev: Evidence, alpha: float, sequential, bootstrap) -> None:
    """`c.fragile`: the verdict's knife edge and its alternatives (suite.report.fragility), from the sequential
    design's last look where it decided the verdict, else from the fixed-sample test in its family."""
    look = sequential[2] if sequential is not None and len(sequential) > 2 else None
    if look is not None and look.p is not None:
        c.fragile = fragile_text(diff=_number(look.diff), se=_number(look.se), n=look.n,
                                 margin=_number(look.margin), p=_number(look.p), level=_number(look.level),
                                 p_equiv=_number(look.p_equiv), level_equiv=_number(look.level_equiv),
                                 bootstrap=(lambda: bootstrap(look.seeds)) if bootstrap else None)
    elif c.tested and not c.sequential:
        c.fragile = fragile_text(diff=ev.diff, se=ev.se, n=ev.n_seeds, margin=ev.margin, p=c.p_adj, level=alpha,
                                 p_equiv=c.p_equiv_adj, level_equiv=alpha, factor=_factor(c.p_adj, c.p),
                                 factor_equiv=_factor(c.p_equiv_adj, c.p_equiv),
                                 bootstrap=(lambda: bootstrap(ev.compared)) if bootstrap else None)


def floors(tasks: list[str], bases: Mapping, collapse_floor) -> dict[str, float]:
    """Each task's collapse floor (x100): its constant predictor's score plus the declared margin."""
    return {t: collapse.floor(bases[t].constant if t in bases else math.nan,
                              per_task(collapse_floor, t, collapse.DEFAULT_MARGIN), higher_is_better(t))
            for t in tasks}


def family_sizes(comparisons: Mapping) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for c in comparisons.values():
        sizes[c.family] = sizes.get(c.family, 0) + c.tested
    return sizes


def within_reach(comparisons: Mapping, seeds: int) -> list[Comparison]:
    """Undecided comparisons that at most `seeds` seeds would decide, at a fixed sample: none a sequential design
    decides, whose seeds are its stopping rule's to give."""
    return [c for c in comparisons.values() if c.verdict == "undecided" and not c.sequential
            and math.isfinite(c.seeds_needed) and c.seeds_needed <= seeds]


def curve_tests(curves: Mapping[str, pd.DataFrame], methods: Mapping[str, list[str]], baseline: str,
                correction: str) -> dict[tuple[str, str, int], tuple[float, float]]:
    """{(task, method, size): (mean paired difference to the reference x100, adjusted p)} of the data-efficiency
    curves (`suite.stats.curves`); `methods`: each curve's methods."""
    cells = {}
    for task, sub in curves.items():
        for size in sorted(sub[Col.SIZE].unique()):
            at = sub[sub[Col.SIZE] == size]
            ref = _paired_outcomes(at[at[Col.METHOD] == baseline])
            for m in methods[task]:
                if m != baseline:
                    cells[task, m, int(size)] = (task, _paired_outcomes(at[at[Col.METHOD] == m]), ref)
    return size_tests(cells, correction)


def verdict_text(c: Comparison) -> str:
    return c.verdict + (SEQUENTIAL if c.sequential else "")


def difference_text(c: Comparison | None) -> str:
    """The verdict, then the difference with its 95% interval over seeds and dev examples."""
    if c is None or not (c.n or c.n_paired):
        return DASH
    if not c.n:   # every paired seed had a degenerate run: only the collapse endpoint speaks
        return f"{DASH} (0 of {c.n_paired} seeds; degenerate {c.degenerate} vs {c.degenerate_reference}" + \
            (f": {c.collapse_verdict}" if c.collapse_verdict else "") + ")"
    text = fmt(c.diff, sign=True)
    if math.isfinite(c.low):
        text += f" [{fmt(c.low, sign=True)}, {fmt(c.high, sign=True)}]"
    if not math.isfinite(c.example_se) and c.tested:
        text += SEEDS_ONLY
    if c.n_paired > c.n:   # degenerate runs were left out of the score comparison, and counted apart
        text += f" ({c.n} of {c.n_paired} seeds; degenerate {c.degenerate} vs {c.degenerate_reference}" + \
            (f": {c.collapse_verdict}" if c.collapse_verdict else "") + ")"
    if c.fragile:
        text += f" ({c.fragile})"
    return f"{verdict_text(c)} {text}"
