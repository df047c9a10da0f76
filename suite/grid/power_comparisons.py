"""The power table's per-comparison part (`python -m suite plan`, after the per-task table of
`suite.grid.power_table`): each primary comparison a pilot ran, with its own noise and what it measured of it, the
probability of each verdict simulated at that noise, those probabilities averaged over a task's comparisons with
their range, and the comparisons that no number of seeds can decide at a true difference of 0.

Why. The per-task table plans at the median comparison's noise, but the study's verdicts are the comparisons', each
at its own noise: on the published records MRPC at 64 seeds reads 78.8% at its median and averages 37.6% over its 9
comparisons (issue 65). Each input's uncertainty is shown beside it: the seed sd with its chi-square interval on its
degrees of freedom (n - 1 over the healthy pairs: a normal sample's), the dev-example part with its delete-a-seed
jackknife interval (`suite.stats.examples.shared_interval`) and flagged where its estimate was clipped at 0 (the
seeds' differences did not repeat beyond chance; the true part is small, not 0), and the degenerate runs with exact
(Clopper-Pearson) intervals.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats

from suite.stats.design_power import Noise, equivalence_limit, monte_carlo_error, simulate
from suite.stats.sequential import SMALL_FAMILY, Design

__all__ = ["COMPARISON_SIMULATIONS", "ComparisonNoise", "comparison_lines", "family_lines"]

COMPARISON_SIMULATIONS = 1000   # per comparison and true difference: Monte-Carlo error at most 1.6 points
LEVEL = 0.95                    # of every interval shown


@dataclass(frozen=True)
class ComparisonNoise:
    """One pilot comparison of a primary method with the reference: its noise and what it was measured from."""

    method: str
    noise: Noise
    seeds: int                  # where neither run degenerated: the seed sd's n
    paired: int                 # every paired seed
    clipped: bool               # the dev-example part was estimated, and clipped at 0
    degenerate: int             # the method's degenerate runs among the paired seeds
    degenerate_reference: int
    example_se_interval: tuple[float, float] = (math.nan, math.nan)   # its 95% interval (NaN: under 3 seeds)


def _sd_interval(sd: float, n: int) -> str:
    """"0.95 [0.72, 1.39] df 19": the chi-square interval of a normal sample's sd on n - 1 degrees of freedom."""
    df = n - 1
    if df < 1 or not math.isfinite(sd):
        return f"{sd:.2f}"
    low = sd * math.sqrt(df / stats.chi2.ppf(0.5 + LEVEL / 2, df))
    high = sd * math.sqrt(df / stats.chi2.ppf(0.5 - LEVEL / 2, df))
    return f"{sd:.2f} [{low:.2f}, {high:.2f}] df {df}"


def _example_se(c: ComparisonNoise) -> str:
    """"0.09 [0.04, 0.13]": the dev-set part with its delete-a-seed jackknife interval, flagged where clipped at 0."""
    low, high = c.example_se_interval
    text = f"{c.noise.example_se:.2f}" + (f" [{low:.2f}, {high:.2f}]" if math.isfinite(high) else "")
    return text + (" (clipped at 0)" if c.clipped else "")


def _rate(k: int, n: int) -> str:
    """"2/20 [1%, 32%]": k of n with its exact (Clopper-Pearson) interval."""
    if n == 0:
        return "–"
    ci = stats.binomtest(k, n).proportion_ci(LEVEL, method="exact")
    return f"{k}/{n} [{100 * ci.low:.0f}%, {100 * ci.high:.0f}%]"


def _percent(p: float) -> str:
    return f"{100 * p:.1f}%"


def _spread(values: list[float]) -> str:
    """"37.6% (0.1%-93.2%)": the mean over the comparisons and their range."""
    return f"{_percent(statistics.fmean(values))} ({_percent(min(values))}-{_percent(max(values))})"


def out_of_reach(c: ComparisonNoise, design: Design, margin: float, target: float) -> bool:
    """No number of seeds decides a true difference of 0 with probability `target`: the dev set's shared part alone
    keeps equivalence below it (`suite.stats.design_power.equivalence_limit`)."""
    return equivalence_limit(c.noise, design, margin) + design.alpha < target


def family_lines(tasks: list, design: Design, family: int, alpha: float, sims: int, seed: int) -> list[str]:
    """Power for the primary family as declared: per task, P(better or worse) at a true difference of one seed sd
    (the task's median noise), each comparison at alpha / `family`; beside it the same with a family of
    SMALL_FAMILY where the declared one is larger (declare fewer METHOD:TASK entries in `report: primary:`)."""
    import dataclasses

    planned = [t for t in tasks if t.noise is not None and t.noise.seed_sd > 0]
    if not planned:
        return []
    small = dataclasses.replace(design, alpha=alpha / SMALL_FAMILY) if family > SMALL_FAMILY else None
    parts = []
    for t in planned:
        declared = simulate(t.noise, design, t.noise.seed_sd, t.margin, sims, seed).difference
        text = f"{t.task} {_percent(declared)}"
        if small is not None:
            text += f" ({_percent(simulate(t.noise, small, t.noise.seed_sd, t.margin, sims, seed).difference)} " \
                    f"with {SMALL_FAMILY})"
        parts.append(text)
    head = (f"  primary family as declared (report: primary:): {family} comparisons, each at {alpha:g} / {family}; "
            "P(better or worse) at a true difference of one seed sd: ")
    tail = ("" if small is None else f"; a family of {family} costs each comparison power: a family of at most "
            f"about {SMALL_FAMILY} (METHOD:TASK entries in report: primary:) keeps it")
    return [head + ", ".join(parts) + tail]


