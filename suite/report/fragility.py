"""Verdicts on a knife edge: a verdict whose p-value lies within 20% of the level it was held against (p between 0.8
and 1.25 times it, on either side) is printed as fragile, with the reasonable alternatives of the analysis that
would flip it.

The alternatives are choices the suite made for good reasons but that another analyst could make:

- `t on n-1 df`: the reference t with the seeds' n - 1 degrees of freedom instead of Cochran & Cox's weighted ones
  (which count the dev-example part as known exactly), the same standard error;
- `bootstrap`: the dev-example part from a 2,000-resample bootstrap of the dev examples instead of the delete-one
  jackknife (its Monte-Carlo error alone moves a p-value near the level by several percent).

Both are applied to the statistic that decides: the test of no difference for better / worse, the two one-sided
tests for equivalence, either for undecided. For a fixed-sample verdict the alternative p-value is adjusted by the
same factor as the original within its family (p_adj / p: Holm's and Benjamini-Hochberg's adjustments are monotone).
"""
from __future__ import annotations

import math
from typing import Callable

from scipy import stats

__all__ = ["BAND", "fragile_text", "near"]  # what the rest of the suite uses; other names are this module's own

BAND = (0.8, 1.25)   # a p-value this close to its level, relative to it, is a knife edge


def near(p: float, level: float) -> bool:
    """p within BAND of the level (relative)."""
    return math.isfinite(p) and math.isfinite(level) and level > 0 and BAND[0] <= p / level <= BAND[1]


def _t_tests(diff: float, se: float, df: float, margin: float) -> tuple[float, float]:
    """(p of no difference, TOST p) with a t on df degrees of freedom."""
    if not (math.isfinite(se) and se > 0 and df > 0):
        return math.nan, math.nan
    p = 2 * stats.t.sf(abs(diff) / se, df)
    p_equiv = max(stats.t.sf((diff + margin) / se, df), stats.t.sf((margin - diff) / se, df))
    return float(p), float(p_equiv)


def fragile_text(*, diff: float, se: float, n: int, margin: float, p: float, level: float, p_equiv: float,
                 level_equiv: float, factor: float = 1.0, factor_equiv: float = 1.0,
                 bootstrap: Callable[[], tuple[float, float, float]] | None = None) -> str:
    """"" unless the verdict is on a knife edge; else which alternatives flip it ("flips with t on n-1 df"), or that
    none does. `p`, `p_equiv`: as the verdict used them (adjusted in a family); `factor`, `factor_equiv`: the
    family's adjustment (adjusted / raw) for the alternatives' raw p-values; `bootstrap`: () -> (se, df, example_se
    squared) of the same comparison with the bootstrap's dev-example part (called only on a knife edge)."""
    edges = [(kind, q, lvl) for kind, q, lvl in (("difference", p, level), ("equivalence", p_equiv, level_equiv))
             if near(q, lvl)]
    if not edges:
        return ""
    alternatives: dict[str, tuple[float, float]] = {"t on n-1 df": _t_tests(diff, se, n - 1, margin)}
    if bootstrap is not None:
        boot_se, boot_df, _ = bootstrap()
        alternatives["bootstrap"] = _t_tests(diff, boot_se, boot_df, margin)
    flips = []
    for name, (alt_p, alt_p_equiv) in alternatives.items():
        for kind, q, lvl in edges:
            alt = alt_p * factor if kind == "difference" else alt_p_equiv * factor_equiv
            if math.isfinite(alt) and (alt < lvl) != (q < lvl):
                flips.append(name)
                break
    tried = " or ".join(alternatives)
    return f"fragile: flips with {', '.join(flips)}" if flips else f"fragile: holds with {tried}"
