"""The dev-example part of a comparison's noise: how much the mean paired difference moves when the dev examples are
resampled, from the per-example predictions a run keeps next to its record (the `.npz` sidecar).

Every resample draws the same dev examples for both methods and all seeds (they were scored on the same examples) and
re-scores each run with the task's official metric, so metrics that are not means over examples (F1, Matthews
correlation, Pearson/Spearman) are resampled as they are computed. Accuracy, binary F1 and MCC (from the confusion
counts), Pearson (from weighted moments) and Spearman (Pearson of each resample's ranks) are computed for all
resamples at once from how often each example was drawn; other metrics (plugin ones, multi-class F1 / MCC) are
computed on each resample.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from suite.api import metrics

__all__ = ["example_variance", "split_variance"]  # what the rest of the suite uses; other names are this module's own

SCALE = 100.0
EXAMPLE_RESAMPLES = 200      # each re-scores every seed of both methods: ~1 s per comparison on a busy CPU


def _task_spec(task: str):
    from suite.api.tasks import get_task

    try:
        return get_task(task)
    except Exception:  # noqa: BLE001  a task from an uninstalled plugin: no metric to re-score with
        return None


def _weighted(name: str, pred: np.ndarray, gold: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """A built-in metric on every resample at once: w (resamples, examples) counts how often each example was drawn.
    None where no closed form applies here (plugin metrics, multi-class F1 / MCC)."""
    n = w.sum(axis=1)
    if name == "accuracy":
        return w @ (pred == gold).astype(float) / n
    binary = set(np.unique(gold)) <= {0, 1} and set(np.unique(pred)) <= {0, 1}
    if name in ("f1", "mcc") and binary:
        p, g = pred.astype(bool), gold.astype(bool)
        tp, fp, fn = w @ (p & g).astype(float), w @ (p & ~g).astype(float), w @ (~p & g).astype(float)
        tn = n - tp - fp - fn
        with np.errstate(invalid="ignore", divide="ignore"):
            if name == "f1":    # scikit-learn's zero_division=0
                return np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0)
            denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
            return np.where(denominator > 0, (tp * tn - fp * fn) / denominator, 0.0)   # scikit-learn: 0
    if name in ("pearson", "spearman"):
        x, y = pred.astype(float), gold.astype(float)
        if name == "spearman":  # Pearson of the ranks each resample gives its examples (ties averaged, as scipy)
            x, y = _resample_ranks(x, w), _resample_ranks(y, w)
        mx, my = (w * x).sum(axis=1) / n, (w * y).sum(axis=1) / n
        cov = (w * x * y).sum(axis=1) / n - mx * my
        vx, vy = (w * x * x).sum(axis=1) / n - mx ** 2, (w * y * y).sum(axis=1) / n - my ** 2
        with np.errstate(invalid="ignore", divide="ignore"):
            # ranks' moments are ~n^2: the floor that tells a constant resample is relative to them
            tiny = 1e-12 * (np.maximum(mx ** 2, my ** 2) if name == "spearman" else 1.0)
            return np.where((vx > tiny) & (vy > tiny), cov / np.sqrt(np.maximum(vx * vy, 0.0)), np.nan)
    return None


def _resample_ranks(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(resamples, examples): the average rank an example's copies get in each resample (w: how often each example
    was drawn), i.e. what ranking the resampled array would give it; examples not drawn get a rank nobody weighs."""
    order = np.argsort(v, kind="stable")
    sv = v[order]
    first = np.r_[True, sv[1:] != sv[:-1]]                          # a sorted position that starts a new value
    starts = np.flatnonzero(first)
    group = np.cumsum(first) - 1                                    # distinct-value index of each sorted position
    ws = w[:, order]
    total = np.add.reduceat(ws, starts, axis=1)                     # copies of each distinct value
    below = np.cumsum(total, axis=1) - total                        # copies of smaller values
    ranks = np.empty_like(w, dtype=float)
    ranks[:, order] = (below + (total + 1) / 2)[:, group]
    return ranks


def resampled_headline(spec, preds: dict, weights: dict[str, np.ndarray]) -> np.ndarray:
    """The task's headline score (0-1) of one run on each resample of its dev examples (weights per eval suffix)."""
    columns = {}
    for suffix, w in weights.items():
        p = preds[suffix]
        pred = metrics.predictions(p["logits"], spec.is_regression)
        for name in spec.metrics:
            key = f"{name}_{suffix}" if suffix else name
            fast = _weighted(name, pred, p["label"], w)
            if fast is None:    # the metric itself on each resample, drawn as the weights say
                fast = np.array([metrics.METRICS.get(name)(np.repeat(pred, row), np.repeat(p["label"], row))
                                 for row in w.astype(int)])
            columns[key] = fast
    return np.mean(np.stack([columns[k] for k in spec.metric_keys()]), axis=0)


def same_examples(a: dict, b: dict) -> bool:
    runs = [*a.values(), *b.values()]
    return all(set(r) == set(runs[0]) and all(np.array_equal(r[s]["index"], runs[0][s]["index"]) for s in r)
               for r in runs)


def _counts(rng, n: int, resamples: int) -> np.ndarray:
    """(resamples, n): how often each of n examples is drawn in each bootstrap resample."""
    draws = rng.integers(0, n, (resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(draws.ravel(), minlength=resamples * n).reshape(resamples, n).astype(float)


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
    weights = {suffix: _counts(rng, len(arrays["label"]), resamples) for suffix, arrays in a[seeds[0]].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = np.stack([resampled_headline(spec, a[s], weights) - resampled_headline(spec, b[s], weights)
                      for s in seeds], axis=1) * SCALE
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
