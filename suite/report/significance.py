"""Statistics of comparisons against the reference method, each from a well-kept library where one exists.

- paired differences: runs of two methods with the same seed share the classifier initialisation and the batch order,
  so they are compared seed by seed (`paired`), never as two independent samples;
- `paired_t_p`: two-sided paired t-test over seeds (scipy's one-sample t-test of the differences, vectorised over
  leading axes), used where no per-example predictions exist (the data-efficiency table);
- `adjust`: Holm or Benjamini-Hochberg (`suite.stats.families`);
- `aso_epsilon`: almost stochastic order (Dror et al. 2019, del Barrio et al. 2018), the `deepsig` implementation;
- `beats_level_p`: one-sided test that a cell beats a constant predictor's score.

The comparisons of the leaderboard (intervals over seeds and dev examples, equivalence, verdicts, power) are
`suite.stats`'.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats

from suite.stats import families
from suite.stats.families import CORRECTIONS  # noqa: F401  the report's names of the corrections

CONFIDENCE = 0.95
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


def adjust(p: np.ndarray, correction: str) -> np.ndarray:
    return families.adjust(p, correction)


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


def beats_level_p(values: np.ndarray, level: float, higher: bool = True) -> float:
    """One-sided one-sample t-test p-value that the mean of `values` is better than `level` (above it when
    `higher`). Identical values: 0 when they are better, 1 otherwise; a single value: NaN (no test)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return math.nan
    if np.all(v == v[0]):
        return 0.0 if (v[0] > level if higher else v[0] < level) else 1.0
    return float(stats.ttest_1samp(v, level, alternative="greater" if higher else "less").pvalue)
