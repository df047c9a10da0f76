"""The reference t distribution of a difference whose variance has a part known to few degrees of freedom (the
seeds) and a part known as good as exactly (the dev examples): Cochran & Cox's (1950) weighted critical value,
expressed as the degrees of freedom of a t with that quantile, so that p-values, intervals and power use one t.
"""
from __future__ import annotations

import numpy as np
from scipy import special, stats
from scipy.optimize import elementwise

__all__ = ["cochran_cox_df"]  # what the rest of the suite uses; other names are this module's own


def cochran_cox_df(seed_var: np.ndarray, example_var: np.ndarray, n: np.ndarray, level: float = 0.95,
                   most: float = 1e6) -> np.ndarray:
    """Degrees of freedom of the t whose two-sided `level` quantile is Cochran-Cox's weighted critical value of the
    seed part (n - 1 df) and the example part (normal). Vectorised; NaN where the variance is 0 or undefined."""
    a, b = np.broadcast_arrays(np.asarray(seed_var, float), np.asarray(example_var, float))
    n = np.broadcast_to(np.asarray(n, float), a.shape)
    if not b.any():   # seeds only: the seed part's own t (the bisection below would find n - 1)
        return np.where(a > 0, n - 1, np.nan)
    q = 0.5 + level / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        w = a / (a + b)
    target = w * stats.t.ppf(q, n - 1) + (1 - w) * stats.norm.ppf(q)
    lo, hi = np.log(np.maximum(n - 1, 1)), np.full(a.shape, np.log(most))

    def above_target(log_df: np.ndarray, goal: np.ndarray) -> np.ndarray:
        return special.stdtrit(np.exp(log_df), q) - goal   # t's quantile falls as df grows

    with np.errstate(invalid="ignore"):
        at_lo, at_hi = above_target(lo, target), above_target(hi, target)
        # Chandrupatla's bracketing method: about 12 quantiles per element where a bisection to the same 1e-13 took 46
        root = elementwise.find_root(above_target, (lo, np.where(at_hi < 0, hi, lo + 1)), args=(target,),
                                     tolerances={"xatol": 1e-13, "xrtol": 1e-15}).x
    log_df = np.where(at_lo <= 0, lo, np.where(at_hi >= 0, hi, root))   # the root outside [n - 1, most]: its bound
    return np.where(np.isfinite(target), np.exp(log_df), np.nan)
