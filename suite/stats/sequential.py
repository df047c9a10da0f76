"""Group-sequential decisions: look at a comparison after every round of seeds and stop it as soon as the evidence
decides it, while the chance of a false claim over all looks stays at most alpha.

Testing at alpha at every look would not: with looks at 5, 10, 15 and 20 seeds a true null is rejected 13% of the
time at alpha 5% (tests/test_sequential.py measures it). Instead alpha is *spent* across the looks (Lan & DeMets 1983):
a spending function alpha(t) says how much of alpha may be used up by the information fraction t = n / cap (seeds
so far over the cap), and the boundary c_k of look k is the critical value at which the looks' joint probability of
a first crossing at k equals alpha(t_k) - alpha(t_{k-1}). The looks' statistics are jointly normal with
corr(Z_j, Z_k) = sqrt(t_j / t_k); `boundaries` integrates that distribution numerically (the tests check it against
`scipy.stats.multivariate_normal` and published tables). Spending functions, each side spending alpha / 2:

- `obrien-fleming` (default): alpha(t) = 4 - 4 Phi(z_{1-alpha/4} / sqrt(t)); spends almost nothing early, so the last
  look keeps nearly the fixed-sample level (4 equal looks at alpha 0.05: |z| >= 4.33, 2.96, 2.36, 2.01).
- `pocock`: alpha(t) = alpha ln(1 + (e - 1) t); the same boundary at every look (2.37, 2.37, 2.36, 2.35): earlier
  stops, a stricter last look.

The boundaries are applied as nominal levels to each look's own test (`suite.stats.evidence`: its p-value over seeds
and dev examples, not a normal z), the "significance level" approach of Jennison & Turnbull (2000, ch. 11). Seeds,
not the standard error, measure the information: the dev-example part of the variance does not shrink with more
seeds, which makes successive looks more correlated than sqrt(t_j / t_k) and the boundaries conservative. The
simulation tests check the whole procedure's error rates with both noise sources, with few seeds and with collapsed
runs. A look that adds no seed (every new run failed) spends nothing; the last planned look spends what is left.

Each look of a comparison ends in one of:
- `efficacy`: p < the look's nominal level: better or worse (the direction from the task's metric), and the exact
  paired sign test over every paired seed (`suite.stats.sign`) agrees at the same level, at every look: a look's
  level is a share of alpha / m, where the t's far tail is not to be trusted alone (a fixed-sample verdict needs
  the sign test from `SIGN_GUARD_SEEDS` paired seeds on).
- `equivalence`: the two one-sided tests (TOST) reject |diff| >= margin at the look's one-sided nominal level, the
  same spending of alpha_equiv (alpha by default) over the looks.
- `futility`: not the last look, at least FUTILITY_MIN_SEEDS (10) compared seeds, and the predictive power of
  reaching either decision by the cap is below `futility` (default 0.07): the chance of a decision averaged over what
  the true difference and the seed sd may be given the seeds so far (Spiegelhalter, Freedman & Blackburn 1986), not
  the conditional power at the point estimate, which treats a 5-seed estimate as the truth (among comparisons that
  rule stopped, up to 63% would have been decided by the cap). It only ever stops a comparison without a claim, so
  it cannot raise an error rate (it is non-binding); lab/stats/futility.py measures, at the design's own level
  and a true difference of 0, how often a comparison it stopped would have been decided.
- `cap`: the last look, undecided.
- otherwise `continue`: the comparison gets the next round of seeds.

A false difference claim needs diff = 0 and a false equivalence claim needs |diff| >= margin: the two cannot both be
false for one comparison, so each comparison tests both at its own level. The primary family's family-wise error is
held by Bonferroni: m primary comparisons get alpha / m each (`family_alpha`), spent over their looks; exploratory
comparisons get no looks (they run at the starting seeds only). Holm's step-down could pass a rejected comparison's
share on to the others (Maurer & Bretz 2013 show how with spending functions); this module does not, so it is
conservative for m > 1.

No well-kept Python library for group-sequential designs was found on PyPI (what is there, such as gsdesign 0.1,
gsmethods 0.0 or earlysign 0.2, are young 0.x releases of small projects; R's gsDesign and rpact are the established
ones), so the boundaries are computed here with scipy and checked against published tables in the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

from suite.stats.sign import SIGN_GUARD_SEEDS, agrees

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_FUTILITY", "Design", "SMALL_FAMILY", "SPENDING", "boundaries", "family_alpha", "plan_looks",
           "spent"]

SPENDING = ("obrien-fleming", "pocock")
REASONS = ("efficacy", "equivalence", "futility", "cap", "continue")
DEFAULT_FUTILITY = 0.07  # 0.1 stopped ones of which up to 13.5% would have been decided (lab/stats/futility.py)
SD_NODES = 32   # quantiles of the seed sd's posterior that predictive power averages over
FUTILITY_MIN_SEEDS = 10   # no futility stop before the seed sd is known to 9 degrees of freedom
_GRID = 801  # Simpson points per look: boundaries to about 1e-6


def spent(t: float, alpha: float, spending: str = "obrien-fleming") -> float:
    """The part of the two-sided alpha that may be used up by information fraction t (0 <= t <= 1); each side
    spends half (the symmetric design of Lan & DeMets' tables)."""
    t = min(max(t, 0.0), 1.0)
    if t == 0:
        return 0.0
    if spending == "obrien-fleming":
        return float(4 * stats.norm.sf(stats.norm.isf(alpha / 4) / math.sqrt(t)))
    if spending == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"unknown spending function {spending!r}; valid: {', '.join(SPENDING)}")


