"""Power of one comparison from its own variance (never pooled over methods): how many seeds would decide it, and the
smallest difference its seeds can detect.

A comparison's standard error with n seeds is se(n)^2 = seed_sd^2 / n + v_shared: the seed part shrinks with seeds
(each run's own luck on the dev examples is part of it), while the dev-example part all seeds share (which examples
the dev set holds) stays (`suite.stats.examples.split_variance`). Power comes from statsmodels' `TTestPower`
(noncentral t) with the standardised effect diff / (se(n) sqrt(n)) and the Cochran-Cox degrees of freedom of
`suite.stats.evidence`, so power and test use one reference distribution. Power to show equivalence (TOST) uses the
usual approximation P(lower test rejects) + P(upper test rejects) - 1 (Chow, Shao & Wang 2008, ch. 3).
"""
from __future__ import annotations

import math

from scipy import optimize
from statsmodels.stats.power import TTestPower

from suite.stats.cochran_cox import cochran_cox_df

# what the rest of the suite uses; other names are this module's own
__all__ = ["decision_power", "effect_size", "min_detectable", "seeds_needed"]

POWER = 0.8
MOST_SEEDS = 10_000
_POWER = TTestPower()


def se_at(ev, n: float) -> float:
    """The comparison's standard error with n seeds: the shared dev-example part stays, the seeds' shrinks as 1/n."""
    return math.sqrt(sum(_parts(ev, n)))


def _parts(ev, n: float) -> tuple[float, float]:
    """(the part of se(n)^2 known to n - 1 df, the dev-example part), as the test at n seeds would split it."""
    return ev.seed_sd ** 2 / n, ev.example_se ** 2


def _df(ev, n: float, level: float) -> float:
    return float(cochran_cox_df(*_parts(ev, n), n, level))


def _detect(ev, n: float, alpha: float, delta: float) -> float:
    se = se_at(ev, n)
    if not abs(delta) > 0:
        return 0.0
    # the two-sided test's far tail (a significant difference of the wrong sign) is left out: it is below alpha / 2,
    # and statsmodels' two-sided power is NaN where scipy's noncentral t cdf fails far out
    return float(_POWER.power(abs(delta) / (se * math.sqrt(n)), n, alpha / 2, df=_df(ev, n, 1 - alpha),
                              alternative="larger"))


def _equivalence(ev, n: float, alpha: float, delta: float) -> float:
    if not abs(delta) < ev.margin:
        return 0.0
    se, df = se_at(ev, n), _df(ev, n, 1 - 2 * alpha)
    one = [float(_POWER.power(gap / (se * math.sqrt(n)), n, alpha, df=df, alternative="larger"))
           for gap in (ev.margin - delta, ev.margin + delta)]
    return max(0.0, one[0] + one[1] - 1.0)


def decision_power(ev, n: float, alpha: float, delta: float | None = None) -> float:
    """Power with n seeds to decide the comparison (a difference or equivalence) if the true difference is `delta`
    (default: the observed one)."""
    delta = ev.diff if delta is None else delta
    return max(_detect(ev, n, alpha, delta), _equivalence(ev, n, alpha, delta))


def _estimable(ev) -> bool:
    return ev.n_seeds >= 2 and math.isfinite(ev.seed_sd) and math.isfinite(ev.diff) and \
        (ev.seed_sd > 0 or ev.example_se > 0)


def seeds_needed(ev, alpha: float, power: float = POWER, most: int = MOST_SEEDS) -> float:
    """Fewest seeds in all (not added) with which the comparison is decided with `power` if the true difference is
    the observed one; inf when no number of seeds up to `most` does (the dev set's own noise can be the limit), NaN
    when not estimable (fewer than 2 seeds, no variance)."""
    if not _estimable(ev):
        return math.nan
    if decision_power(ev, most, alpha) < power:
        return math.inf
    lo, hi = 2, 2
    while decision_power(ev, hi, alpha) < power:
        lo, hi = hi, hi * 2
    while lo < hi:   # the smallest n in [lo, hi] with enough power (power grows with n)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if decision_power(ev, mid, alpha) < power else (lo, mid)
    return float(lo)


def min_detectable(ev, alpha: float, power: float = POWER, n: float | None = None) -> float:
    """Smallest true difference the two-sided test detects with `power` at n seeds (default: the comparison's)."""
    n = ev.n_seeds if n is None else n
    if not _estimable(ev):
        return math.nan
    se = se_at(ev, n)
    if not se > 0:
        return math.nan
    # TTestPower.solve_power takes no df, so the power equation is solved here for the difference
    hi = se
    while _detect(ev, n, alpha, hi) < power:
        hi *= 2
    return float(optimize.brentq(lambda d: _detect(ev, n, alpha, d) - power, 1e-9 * se, hi, xtol=1e-6 * se))


def effect_size(ev) -> float:
    """Standardised difference: diff over the sd of one seed's difference with the dev-example noise included."""
    sd = se_at(ev, ev.n_seeds) * math.sqrt(ev.n_seeds) if _estimable(ev) else math.nan
    return ev.diff / sd if sd > 0 else math.nan
