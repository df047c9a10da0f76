"""Collapsed runs: a fine-tuning run that ends at (or near) the score of a constant predictor, e.g. the majority class.

A run counts as collapsed when its score is not above the floor: the task's majority-class (or constant-mean) score
plus a declared margin (`report: collapse_floor:`, points x100; default 1), in the direction of the task's metric.
Collapse is reported as a rate per method and task. Where a cell holds both collapsed and healthy runs its outcomes
are bimodal: a mean ± sd describes neither mode, so the leaderboard shows the median with the collapsed count.
"""
from __future__ import annotations

import math

import numpy as np

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_MARGIN", "bimodal", "floor", "rate"]

DEFAULT_MARGIN = 1.0


def floor(constant_score: float, margin: float = DEFAULT_MARGIN, higher_is_better: bool = True) -> float:
    """The collapse floor (x100) of a task whose constant predictor scores `constant_score` (x100)."""
    if not math.isfinite(constant_score):
        return math.nan
    return constant_score + margin if higher_is_better else constant_score - margin


def collapsed(values: np.ndarray, floor_value: float, higher_is_better: bool = True) -> np.ndarray:
    """Which runs (scores x100) collapsed; none when the floor is unknown."""
    v = np.asarray(values, dtype=float)
    if not math.isfinite(floor_value):
        return np.zeros(v.shape, dtype=bool)
    return v <= floor_value if higher_is_better else v >= floor_value


def rate(values: np.ndarray, floor_value: float, higher_is_better: bool = True) -> tuple[int, int]:
    """(collapsed runs, runs)."""
    c = collapsed(values, floor_value, higher_is_better)
    return int(c.sum()), int(c.size)


def bimodal(values: np.ndarray, floor_value: float, higher_is_better: bool = True) -> bool:
    """Both collapsed and healthy runs among the values."""
    c = collapsed(values, floor_value, higher_is_better)
    return bool(c.any() and not c.all())
