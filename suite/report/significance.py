"""Statistics of comparisons against the reference method, each from a well-kept library where one exists.

- paired differences: runs of two methods with the same seed share the classifier initialisation and the batch order,
  so they are compared seed by seed (`paired`), never as two independent samples;
- `paired_t_p`: two-sided paired t-test (scipy's one-sample t-test of the differences, vectorised over leading axes);
- `bootstrap_ci`: percentile bootstrap over seeds of the mean paired difference (scipy.stats.bootstrap);
- `holm` (Holm 1979, step-down) and `benjamini_hochberg` (scipy.stats.false_discovery_control): adjusted p-values
  across the whole table;
- `aso_epsilon`: almost stochastic order (Dror et al. 2019, del Barrio et al. 2018), the `deepsig` implementation;
- `power_paired`, `min_detectable`, `seeds_needed`: power of the paired t-test from the noncentral t distribution.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import optimize, stats

from suite.stats.families import CORRECTIONS  # noqa: F401  the report's names of the corrections

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
POWER = 0.8
ASO_THRESHOLD = 0.2          # epsilon_min below this: "almost stochastically better" (deepsig's recommendation)
# deepsig's defaults (1000 x 1000 bootstrap, dt 0.005) take ~10 s per comparison on a busy 2-core CPU; these take
# under a second, so a table of ~100 comparisons stays near a minute, and move epsilon_min by about 0.01.
ASO_SETTINGS = {"num_samples": 300, "num_bootstrap_iterations": 300, "dt": 0.05}


def paired(a: dict[float, float], b: dict[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Values of two cells {seed: value} at the seeds both have, in seed order."""
    seeds = sorted(set(a) & set(b))
    return np.array([a[s] for s in seeds], dtype=float), np.array([b[s] for s in seeds], dtype=float)


def paired_t_p(diffs: np.ndarray) -> np.ndarray:
    """Two-sided paired t-test p-values of differences (..., n_seeds) against 0.

    n < 2: NaN (no test). Differences all equal have zero variance, where the t statistic is undefined (scipy gives
    NaN or inf): all 0 gives p = 1 (no difference at all); equal and non-zero gives NaN (no test, not marked), since
    a handful of seeds agreeing exactly says more about the setup (e.g. a deterministic tie) than about noise.
    """
    d = np.asarray(diffs, dtype=float)
    if d.shape[-1] < 2:
        return np.full(d.shape[:-1], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zero variance: scipy warns and returns NaN or inf
        p = np.asarray(stats.ttest_1samp(d, 0.0, axis=-1).pvalue, dtype=float)
    constant = np.all(d == d[..., :1], axis=-1)
    return np.where(constant, np.where(d[..., 0] == 0, 1.0, np.nan), p)


def bootstrap_ci(diffs: np.ndarray, seed: int = 0, level: float = CONFIDENCE,
                 resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `diffs` (resampling seeds); NaNs with fewer than 2 values."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return math.nan, math.nan
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])
    res = stats.bootstrap((d,), np.mean, confidence_level=level, n_resamples=resamples, method="percentile",
                          vectorized=True, random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values along the last axis (statsmodels' `multipletests`); NaNs (no test) stay NaN
    and are not counted in the family."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p, dtype=float)
    if not p.size:
        return p.copy()
    flat = p.reshape(-1, p.shape[-1]) if p.ndim else p.reshape(1, 1)
    out = np.full(flat.shape, np.nan)
    for values, target in zip(flat, out):
        tested = np.isfinite(values)
        if tested.any():
            target[tested] = multipletests(values[tested], method="holm")[1]
    return out.reshape(p.shape)


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (scipy), NaNs left out of the family."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.isfinite(p)
    if tested.any():
        out[tested] = stats.false_discovery_control(p[tested], method="bh")
    return out


def adjust(p: np.ndarray, correction: str) -> np.ndarray:
    return holm(p) if correction == "holm" else benjamini_hochberg(p)


def aso_epsilon(a: np.ndarray, b: np.ndarray, num_comparisons: int, seed: int = 0) -> float:
    """epsilon_min of "a is almost stochastically greater than b" (0: always better; 0.5: no order; 1: worse).

    `num_comparisons` applies deepsig's Bonferroni correction to the confidence level of the estimate.
    """
    from deepsig import aso

    if len(a) < 2 or len(b) < 2:
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical samples: deepsig warns about a zero denominator
        return float(aso(np.asarray(a, dtype=float), np.asarray(b, dtype=float), confidence_level=CONFIDENCE,
                         num_comparisons=max(num_comparisons, 1), seed=seed, show_progress=False,
                         **ASO_SETTINGS))


def power_paired(delta: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test with n pairs to detect a true mean difference `delta`."""
    if n < 2 or not sd > 0:
        return math.nan
    df = n - 1
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = delta * math.sqrt(n) / sd
    # P(T > crit) + P(T < -crit); the lower tail as the upper tail of -T (scipy's nct.cdf can return NaN far out)
    far = stats.nct.sf(crit, df, -abs(nc))
    return float(stats.nct.sf(crit, df, abs(nc)) + (far if math.isfinite(far) else 0.0))


def min_detectable(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """Smallest true difference the paired t-test detects with the given power (NaN when undefined)."""
    if n < 2 or not sd > 0:
        return math.nan
    hi = sd
    while power_paired(hi, sd, n, alpha) < power:
        hi *= 2
        if hi > 1e9 * sd:
            return math.inf
    return float(optimize.brentq(lambda d: power_paired(d, sd, n, alpha) - power, 0.0, hi, xtol=1e-6 * sd))


def seeds_needed(delta: float, sd: float, alpha: float, power: float = POWER, most: int = 10_000) -> int | None:
    """Fewest pairs with which the paired t-test detects `delta` with the given power (None: more than `most`)."""
    if not sd > 0:
        return None
    lo, hi = 2, 2
    while power_paired(delta, sd, hi, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > most:
            return None
    while lo < hi:  # the smallest n in [lo, hi] with enough power (power grows with n)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if power_paired(delta, sd, mid, alpha) < power else (lo, mid)
    return lo


def pooled_sd(diff_sets: list[np.ndarray]) -> float:
    """Pooled standard deviation of several sets of paired differences (each with its own mean)."""
    usable = [d for d in diff_sets if len(d) > 1]
    dof = sum(len(d) - 1 for d in usable)
    if not dof:
        return math.nan
    return math.sqrt(sum(float(np.sum((d - d.mean()) ** 2)) for d in usable) / dof)


def beats_level_p(values: np.ndarray, level: float, higher: bool = True) -> float:
    """One-sided one-sample t-test p-value that the mean of `values` is better than `level` (above it when
    `higher`). Identical values: 0 when they are better, 1 otherwise; a single value: NaN (no test)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return math.nan
    if np.all(v == v[0]):
        return 0.0 if (v[0] > level if higher else v[0] < level) else 1.0
    return float(stats.ttest_1samp(v, level, alternative="greater" if higher else "less").pvalue)
