"""The table of differences to the reference method, with its notes, and the comparisons behind it: a compact table
of what each verdict rests on, then every further statistic of each comparison below it (all of them as numbers in
comparisons.csv; `suite.report.comparisons` computes them).
"""
from __future__ import annotations

import math

from suite.report.comparisons import (
    POWER_SIMULATIONS,
    SEEDS_ONLY,
    SEQUENTIAL,
    Comparison,
    difference_text,
    family_sizes,
    verdict_text,
    within_reach,
)
from suite.report.facts import Average, ModelFacts, Options
from suite.report.fragility import BAND
from suite.report.vocabulary import DASH, Part, Table, fmt, task_display
from suite.stats.aso import ASO_MIN_SEEDS, ASO_THRESHOLD
from suite.stats.families import CORRECTIONS
from suite.stats.sequential import SMALL_FAMILY
from suite.stats.sign import SIGN_GUARD_SEEDS

__all__ = ["DETAILS", "section"]


def section(facts: ModelFacts, options: Options) -> Part:
    """The differences to the reference, then the comparisons (the leaderboard's, when it ran the reference)."""
    sel, avgs, comps, part = facts.sel, list(facts.averages), facts.comparisons, Part()
    columns = [*sel.tasks, *[a.header for a in avgs]]
    rows = [[sel.label(m), *[difference_text(comps.get((m, c))) for c in columns]]
            for m in sel.methods if m != options.baseline]
    if not rows:
        return part
    headers = ["method", *[task_display(t) for t in sel.tasks], *[a.header for a in avgs]]
    differences = part.tables["differences"] = Table(headers, rows)
    part.add(f"### Difference to `{options.baseline}`", "", differences.markdown(), "")
    part.add(*[f"- {n}" for n in _difference_notes(options, comps, avgs)], "")
    part.extend(_comparison_table(facts, options))
    return part


REACH_SEEDS = 10  # a study can afford this many; beyond it, more seeds are not the way to decide


def _family_text(options: Options, comps: dict) -> str:
    sizes = family_sizes(comps)
    if set(sizes) == {"all"}:
        return (f"all {sizes['all']} tests of this table (tasks and averages) form one family, adjusted by "
                f"{CORRECTIONS[options.correction]}")
    return (f"the {sizes.get('primary', 0)} primary comparisons declared by the study (`primary:`) form one "
            f"family adjusted by {CORRECTIONS['holm']}; the {sizes.get('exploratory', 0)} others are exploratory, "
            f"adjusted by {CORRECTIONS['bh']}")


def _family_power_text(comps: dict) -> list[str]:
    """The power of the primary family as declared (none without one): each primary comparison's P(better or worse)
    at a true difference of one seed sd, at its seeds and noise, averaged, beside a family of SMALL_FAMILY."""
    primary = [c for c in comps.values() if c.family == "primary" and math.isfinite(c.power_declared)]
    if not primary:
        return []
    m = sum(1 for c in comps.values() if c.family == "primary")
    declared = [c.power_declared for c in primary]
    small = [c.power_small for c in primary]
    text = (f"Power of the primary family as declared ({m} comparisons, each first tested at α/{m}): at a true "
            "difference of one seed sd, with each comparison's paired seeds and own noise, a difference is claimed "
            f"with probability {100 * sum(declared) / len(declared):.0f}% on average "
            f"({100 * min(declared):.0f}-{100 * max(declared):.0f}% over the {len(primary)} tested; simulated, "
            f"{POWER_SIMULATIONS:,} studies each, docs/statistics.md)")
    if m > SMALL_FAMILY:
        text += (f"; with a family of {SMALL_FAMILY} it would be {100 * sum(small) / len(small):.0f}%: a primary "
                 "family kept to a few comparisons keeps their power (`report: primary:` takes METHOD:TASK)")
    if any(c.sequential for c in primary):
        text += (f". This is a fixed-sample test's power at the seeds reported; the verdicts marked {SEQUENTIAL} "
                 "come from the sequential design, whose own power over its looks `python -m suite plan --study "
                 "FILE --until-decided` gives (at the noise of its pilot or records)")
    return [text + "."]


def _collapse_family_text(options: Options, comps: dict) -> str:
    """The collapse endpoint's own families, beside the score's (docs/statistics.md)."""
    tested = {}
    for c in comps.values():
        if c.degenerate + c.degenerate_reference:
            tested[c.family] = tested.get(c.family, 0) + 1
    how = {"primary": CORRECTIONS["holm"], "exploratory": CORRECTIONS["bh"], "all": CORRECTIONS[options.correction]}
    parts = [f"{n} {family}: {how[family]}" for family, n in sorted(tested.items())]
    return ("the collapse tests (McNemar, \"degenerates more / less\") are families of their own within each, "
            f"among the comparisons with any degenerate run, at the same alpha ({'; '.join(parts) or 'none here'})")


