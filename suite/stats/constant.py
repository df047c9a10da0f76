"""Whether a cell beats the predictor that learns nothing (majority class / constant mean), over both noise sources.

Each run is paired with the constant predictor on the dev examples it was scored on, and the evidence is the
differences' (`suite.stats.evidence.compare_runs`): the seeds' spread plus the dev examples resampled, the constant
predictor re-scored on each resample too (its class stays the dev set's majority; its share of the resample moves).
One-sided, in the task's direction: a dev set of a few hundred examples can leave a model a few points above the
majority class without evidence that it beats it on the task's examples. A run without a score (constant
predictions: an undefined correlation) counts at the predictor's score. Over seeds only (a one-sample t-test) on
regression tasks (the constant mean's correlation is undefined on every resample; other regression metrics are
treated alike) and where the runs kept no readable predictions or were scored on different examples; `seeds_only`
says which. A single run gives no test, only its sign.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats

from suite.stats.evidence import RunOutcome, bootstrap_seed, compare_runs, loaded_predictions

# what the rest of the suite uses; other names are this module's own
__all__ = ["VsConstant", "beats_level_p", "majority_predictions", "vs_constant"]


@dataclasses.dataclass(frozen=True)
class VsConstant:
    margin: float      # mean points above the predictor (below it for lower-is-better tasks)
    runs: int          # runs counted, those without a score included
    p: float           # one-sided; nan for a single run
    better: bool       # p < alpha (a single run: its sign)
    seeds_only: bool   # the dev examples' noise is not in p (no predictions, or a regression task)


def beats_level_p(values: np.ndarray, level: float, higher: bool = True) -> float:
    """One-sided one-sample t-test p-value that the mean of `values` is better than `level` (above it when
    `higher`). Identical values: 0 when they are better, 1 otherwise; a single value: NaN (no test)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return math.nan
    if np.all(v == v[0]):
        return 0.0 if (v[0] > level if higher else v[0] < level) else 1.0
    return float(stats.ttest_1samp(v, level, alternative="greater" if higher else "less").pvalue)


def majority_predictions(preds: dict) -> dict:
    """The majority-class predictor on the examples one run was scored on, per eval split, as a run's sidecar."""
    out = {}
    for suffix, arrays in preds.items():
        n_labels = arrays["logits"].shape[1]
        majority = int(np.bincount(arrays["label"].astype(int), minlength=n_labels).argmax())
        logits = np.eye(n_labels, dtype=np.float32)[np.full(len(arrays["label"]), majority)]
        # the same examples, with their sources where rows share them (their se is jackknifed by group)
        out[suffix] = {**{k: arrays[k] for k in ("index", "label", "group") if k in arrays}, "logits": logits}
    return out


def _loaded(path) -> dict | None:
    """A run's sidecar with the arrays this test reads; None for no path or an unreadable or incomplete file."""
    if not isinstance(path, str) or not path:
        return None
    preds = loaded_predictions(path)
    ok = preds and all({"index", "label", "logits"} <= set(arrays) and np.ndim(arrays["logits"]) == 2
                       for arrays in preds.values())
    return preds if ok else None


def vs_constant(task: str, scores: np.ndarray, predictions: Sequence[str | None], constant: float, alpha: float,
                higher: bool = True, regression: bool = False) -> VsConstant:
    """`scores`: one cell's finished runs (x100; NaN: no score), `predictions` their sidecars ('' or None: none),
    `constant` the predictor's score (x100, finite)."""
    scores = np.asarray(scores, dtype=float)
    scores = np.where(np.isfinite(scores), scores, constant)
    margin = float(scores.mean() - constant) * (1 if higher else -1)
    if len(scores) == 1:
        return VsConstant(margin, 1, math.nan, margin > 0, True)
    preds = [None] * len(scores) if regression else [_loaded(p) for p in predictions]
    ev = None
    if any(p is not None for p in preds):
        model = {i: RunOutcome(float(s), p) for i, (s, p) in enumerate(zip(scores, preds))}   # paired by run
        baseline = {i: RunOutcome(constant, majority_predictions(p) if p else None) for i, p in enumerate(preds)}
        ev = compare_runs(task, model, baseline, seed=bootstrap_seed(task, "constant"), higher_is_better=higher,
                          collapse_endpoint=False)
    if ev is None or not math.isfinite(ev.p):
        p = beats_level_p(scores, constant, higher)
        return VsConstant(margin, len(scores), p, p < alpha, True)
    p = ev.p / 2 if (ev.diff > 0) == higher else 1 - ev.p / 2
    # no dev-example variance although runs kept predictions: the examples could not be resampled (e.g. runs scored
    # on different examples), unless the runs predicted the constant exactly (no difference on any example)
    seeds_only = not ev.has_examples and abs(ev.diff) > 0
    return VsConstant(margin, len(scores), float(p), bool(p < alpha), seeds_only)
