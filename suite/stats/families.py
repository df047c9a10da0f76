"""Families of comparisons and their corrections.

A study declares its primary comparisons (`report: primary:`): their family-wise error rate is held by Holm's
step-down procedure (statsmodels' `multipletests`). Every other comparison is exploratory: Benjamini-Hochberg's false
discovery rate (scipy's `false_discovery_control`). Without a declared primary list every comparison is in one family
under the report's `--correction` (Holm by default), as reports before families did. The equivalence p-values (TOST)
are adjusted the same way within the same family: an equivalence claim is a claim too.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from scipy import stats

# what the rest of the suite uses; other names are this module's own
__all__ = ["CORRECTIONS", "adjust", "benjamini_hochberg", "correction_of", "family_of", "holm", "is_primary"]

PRIMARY, EXPLORATORY, ALL = "primary", "exploratory", "all"
CORRECTIONS = {"holm": "Holm-Bonferroni (family-wise error rate)", "bh": "Benjamini-Hochberg (false discovery rate)"}
FAMILY_CORRECTION = {PRIMARY: "holm", EXPLORATORY: "bh"}


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values; NaNs (no test) stay NaN and are not counted in the family."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.isfinite(p)
    if tested.any():
        out[tested] = multipletests(p[tested], method="holm")[1]
    return out


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values, NaNs left out of the family."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.isfinite(p)
    if tested.any():
        out[tested] = stats.false_discovery_control(p[tested], method="bh")
    return out


def adjust(p: Sequence[float], correction: str) -> np.ndarray:
    return holm(np.asarray(p, float)) if correction == "holm" else benjamini_hochberg(np.asarray(p, float))


def is_primary(method: str, column: str, primary: Iterable[str]) -> bool:
    """An entry of `primary` names a method, a task (or average column), or one comparison as METHOD:TASK."""
    for entry in primary:
        m, _, t = entry.partition(":")
        if (t and m == method and t == column) or (not t and entry in (method, column)):
            return True
    return False


def family_of(method: str, column: str, primary: Sequence[str] | None) -> str:
    if not primary:
        return ALL
    return PRIMARY if is_primary(method, column, primary) else EXPLORATORY


def correction_of(family: str, default: str) -> str:
    return FAMILY_CORRECTION.get(family, default)
