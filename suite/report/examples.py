"""Example-level evidence from the per-example dev predictions a run keeps next to its record (a `.npz` sidecar):
a bootstrap interval of the paired difference that resamples dev examples, on top of the one that resamples seeds.

Every resample draws the same dev examples for both methods and all seeds (they were evaluated on the same examples),
re-scores each seed's predictions on them with the task's official metrics, and averages the per-seed differences.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from suite.api import metrics
from suite.report.formatting import SCALE
from suite.report.registry_info import task_spec
from suite.run.record import load_predictions

EXAMPLE_RESAMPLES = 200      # each re-scores every seed of both methods: ~1 s per comparison on a busy CPU


def seed_predictions(sub: pd.DataFrame) -> dict[float, dict]:
    """{seed: {eval suffix: {"index", "label", "logits"}}} of the ok runs that kept predictions."""
    out = {}
    for r in sub[(sub["status"] == "ok") & (sub["predictions"] != "")].itertuples():
        try:
            out[float(r.seed)] = load_predictions(r.predictions)
        except (OSError, ValueError, KeyError):
            continue   # a missing or damaged sidecar: that seed has seed-level evidence only
    return out


def headline_on(spec, preds: dict, picks: dict[str, np.ndarray]) -> float:
    found = {}
    for suffix, idx in picks.items():
        p = preds[suffix]
        found.update(metrics.compute(spec.metrics, p["logits"][idx], p["label"][idx], spec.is_regression, suffix))
    return metrics.headline(found, spec.metric_keys())


def same_examples(a: dict, b: dict) -> bool:
    runs = [*a.values(), *b.values()]
    return all(set(r) == set(runs[0]) and all(np.array_equal(r[s]["index"], runs[0][s]["index"]) for s in r)
               for r in runs)


def example_bootstrap_ci(task: str, a: dict[float, dict], b: dict[float, dict], seed: int = 0,
                         resamples: int = EXAMPLE_RESAMPLES) -> tuple[float, float]:
    """95% percentile interval (x100) of the mean paired difference a - b over resampled dev examples; NaNs when
    the two cells share no seed with predictions, or were evaluated on different examples."""
    spec = task_spec(task)
    seeds = sorted(set(a) & set(b))
    if spec is None or not seeds or not same_examples({s: a[s] for s in seeds}, {s: b[s] for s in seeds}):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    sizes = {suffix: len(arrays["label"]) for suffix, arrays in a[seeds[0]].items()}
    diffs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a resample can make a correlation undefined: that draw is dropped
        for _ in range(resamples):
            picks = {suffix: rng.integers(0, n, n) for suffix, n in sizes.items()}
            diffs.append(np.mean([headline_on(spec, a[s], picks) - headline_on(spec, b[s], picks) for s in seeds]))
    d = np.asarray(diffs, dtype=float) * SCALE
    d = d[np.isfinite(d)]
    if not len(d):
        return math.nan, math.nan
    return float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))