def _analysis_text(options: Options) -> str:
    """Whether the verdicts come from an analysis fixed before the results were seen."""
    if options.preregistration is not None:
        return options.preregistration.text()
    if options.preregistered:  # declared, but not checked against records (no records were read)
        return (f"Declared pre-registered in `{options.preregistered}` (`report: preregistered:`), not checked "
                "against git here; verdicts from statistics revised since are not pre-registered.")
    return ("Re-analysis: the study declares no pre-registered analysis (`report: preregistered:`), so these verdicts "
            "come from statistics that may have been chosen or revised after the results were seen; read them as "
            "a re-analysis, and confirm a claim on new runs.")


def _difference_notes(options: Options, comps: dict, avgs: list[Average]) -> list[str]:
    by_column = {c.column: c.margin for c in comps.values()}   # a column's margin is the same for every method
    if len(set(by_column.values())) > 1:   # per-task margins: which column has which
        margin_text = "the margin (" + ", ".join(f"{task_display(col)} ±{fmt(m)}" for col, m in by_column.items()) \
            + " points)"
    else:
        margin_text = f"±{'/'.join(fmt(m) for m in set(by_column.values()))} points"
    notes = [f"Each cell: the verdict, then the mean paired difference (method minus `{options.baseline}`, runs paired "
             "by seed) in the headline metric x100 with its 95% interval over seeds and dev examples together "
             "(docs/statistics.md).",
             "**better** / **worse**: the two-sided test of no difference rejects at adjusted "
             f"p < {options.alpha:g} (direction from the task's metric) and, from {SIGN_GUARD_SEEDS} paired seeds on, "
             "so does the exact paired sign test over every paired seed, in the same direction (a degenerate run "
             "loses its seed; `p_sign` in comparisons.csv); **equivalent**: two one-sided tests put the "
             f"difference within {margin_text} (adjusted p < {options.alpha:g}); "
             "**undecided**: neither, so the data do not say whether the methods differ.",
             "Families: " + _family_text(options, comps) + "; " + _collapse_family_text(options, comps) + ".",
             *_family_power_text(comps),
             f"No test with fewer than 2 paired seeds; {SEEDS_ONLY}: runs without per-example predictions, the "
             "interval covers seed noise only.",
             "A run that degenerated (constant or near-constant predictions, or none correlated with the labels) is "
             "a state, not a low score: the difference is taken over the seeds where neither run degenerated, and "
             "how often each degenerated is tested on its own (\"n of m seeds; degenerate a vs b\", and the "
             "comparisons table)."]
    averaged = {a.header for a in avgs}   # an average's dev-example part is its tasks': named there
    clipped = sorted((c for c in comps.values() if c.tested and c.example_se == 0 and c.column not in averaged),
                     key=lambda c: (c.method, c.column))
    if clipped:   # an interval "over seeds and dev examples" whose dev-example part is an estimate of 0
        notes.append("Dev-example part estimated at 0 (clipped; the Further statistics' dev-example se) for "
                     + ", ".join(f"{c.method} on {task_display(c.column)}" for c in clipped)
                     + ": those intervals rest on the seeds' spread, which then holds the dev-example noise; the "
                     "estimate is noisy with few seeds.")
    sequential = [c for c in comps.values() if c.sequential]
    if sequential:
        differ = sorted((c for c in sequential if c.verdict != c.fixed_verdict), key=lambda c: (c.method, c.column))
        notes.append(
            f"{SEQUENTIAL}: the verdict of the study's sequential design (`run --until-decided`; its looks and "
            "stopping reasons in \"Seeds added until decided\"), the one whose error rate holds over the looks, for "
            f"{len(sequential)} primary comparisons. The interval and p-values beside it treat all the seeds as one "
            "fixed-size sample; "
            + ("the fixed-sample verdict differs for " + ", ".join(
                f"{c.method} on {task_display(c.column)} ({c.fixed_verdict})" for c in differ)
               if differ else "the fixed-sample verdicts agree with them")
            + " (`fixed_verdict` in comparisons.csv).")
    fragile = sorted((c for c in comps.values() if c.fragile), key=lambda c: (c.method, c.column))
    notes.append(
        f"Fragile: a verdict whose p-value lies within {BAND[0]:g}-{BAND[1]:g} times the level it was held against "
        "(a sequential verdict's: its last look's), with the alternatives of the analysis that would flip it: a t "
        "on the seeds' "
        "n - 1 degrees of freedom, a 2,000-resample bootstrap of the dev examples. "
        + (f"{len(fragile)} here: " + ", ".join(f"{c.method} on {task_display(c.column)}" for c in fragile) + "."
           if fragile else "None here."))
    notes.append(_analysis_text(options))
    if avgs:
        notes.append(" and ".join(a.header for a in avgs) + ": the same on each seed's average over the "
                     "averaged tasks (seeds that ran all of them for both methods).")
    reach = sorted(within_reach(comps, REACH_SEEDS), key=lambda c: (c.seeds_needed, c.method, c.column))
    if reach:
        notes.append(f"Undecided but within reach (at most {REACH_SEEDS} seeds in all would decide it with 80% "
                     "power if the true difference were the observed one; each comparison's own variance): "
                     + ", ".join(f"{c.method} on {task_display(c.column)} ({int(c.seeds_needed)})" for c in reach)
                     + ".")
    return notes


