"""Collapsed runs, two ways.

- By behaviour (`degenerate`, from a run's per-example predictions over every eval split): a classification run
  whose predictions are constant or near-constant (one class for at least `NEAR_CONSTANT` = 98% of the examples; on
  the quick-preset study's CoLA runs this separates the 17 runs that label (nearly) every sentence acceptable, MCC 0
  to 0.6, from the rest, none of which exceeds 94%); a regression run whose predictions are constant or whose
  Pearson correlation with the labels is within `DEGENERATE_Z` standard errors of 0 (|r| sqrt(N) < 2.58: a
  two-sided test at 1% that it is 0 does not reject). This is the endpoint the statistics use: a degenerate run is
  a state (a CoLA run that labels every sentence acceptable), not a score below a line (an MRPC run at 72%
  accuracy that predicts the positive class on 74% of pairs is a poor run, not a degenerate one). The comparisons
  score methods among the seeds where neither run degenerated and compare how often each degenerates with an exact
  test of their own (`degenerate_test`).
- By score (`floor`, `rate`): not above the task's majority-class (or constant-mean) score plus a declared margin
  (`report: collapse_floor:`, points x100; default 1), in the direction of the task's metric. It needs no
  predictions, so it stays the stability table's descriptive rate and the rule for runs without a predictions
  sidecar. Where a cell holds both collapsed and healthy runs its outcomes are bimodal: a mean ± sd describes
  neither mode, so the leaderboard shows the median with the collapsed count.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_MARGIN", "bimodal", "degenerate", "degenerate_test", "floor",
           "rate"]

DEFAULT_MARGIN = 1.0
DEGENERATE_Z = 2.576   # the two-sided 1% quantile: a correlation this close to 0 is no evidence of learning
NEAR_CONSTANT = 0.98   # a classifier giving one class to this share of the examples predicts (nearly) a constant


def degenerate(predictions, regression: bool) -> bool | None:
    """Whether a run degenerated (see the module docstring), from its loaded predictions {suffix: {"label",
    "logits"}}; None when there are none to judge."""
    if not predictions:
        return None
    from suite.api.metrics import predictions as predicted

    pred = np.concatenate([predicted(np.asarray(p["logits"]), regression) for p in predictions.values()])
    gold = np.concatenate([np.asarray(p["label"]) for p in predictions.values()])
    if len(pred) < 3 or np.unique(pred).size < 2:
        return True
    if not regression:
        return bool(np.unique(pred, return_counts=True)[1].max() >= NEAR_CONSTANT * len(pred))
    if not np.std(gold) > 0:
        return None
    r = float(np.corrcoef(pred.astype(float), gold.astype(float))[0, 1])
    return not abs(r) * math.sqrt(len(pred)) >= DEGENERATE_Z


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


def degenerate_test(method: Sequence[bool], reference: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value that two methods degenerate equally often, from their flags at the seeds they
    share (paired: a seed fixes the initialisation and batch order of both). Only seeds where exactly one run
    degenerated carry information; under the null each is the method's with probability 1/2. 1 without any."""
    from scipy.stats import binomtest

    a, b = np.asarray(method, dtype=bool), np.asarray(reference, dtype=bool)
    only_method, only_reference = int((a & ~b).sum()), int((~a & b).sum())
    if only_method + only_reference == 0:
        return 1.0
    return float(binomtest(only_method, only_method + only_reference, 0.5).pvalue)
