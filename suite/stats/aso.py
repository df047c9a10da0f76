"""Almost stochastic order (Dror et al. 2019, del Barrio et al. 2018), the `deepsig` implementation: whether one
method's score distribution over seeds dominates another's.

The report computes it only for task comparisons with bimodal outcomes (collapsed and healthy runs, `suite.stats
.collapse`) on either side and at least ASO_MIN_SEEDS seeds on both: there the mean difference mixes how often a
method collapses with how well it does otherwise. Elsewhere it adds nothing the interval does not say (at 3-5 seeds
it is 0 whenever the scores do not overlap).
"""
from __future__ import annotations

import math
import warnings
from typing import Hashable, Sequence

import numpy as np

from suite.stats import collapse

# what the rest of the suite uses; other names are this module's own
__all__ = ["ASO_MIN_SEEDS", "ASO_THRESHOLD", "aso_epsilon", "where_bimodal"]

CONFIDENCE = 0.95
ASO_THRESHOLD = 0.2          # epsilon_min below this: "almost stochastically better" (deepsig's recommendation)
ASO_MIN_SEEDS = 5            # below this almost stochastic order is 0 whenever the two sets of scores do not overlap
# deepsig's defaults (1000 x 1000 bootstrap, dt 0.005) take ~10 s per comparison on a busy 2-core CPU; these take
# under a second, so a table of ~100 comparisons stays near a minute, and move epsilon_min by about 0.01.
ASO_SETTINGS = {"num_samples": 300, "num_bootstrap_iterations": 300, "dt": 0.05}


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


def where_bimodal(comparisons: Sequence[tuple[Hashable, np.ndarray, np.ndarray, float, bool]]) -> dict:
    """{key: epsilon_min that `method` is better} for the comparisons (key, method's scores, reference's scores,
    collapse floor, higher is better) whose outcomes are bimodal on either side with ASO_MIN_SEEDS seeds on both.
    The chosen ones form one Bonferroni family, and the i-th of them (in the order given) bootstraps with seed i."""
    chosen = [(key, a, b, higher) for key, a, b, floor, higher in comparisons
              if min(len(a), len(b)) >= ASO_MIN_SEEDS
              and (collapse.bimodal(a, floor, higher) or collapse.bimodal(b, floor, higher))]
    return {key: aso_epsilon(a if higher else -a, b if higher else -b, len(chosen), seed=i)
            for i, (key, a, b, higher) in enumerate(chosen)}