def _seeds_text(n: float) -> str:
    if math.isnan(n):
        return DASH
    return "> 10,000 or never" if math.isinf(n) else f"{int(n):,}"


# the comparisons table shows what each verdict rests on, the table below it every other statistic; the exported
# table (leaderboard_comparisons.csv and .tex) keeps all of them in one, in the order of FULL_COLUMNS
FULL_COLUMNS = ["method", "task", "seeds", "Δ", "95% interval", "median Δ", "sign interval", "wins",
                "dev-example se", "effect size", "p", "p adj", "p equiv", "p equiv adj", "P(Δ within ±m)", "verdict",
                "family", "seeds needed", "degenerate", "collapse p adj", "ASO ε"]
COMPACT_COLUMNS = ["method", "task", "seeds", "Δ", "95% interval", "median Δ", "sign interval", "wins", "p adj",
                   "p equiv adj", "verdict", "family", "degenerate"]
DETAIL_COLUMNS = ["method", "task", "dev-example se", "effect size", "p", "p equiv", "P(Δ within ±m)",
                  "seeds needed", "collapse p adj", "ASO ε"]
DETAILS = "#### Further statistics of each comparison"


def _comparison_row(facts: ModelFacts, c: Comparison) -> list[str]:
    return [facts.label(c.method), task_display(c.column), str(c.n), fmt(c.diff, sign=True),
            f"[{fmt(c.low, sign=True)}, {fmt(c.high, sign=True)}]" if math.isfinite(c.low) else DASH,
            *_median_texts(c), fmt(c.example_se) if math.isfinite(c.example_se) else DASH,
            fmt(c.effect_size, sign=True),
            fmt(c.p, 4), fmt(c.p_adj, 4), fmt(c.p_equiv, 4), fmt(c.p_equiv_adj, 4), fmt(c.p_rope, 3),
            verdict_text(c), c.family, _seeds_text(c.seeds_needed), _degenerate_text(c),
            fmt(c.collapse_p_adj, 4), fmt(c.aso, 2)]


def _bound(x: float) -> str:
    """A paired difference, where a degenerate run's is infinite."""
    return ("+∞" if x > 0 else "−∞") if math.isinf(x) else fmt(x, sign=True)


def _median_texts(c: Comparison) -> list[str]:
    """median Δ, its sign interval and the wins, over every paired seed (suite.stats.sign)."""
    if not c.n_paired:
        return [DASH, DASH, DASH]
    ties = c.n_paired - c.wins - c.losses
    interval = f"[{_bound(c.median_low)}, {_bound(c.median_high)}]" if not math.isnan(c.median_low) else DASH
    return [_bound(c.median) if not math.isnan(c.median) else DASH, interval,
            f"{c.wins}/{c.n_paired}" + (f" ({ties} tied)" if ties else "")]


def _comparison_table(facts: ModelFacts, options: Options) -> Part:
    comps, part = facts.comparisons, Part()
    rows = [_comparison_row(facts, comps[k]) for k in sorted(comps)
            if comps[k].n or comps[k].n_paired]  # no paired seed: a "–"
    if not rows:
        return part
    full = part.tables["comparisons"] = Table(FULL_COLUMNS, rows)
    part.add(f"### Comparisons with `{options.baseline}`", "", full.columns(COMPACT_COLUMNS).markdown(), "",
             *[f"- {n}" for n in _compact_notes(options)], "",
             DETAILS, "", full.columns(DETAIL_COLUMNS).markdown(), "",
             *[f"- {n}" for n in _detail_notes(any(c.sequential for c in comps.values()))], "")
    return part


