"""The dev-example part of a comparison's noise: how much the mean paired difference moves when the dev examples are
resampled, from the per-example predictions a run keeps next to its record (the `.npz` sidecar).

Every resample draws the same dev examples for both methods and all seeds (they were scored on the same examples) and
re-scores each run with the task's official metric, so metrics that are not means over examples (F1, Matthews
correlation, Pearson/Spearman) are resampled as they are computed.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from suite.api import metrics

SCALE = 100.0
EXAMPLE_RESAMPLES = 200      # each re-scores every seed of both methods: ~1 s per comparison on a busy CPU


def _task_spec(task: str):
    from suite.api.tasks import get_task

    try:
        return get_task(task)
    except Exception:  # noqa: BLE001  a task from an uninstalled plugin: no metric to re-score with
        return None


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


def example_replicates(task: str, a: dict, b: dict, seed: int = 0,
                       resamples: int = EXAMPLE_RESAMPLES) -> np.ndarray:
    """Bootstrap replicates (resamples, shared seeds), x100, of each shared seed's difference a - b (runs'
    predictions keyed by seed); empty when the two share no seed with predictions or were scored on different
    examples. A resample whose metric is undefined (a constant correlation) is dropped."""
    spec = _task_spec(task)
    seeds = sorted(set(a) & set(b))
    if spec is None or not seeds or not same_examples({s: a[s] for s in seeds}, {s: b[s] for s in seeds}):
        return np.empty((0, 0))
    rng = np.random.default_rng(seed)
    sizes = {suffix: len(arrays["label"]) for suffix, arrays in a[seeds[0]].items()}
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(resamples):
            picks = {suffix: rng.integers(0, n, n) for suffix, n in sizes.items()}
            rows.append([headline_on(spec, a[s], picks) - headline_on(spec, b[s], picks) for s in seeds])
    d = np.asarray(rows, dtype=float) * SCALE
    return d[np.all(np.isfinite(d), axis=1)]


def split_variance(replicates: np.ndarray) -> tuple[float, float]:
    """(variance of the mean over seeds, the part of it that seeds share) from replicates (resamples, seeds).

    Over resampled examples the mean of k seeds' differences varies by v_k = v_shared + v_run / k: v_run is each
    run's own luck on the examples (the seeds' spread already shows it, and it shrinks with more seeds), v_shared
    is which examples the dev set happens to hold (every run shares it; it does not shrink). With one seed's
    variance v_1 = v_shared + v_run: v_shared = (k v_k - v_1) / (k - 1), clipped at 0. One seed: all of it shared.
    """
    r = np.asarray(replicates, dtype=float)
    k = r.shape[-1]
    if r.shape[-2] < 2 or k < 1:
        return math.nan, math.nan
    v_k = np.var(r.mean(axis=-1), axis=-1, ddof=1)
    if k == 1:
        return float(v_k), float(v_k)
    v_1 = np.var(r, axis=-2, ddof=1).mean(axis=-1)
    return float(v_k), float(np.clip((k * v_k - v_1) / (k - 1), 0.0, v_k))


def example_variance(task: str, a: dict, b: dict, seed: int = 0,
                     resamples: int = EXAMPLE_RESAMPLES) -> tuple[float, float]:
    """(variance of the mean paired difference over resampled dev examples, the part shared by all seeds), x100
    squared; NaNs when not estimable."""
    return split_variance(example_replicates(task, a, b, seed, resamples))
