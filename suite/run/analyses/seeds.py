"""How much do attention and predictions vary across seeds? (Wiegreffe & Pinter 2019, "Attention is not not
Explanation").

Each run stores, for a fixed dev subset (the same examples for every seed), the last layer's [CLS] attention row
averaged over heads (over all real tokens) and the predicted distribution. Two runs of the same configuration that
differ only in the seed are then compared per example: the Jensen-Shannon divergence of their attention (natural
log, so in [0, ln 2]) next to the total-variation distance of their predictions (1/2 sum |p - q|, in [0, 1]; for
regression the absolute difference of the predicted values). The spread of these per-example values is the natural
variance against which differences between methods are read.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.spatial.distance import jensenshannon


def js_divergence(p, q) -> float:
    """Jensen-Shannon divergence in nats; inputs are normalised to sum to one (scipy returns the square root)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if len(p) != len(q) or p.sum() <= 0 or q.sum() <= 0:
        return math.nan
    return float(jensenshannon(p, q)) ** 2


def total_variation(p, q) -> float:
    """1/2 sum |p - q| for distributions; |p - q| for one regression value."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if len(p) == 1:
        return float(abs(p[0] - q[0]))
    return float(0.5 * np.abs(p - q).sum())


def run_arrays(views) -> dict:
    """What one run stores: per example its [CLS] attention (None when hidden) and its prediction."""
    from suite.run.analyses.importance import cls_attention

    return {"attention": [None if v.attention is None else [round(float(x), 6) for x in cls_attention(v.attention[-1])]
                          for v in views],
            "prediction": [[round(float(x), 6) for x in v.prediction] for v in views]}


def compare_runs(a: dict, b: dict) -> dict[str, list[float]]:
    """Per-example JSD of attention and TVD of predictions between two runs' `run_arrays` (same examples)."""
    if len(a["prediction"]) != len(b["prediction"]):
        raise ValueError("the two runs analysed different dev subsets")
    jsd = [js_divergence(x, y) if x is not None and y is not None else math.nan
           for x, y in zip(a["attention"], b["attention"])]
    tvd = [total_variation(x, y) for x, y in zip(a["prediction"], b["prediction"])]
    return {"jsd": jsd, "tvd": tvd}