def _grid(half_width: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and Simpson weights over (-half_width, half_width)."""
    s = np.linspace(-half_width, half_width, _GRID)
    w = np.full(_GRID, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return s, w * (s[1] - s[0]) / 3


@lru_cache(maxsize=4096)
def boundaries(fractions: tuple[float, ...], alpha: float, spending: str = "obrien-fleming") -> tuple[float, ...]:
    """Two-sided critical values |z| >= c_k, one per look at the given information fractions (increasing, the last
    usually 1). A look whose fraction does not grow spends nothing: its boundary is infinite.

    The looks' statistics are those of a Brownian motion, S_k = Z_k sqrt(t_k) with independent normal increments,
    so the density of S_k on the region where no look has crossed yet follows from the previous one by one
    convolution (Armitage, McPherson & Rowe 1969), done here on a Simpson grid; each boundary solves
    P(first crossing at look k) = alpha(t_k) - alpha(t_{k-1})."""
    t = np.asarray(fractions, dtype=float)
    # a first look at fraction 0 (every run of an arm failed: no paired seed) spends nothing, like any look whose
    # fraction does not grow
    if len(t) == 0 or (np.diff(t) < 0).any() or t[0] < 0 or not 0 < t[-1] <= 1 + 1e-12:
        raise ValueError(f"information fractions must not decrease and must end within (0, 1]: {fractions}")
    bounds: list[float] = []
    points, density = np.zeros(1), np.ones(1)  # S_0 = 0 with probability 1
    previous_t = previous_spent = 0.0
    for k in range(len(t)):
        step = math.sqrt(t[k] - previous_t) if t[k] > previous_t else 0.0
        budget = spent(t[k], alpha, spending) - previous_spent
        if budget <= 1e-12 or step == 0:
            bounds.append(math.inf)
            continue

        def crossing(c: float) -> float:  # P(first crossing at look k) with boundary c
            b = c * math.sqrt(t[k])
            out = stats.norm.sf((b - points) / step) + stats.norm.cdf((-b - points) / step)
            return float(out @ density)

        c = 0.0 if crossing(0.0) <= budget else float(optimize.brentq(lambda c: crossing(c) - budget, 0.0, 40.0,
                                                                       xtol=1e-9))
        bounds.append(c)
        new_points, weights = _grid(c * math.sqrt(t[k]))
        kernel = stats.norm.pdf((new_points[:, None] - points[None, :]) / step) / step
        density = (kernel @ density) * weights  # the sub-density of S_k inside the region, as point masses
        points, previous_t, previous_spent = new_points, t[k], spent(t[k], alpha, spending)
    return tuple(bounds)


# a primary family of about this many comparisons keeps each one's power: under the sign-test guard, power at a true
# difference of one seed sd is 0.37 with 36 comparisons and 0.60 with 9 (issue 62); `plan` and the report show a
# larger declared family's power beside this one's
SMALL_FAMILY = 9


def family_alpha(alpha: float, primary: int) -> float:
    """Each primary comparison's level: Bonferroni over the family (see the module docstring for why not Holm)."""
    return alpha / max(primary, 1)


def plan_looks(start: int, step: int, cap: int) -> tuple[int, ...]:
    """Seed counts of the looks: start, start + step, ..., up to the cap (always the last look)."""
    if start < 2 or step < 1 or cap < start:
        raise ValueError(f"the looks need start >= 2, step >= 1 and cap >= start (got start={start}, "
                         f"step={step}, cap={cap})")
    looks = list(range(start, cap + 1, step))
    if looks[-1] != cap:
        looks.append(cap)
    return tuple(looks)


@dataclass(frozen=True)
class Design:
    """A sequential design for one comparison: its looks (planned seed counts), its level for a difference claim
    (`alpha`, two-sided) and for an equivalence claim (`alpha_equiv`, the TOST level), the spending function and
    the futility threshold (predictive power; 0 never stops for futility)."""

    looks: tuple[int, ...]
    alpha: float
    alpha_equiv: float | None = None
    spending: str = "obrien-fleming"
    futility: float = DEFAULT_FUTILITY
    futility_from: int = FUTILITY_MIN_SEEDS   # the fewest compared seeds at which futility may stop a comparison

    def __post_init__(self):
        if self.spending not in SPENDING:
            raise ValueError(f"unknown spending function {self.spending!r}; valid: {', '.join(SPENDING)}")
        if not 0 < self.alpha < 1 or not 0 <= self.futility < 1:
            raise ValueError(f"alpha must lie in (0, 1) and futility in [0, 1) (got {self.alpha}, {self.futility})")

    @property
    def cap(self) -> int:
        return self.looks[-1]

    def fractions(self, seeds: list[int] | tuple[int, ...]) -> tuple[float, ...]:
        """Information fractions of the looks so far, from the seeds each actually had (failed runs count out); the
        last planned look spends everything left."""
        out, top = [], 0.0
        for k, n in enumerate(seeds):
            t = 1.0 if k == len(self.looks) - 1 else min(n / self.cap, 1.0)
            top = max(top, t)  # a look cannot lose information
            out.append(round(top, 9))
        return tuple(out)

    def levels(self, seeds: list[int] | tuple[int, ...]) -> tuple[float, float]:
        """(two-sided nominal level for a difference, one-sided nominal level for each TOST test) at the latest of
        the looks whose seed counts are given."""
        t = self.fractions(seeds)
        c = boundaries(t, self.alpha, self.spending)[-1]
        c_equiv = boundaries(t, 2 * (self.alpha_equiv or self.alpha), self.spending)[-1]
        return float(2 * stats.norm.sf(c)), float(stats.norm.sf(c_equiv))

    def decide(self, ev, seeds: list[int] | tuple[int, ...]):
        """The look's reason (see REASONS) and verdict. `ev`: a `suite.stats.evidence.Evidence`, or anything with
        its fields as arrays (the simulation tests decide many comparisons at once); `seeds`: the seed counts of
        this comparison's looks so far, this one last."""
        level, level_equiv = self.levels(seeds)
        diff, p, p_equiv = (np.asarray(getattr(ev, k), dtype=float) for k in ("diff", "p", "p_equiv"))
        higher = np.asarray(getattr(ev, "higher_is_better", True), dtype=bool)
        # at every look the exact sign test over every paired seed must agree (suite.stats.sign): a look's level is
        # alpha / m spent over the looks, where the t's far tail alone is not trusted; before the seeds let the sign
        # test reach it (O'Brien-Fleming: below 10-15 seeds) no difference is claimed. A design of one look is a
        # fixed-sample study: the report's rule, the sign test from SIGN_GUARD_SEEDS paired seeds on
        if len(self.looks) > 1:
            n_paired = SIGN_GUARD_SEEDS
        else:
            n_paired = np.asarray(getattr(ev, "n_paired", seeds[-1]))
            n_paired = np.where(n_paired >= 0, n_paired, seeds[-1])
        guard = agrees(diff, getattr(ev, "p_sign", np.nan), getattr(ev, "sign_excess", 0), n_paired, level)
        with np.errstate(invalid="ignore"):
            efficacy = (p < level) & guard          # NaN (no test yet) decides nothing
            equivalent = ~efficacy & (p_equiv < level_equiv)
        last = len(seeds) >= len(self.looks)
        if last or seeds[-1] < self.futility_from:
            # at 5 seeds the seed sd has 4 degrees of freedom: stopping there cut P(equivalence | 0) on SST-2's
            # noise from 33% to 24% even with predictive power (lab/stats/futility.py)
            futile = np.zeros_like(efficacy)
        else:
            with np.errstate(invalid="ignore"):
                futile = ~efficacy & ~equivalent & (self.predictive_power(ev, seeds[-1]) < self.futility)
        reason = np.select([efficacy, equivalent, futile], ["efficacy", "equivalence", "futility"],
                           "cap" if last else "continue")
        verdict = np.select([efficacy & ((diff > 0) == higher), efficacy, equivalent],
                            ["better", "worse", "equivalent"], "undecided")
        return reason, verdict

    def predictive_power(self, ev, n: int, sd_uncertainty: bool = True):
        """P(a decision at the cap) after n paired seeds, predictive: averaged over the true difference and, unless
        `sd_uncertainty` is False, over the seed sd the n seeds leave uncertain.

        The cap's mean difference D_cap = (n D_n + (cap - n) D_rest) / cap, with D_rest the mean of the seeds to
        come. Given the seeds so far and a flat prior, the mean difference on this dev set is normal around the
        estimate with the seeds' variance sigma^2 / n, and D_rest around it with sigma^2 / (cap - n), so D_cap
        is normal around the estimate with variance sigma^2 (cap - n) / (cap n) (the conditional power at the
        estimate would use only sigma^2 (cap - n) / cap^2). It is judged at the last look's nominal levels
        against the cap's standard error, in which the seed part shrinks with seeds and the dev-example part every
        seed shares stays (`suite.stats.power.se_at`), with the test's Cochran-Cox critical values
        (`suite.stats.cochran_cox`: the seed part's t and the example part's normal quantile, weighted by their
        shares of the variance). Without `seed_sd` the whole se is taken as seed noise.

        The seed sd sigma is itself known to n - 1 degrees of freedom (4 at a first look of 5 seeds): the power is
        averaged over its posterior (flat prior on log sigma: sigma^2 = (n - 1) s^2 / chi2_{n-1}), at SD_NODES
        equal-probability quantiles. With sigma taken as the 5-seed estimate, the futility rule stopped 15-22% of
        comparisons at a true difference of 0 that the cap would have decided (docs/sequential.md)."""
        diff, se = (np.asarray(getattr(ev, k), dtype=float) for k in ("diff", "se"))
        n = max(int(n), 1)
        seed_sd = np.asarray(getattr(ev, "seed_sd", se * math.sqrt(n)), dtype=float)
        if n >= self.cap:
            return np.zeros_like(diff)
        if not sd_uncertainty or n < 2:
            return self._power_at(ev, diff, seed_sd, n)
        nodes = stats.chi2.ppf((np.arange(SD_NODES) + 0.5) / SD_NODES, n - 1)
        sds = seed_sd * np.sqrt((n - 1) / nodes).reshape((-1,) + (1,) * seed_sd.ndim)   # every node in one call
        return np.mean(self._power_at(ev, diff, sds, n), axis=0)

    def _power_at(self, ev, diff, seed_sd, n: int):
        """Predictive power with the seed sd taken as known (see `predictive_power`)."""
        shared = np.asarray(getattr(ev, "example_se", 0.0), dtype=float) ** 2
        seed_part = seed_sd ** 2 / self.cap
        se_cap = np.sqrt(seed_part + shared)
        spread = np.maximum(seed_sd * math.sqrt((self.cap - n) / (self.cap * n)), 1e-12)
        level, level_equiv = self.levels(self.looks)   # the last look's levels if every planned seed arrives
        with np.errstate(invalid="ignore", divide="ignore"):
            w = seed_part / (seed_part + shared)

            def critical(tail: float):
                return w * stats.t.isf(tail, self.cap - 1) + (1 - w) * stats.norm.isf(tail)

            reach = critical(level / 2) * se_cap                                 # |mean| a difference claim needs
            within = np.asarray(ev.margin, dtype=float) - critical(level_equiv) * se_cap  # equivalence allows
        p_diff = stats.norm.sf((reach - diff) / spread) + stats.norm.cdf((-reach - diff) / spread)
        p_equiv = np.clip(stats.norm.cdf((within - diff) / spread) - stats.norm.cdf((-within - diff) / spread), 0, 1)
        p_equiv = np.where(within > 0, p_equiv, 0.0)
        return np.where(within >= reach, 1.0, np.clip(p_diff + p_equiv, 0.0, 1.0))