def comparison_lines(tasks: list, design: Design, target: float, seed: int) -> list[str]:
    """The per-comparison table, the averages over each task's comparisons, and the comparisons out of reach, for
    the `TaskPlan`s whose noise came from a pilot's comparisons (none: no lines)."""
    from tabulate import tabulate

    planned = [t for t in tasks if t.comparisons_noise]
    if not planned:
        return []
    sequential = len(design.looks) > 1
    rows, averages, never = [], [], []
    for t in planned:
        chances = {factor: [] for factor in (0.0, 1.0, 2.0)}
        for c in t.comparisons_noise:
            found = {factor: simulate(c.noise, design, factor * t.margin, t.margin, COMPARISON_SIMULATIONS, seed)
                     for factor in chances}
            for factor, ch in found.items():
                chances[factor].append(ch)
            unreachable = out_of_reach(c, design, t.margin, target)
            if unreachable:
                never.append(f"{c.method} on {t.task}")
            limit = equivalence_limit(c.noise, design, t.margin)
            rows.append([t.task, c.method, c.seeds, _sd_interval(c.noise.seed_sd, c.seeds),
                         _example_se(c),
                         _rate(c.degenerate, c.paired), _rate(c.degenerate_reference, c.paired), _percent(limit),
                         _percent(found[0.0].decided), _percent(found[1.0].difference)])
        for factor, label in ((0.0, "0"), (1.0, "margin"), (2.0, "2x margin")):
            got = chances[factor]
            row = [t.task, f"{factor * t.margin:g} ({label})" if factor else "0",
                   _spread([c.difference for c in got]), _spread([c.equivalent for c in got]),
                   _spread([c.undecided for c in got])]
            averages.append(row + ([_spread([c.futility for c in got])] if sequential else []))
    n = min(len(t.comparisons_noise) for t in planned)
    headers = ["task", "true difference", "better or worse", "equivalent", "undecided"]
    error = 100 * monte_carlo_error(0.5, COMPARISON_SIMULATIONS)
    lines = ["", f"each primary comparison the pilot ran, at its own noise ({COMPARISON_SIMULATIONS} simulated "
                 f"comparisons each: Monte-Carlo error at most {error:.1f} points):",
             tabulate(rows, headers=["task", "method", "seeds", "seed_sd [95%] df", "example_se [95%]",
                                     "degenerate", "reference degenerate", "equivalence limit",
                                     "decided at 0", "claimed at margin"], tablefmt="simple"),
             "", "power averaged over each task's comparisons (in brackets their range; Monte-Carlo error of a mean "
                 f"at most {100 * monte_carlo_error(0.5, COMPARISON_SIMULATIONS * n):.1f} points):",
             tabulate(averages, headers=headers + (["of which futility"] if sequential else []), tablefmt="simple"),
             "", "seed_sd [95%] df: the chi-square interval of the seed sd on its degrees of freedom (the healthy "
                 "pairs less one); example_se [95%]: the dev-set part with the delete-a-seed jackknife's interval "
                 "(a t on the seeds less one: how well the seeds tell the shared part from each run's own luck; at "
                 "5-20 seeds it covered 96-100% in simulation), none under 3 seeds; "
                 "clipped at 0: estimated at 0 because the seeds' example-by-example "
                 "differences did not repeat beyond chance, which a few seeds make likely (the true part is small, "
                 "not 0: plan with care); degenerate: the runs among the paired seeds, with an exact "
                 "(Clopper-Pearson) 95% interval; equivalence limit: P(equivalent | true difference 0) with unlimited "
                 "seeds; decided at 0: P(equivalent or a claim | 0) under the design; claimed at margin: P(better or "
                 "worse | the margin)."]
    timed = [t for t in planned if t.step_s]
    if timed:
        lines.append("seconds per optimizer step of the pilot's compared runs (median and range, as each record "
                     "measured it: the machine and its load set it): "
                     + ", ".join(f"{t.task} {statistics.median(t.step_s):.2f} ({min(t.step_s):.2f}-"
                                 f"{max(t.step_s):.2f}, {len(t.step_s)} runs)" for t in timed) + ".")
    lines.append("no number of seeds decides a true difference of 0 with probability "
                 f"{target:.0%} (the dev set's shared part alone keeps it below): "
                 + (", ".join(never) if never else "none") + ".")
    return lines
