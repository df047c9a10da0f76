"""Expected validation performance (Dodge et al. 2019, "Show your work: improved reporting of experimental
results"): the expected best tuning-split score when k configurations are drawn at random, with replacement, from
the N a method tried, for k = 1..N.

With the scores sorted from worst to best, v_(1) <= ... <= v_(N), the best of k draws is v_(i) with probability
(i/N)^k - ((i-1)/N)^k, so

    E[best of k] = sum_i v_(i) [(i/N)^k - ((i-1)/N)^k]

and its spread is sqrt(E[best^2] - E[best]^2) from the same weights. Ties need no care: tied values share their
weights. For a metric where lower is better the best is the minimum (the scores are negated, the result negated back).
At k = 1 the expectation is the mean score; at k = N it is below the best score tried unless every draw finds it.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["MIN_TUNING_SEEDS", "expected_best", "max_weights"]

MIN_TUNING_SEEDS = 3   # fewer tuning seeds than this: a selection may be one seed's luck (Bouthillier et al. 2021)


def max_weights(n: int, k: int) -> np.ndarray:
    """P(the best of k draws with replacement from n sorted values is the i-th worst), i = 1..n."""
    i = np.arange(1, n + 1, dtype=float)
    return (i / n) ** k - ((i - 1) / n) ** k


def expected_best(scores: Sequence[float], higher_is_better: bool = True,
                  ks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(expected best score, its standard deviation) at each k (default 1..N) of the finite scores given; empty
    arrays when none is finite. A failed configuration (NaN) is left out, so N counts those with a score."""
    values = np.asarray([s for s in scores if s is not None and math.isfinite(s)], dtype=float)
    n = len(values)
    ks = list(range(1, n + 1)) if ks is None else list(ks)
    if not n:
        return np.full(len(ks), np.nan), np.full(len(ks), np.nan)
    if any(k < 1 for k in ks):
        raise ValueError(f"k must be at least 1, got {min(ks)}")
    sign = 1.0 if higher_is_better else -1.0
    ordered = np.sort(sign * values)
    means, stds = [], []
    for k in ks:
        w = max_weights(n, k)
        mean = float(w @ ordered)
        var = float(w @ ordered ** 2) - mean ** 2
        means.append(sign * mean)
        stds.append(math.sqrt(max(var, 0.0)))
    return np.asarray(means), np.asarray(stds)
