"""The paired sign test a difference claim also needs: at every look of a sequential design, and in a fixed-sample
report once a comparison has `SIGN_GUARD_SEEDS` paired seeds.

Why. The test of the mean (`suite.stats.evidence`) is a t: at the tiny per-look levels of a sequential design
(0.00018 at 15 seeds, 0.0013 at 20 for 36 primary comparisons) its far tail decides, and a skewed paired difference
puts that tail in the wrong place. Where one method has rare poor runs (STS-B runs correlating 0.2 with the labels
are poor, not degenerate), samples that happen to miss them look better with a small spread: in a null built from
the published STS-B pairs the sequential procedure claimed "better" at 18-33 times its level
(lab/stats/score_endpoint.py). No test of the mean holds its level against every such tail at 20 seeds (Bahadur &
Savage 1956), so a claim now needs the median paired difference too, tested exactly:

- each paired seed is a win for the method (its score higher), a loss, or a tie (dropped);
- a degenerate run (`suite.stats.collapse.degenerate`) loses its seed, both degenerate is a tie: the sign test runs
  over *every* paired seed, so it does not condition on survival (the healthy-pair mean does, and where collapse is
  the low tail of how a run would have scored, the method's survivors are selected upward);
- two-sided exact binomial p of wins against losses (scipy), whose level holds for any distribution of the paired
  differences whose median is 0 (given the dev set).

A "better" or "worse" verdict needs the test of the mean (seeds and dev examples) and this test, both below the
level and in the same direction. Each guards the other's weakness: the sign test holds under any tail but ignores
the dev-set luck every seed shares (the t counts it); the t counts that luck but trusts its tails. The claim is
thus about the median paired difference (the method wins more seeds than it loses), shown with the mean beside it:
`median_interval` gives that median and its distribution-free interval from the order statistics of the paired
differences (the interval the sign test inverts: a median outside it is rejected by the sign test at its level),
each degenerate run as the worst score there is (an infinite difference), so the interval is over every paired
seed, as the test is.

Where it is required. At every look of a sequential design (`suite.stats.sequential.Design.decide`): a look's level
is a share of alpha / m, where the t's far tail decides; before the seeds let the sign test reach the level (with
O'Brien-Fleming and 36 comparisons: 15 seeds) no difference is claimed. In a fixed-sample report from
`SIGN_GUARD_SEEDS` paired seeds on: below that the sign test cannot reach usual levels (its smallest p is 2^(1 - n):
0.0625 at 5 seeds, 0.0039 at 9), and requiring it would forbid every claim of a 3-5 seed study, so there the t over
healthy pairs decides alone, a survivor comparison (where collapse is the low tail of how a run would have scored,
it favours the method that collapses). Equivalence claims are unchanged (TOST on the t).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

__all__ = ["SIGN_GUARD_SEEDS", "agrees", "median_interval", "sign_counts", "sign_p"]  # what the rest of the suite uses

SIGN_GUARD_SEEDS = 10


def sign_counts(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(wins, losses) of the method over the last axis of paired differences (score orientation: d > 0 a win)."""
    d = np.asarray(diffs, dtype=float)
    return (d > 0).sum(axis=-1), (d < 0).sum(axis=-1)


def sign_p(wins, losses) -> np.ndarray:
    """Two-sided exact sign test p-value of wins against losses (1 without either)."""
    w, lo = np.asarray(wins, dtype=float), np.asarray(losses, dtype=float)
    n = w + lo
    with np.errstate(invalid="ignore"):
        p = np.minimum(1.0, 2 * stats.binom.cdf(np.minimum(w, lo), n, 0.5))
    return np.where(n > 0, p, 1.0)


def agrees(diff, p_sign, excess, n_paired, level) -> np.ndarray:
    """Whether the sign test lets a difference claim at `level` stand: fewer than SIGN_GUARD_SEEDS paired seeds, or
    p_sign below the level with wins minus losses (`excess`) of the same sign as the mean difference `diff`."""
    diff, p_sign, excess = (np.asarray(x, dtype=float) for x in (diff, p_sign, excess))
    few = np.asarray(n_paired) < SIGN_GUARD_SEEDS
    with np.errstate(invalid="ignore"):
        return few | ((p_sign < level) & (np.sign(excess) == np.sign(diff)) & (excess != 0))


def median_interval(diffs, level: float = 0.95) -> tuple[float, float, float]:
    """(median, low, high) of paired differences over every paired seed (a degenerate run's an infinite one): the
    order statistics x(k) and x(n + 1 - k) with the largest k whose two-sided binomial tail 2 P(B <= k - 1), B ~
    Bin(n, 1/2), is at most 1 - level, so the interval covers the true median with probability at least `level` for
    any continuous distribution. NaN bounds where n seeds cannot reach the level (n < 6 at 95%: 2^(1 - n) > 0.05);
    a NaN median without seeds, or where the middle two are -inf and +inf."""
    d = np.sort(np.asarray(diffs, dtype=float))
    n = len(d)
    if not n:
        return math.nan, math.nan, math.nan
    with np.errstate(invalid="ignore"):
        middle = float(np.median(d))
    k = int(stats.binom.ppf((1 - level) / 2, n, 0.5))   # the largest k with P(B <= k - 1) <= (1 - level) / 2
    while k > 0 and 2 * stats.binom.cdf(k - 1, n, 0.5) > 1 - level:
        k -= 1
    if k < 1:
        return middle, math.nan, math.nan
    return middle, float(d[k - 1]), float(d[n - k])