def _compact_notes(options: Options) -> list[str]:
    return [f"Seeds: those where neither run degenerated. Δ and 95% interval: as in the table above (method minus "
            f"`{options.baseline}`, x100), the mean paired difference, which the test of no difference is about.",
            "What a better or worse verdict decides on from "
            f"{SIGN_GUARD_SEEDS} paired seeds on: the median paired difference (median Δ), over every paired seed "
            "(a degenerate run loses its seed: its difference is ∓∞), with its sign interval (the order statistics "
            "that cover the median with at least 95% probability for any distribution of the differences, the "
            "interval the sign test inverts; – below 6 paired seeds, where none reaches 95%), and wins: the seeds "
            "where the method's score is higher, of all paired seeds (tied: equal scores, or both runs degenerate; "
            "they leave the sign test). From those seeds on a claim says both: the mean (over seeds and dev "
            "examples) and the median (over seeds, on this dev set) lie on the claimed side; where they disagree, "
            "the mean moved with a few seeds (docs/statistics.md).",
            "p adj: the two-sided test of no difference; p equiv adj: two one-sided "
            "tests of |Δ| ≥ the margin; both adjusted within the comparison's family (primary, exploratory, or all "
            "of the table: the families and the verdicts' rules are under the table above). Degenerate: the "
            "method's and the reference's degenerate runs among all paired seeds (constant predictions, or no "
            "detectable correlation; docs/statistics.md), compared by McNemar's exact test (its verdict in "
            "brackets where its adjusted p, collapse p adj below, is under the level).",
            f"Every other statistic of each comparison is in the table below ({DETAILS.lstrip('# ')}); both tables' "
            "columns together, as shown here, in leaderboard_comparisons.csv and .tex; every statistic as a number at "
            "full precision in comparisons.csv, with the paired sign test (`p_sign`, `p_sign_adj`, `wins`, "
            "`losses`), the fixed-sample verdict of a sequential design (`fixed_verdict`) and the fragility of each "
            "verdict (`fragile`)."]


def _detail_notes(sequential: bool) -> list[str]:
    return ["Dev-example se: the part of the interval's standard error that every seed shares, which examples the "
            "dev set happens to hold (no number of seeds shrinks it). 0.00 means it was estimated at 0: the "
            "methods' example-by-example differences did not repeat from seed to seed beyond chance (the estimate "
            "is clipped at 0, which is likelier with few seeds: it is noisy), so the dev-example noise is all in "
            "the seeds' spread, which the interval holds already; – : no per-example predictions, the interval is "
            "over seeds only.",
            "Effect size: Δ over the standard deviation of one seed's difference, dev-example noise included "
            "(each comparison's own). p: two-sided test of no difference; p equiv: two one-sided tests of |Δ| ≥ "
            "the margin; both before the family's adjustment (\"adj\" in the table above).",
            "P(Δ within ±m): the posterior probability that the true difference lies within the margin (Bayesian "
            "t-test with a flat prior: the same t as the test), beside the verdicts, not instead of them.",
            "Seeds needed: total seeds with which an undecided comparison would be decided (a difference or "
            "equivalence) with 80% power if the true difference were the observed one (\"never\": the dev set's own "
            "noise is the limit: more dev examples, not seeds)" + (
                f"; of a fixed-sample test, also beside a verdict marked {SEQUENTIAL}, whose seeds its design's "
                "stopping rule gives" if sequential else "") + ".",
            "Collapse p adj: McNemar's exact test of the degenerate runs counted in the table above, adjusted within "
            "the family among comparisons with any degenerate run.",
            "ASO ε: almost stochastic order (Dror et al. 2019, `deepsig`) that the method is better, only where a "
            f"cell's outcomes are bimodal and both have at least {ASO_MIN_SEEDS} seeds (below {ASO_THRESHOLD:g}: "
            "almost stochastically better, 0.5 no order, near 1 worse); elsewhere it adds nothing the interval does "
            "not say."]


def _degenerate_text(c) -> str:
    if not (c.degenerate or c.degenerate_reference):
        return DASH
    return f"{c.degenerate}/{c.n_paired} vs {c.degenerate_reference}/{c.n_paired}" + \
        (f" ({c.collapse_verdict})" if c.collapse_verdict else "")


