"""Scores of predictors that learn nothing, computed from the dev labels: the floor every method must clear.

- `majority` (classification): always the dev set's most frequent class, the best constant predictor on dev;
- `constant_mean` (regression): always the dev mean; correlations of a constant are undefined and count as 0;
- `chance`: uniformly random labels (classification) or random scores (regression), averaged over seeded draws.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from suite.api import metrics

__all__ = ["baseline_scores", "constant_scores"]  # what the rest of the suite uses; other names are this module's own

CHANCE_DRAWS = 100


def _score(found: dict[str, float], keys: list[str]) -> dict[str, float]:
    found = {k: (0.0 if math.isnan(v) else v) for k, v in found.items()}
    return found | {"score": metrics.headline(found, keys)}


def _one_hot(pred: np.ndarray, num_labels: int) -> np.ndarray:
    out = np.zeros((len(pred), num_labels), dtype=np.float32)
    out[np.arange(len(pred)), pred] = 1.0
    return out


def constant_scores(names, labels_by_split: dict[str, np.ndarray], num_labels: int, regression: bool,
                    keys: list[str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for suffix, gold in labels_by_split.items():
        if regression:
            logits = np.full((len(gold), 1), float(np.mean(gold)), dtype=np.float32)
        else:
            majority = int(np.bincount(gold.astype(int), minlength=num_labels).argmax())
            logits = _one_hot(np.full(len(gold), majority), num_labels)
        found.update(metrics.compute(names, logits, gold, regression, suffix))
    return _score(found, keys)


def chance_scores(names, labels_by_split: dict[str, np.ndarray], num_labels: int, regression: bool,
                  keys: list[str], draws: int = CHANCE_DRAWS, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    runs: list[dict[str, float]] = []
    for _ in range(draws):
        found: dict[str, float] = {}
        for suffix, gold in labels_by_split.items():
            if regression:
                logits = rng.random((len(gold), 1)).astype(np.float32)
            else:
                logits = _one_hot(rng.integers(0, num_labels, len(gold)), num_labels)
            found.update(metrics.compute(names, logits, gold, regression, suffix))
        runs.append(found)
    mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    return _score(mean, keys)


def baseline_scores(spec, labels_by_split: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """{'majority' or 'constant_mean': metrics + score, 'chance': metrics + score} for one task's dev labels.

    `labels_by_split` maps eval-split suffixes ('' for a single dev set; 'm'/'mm' for MNLI) to gold labels.
    """
    labels = {k: np.asarray(v) for k, v in labels_by_split.items()}
    keys = spec.metric_keys()
    with warnings.catch_warnings():  # correlations of a constant predictor are undefined by design here
        warnings.simplefilter("ignore")
        constant = constant_scores(spec.metrics, labels, spec.num_labels, spec.is_regression, keys)
        chance = chance_scores(spec.metrics, labels, spec.num_labels, spec.is_regression, keys)
    return {("constant_mean" if spec.is_regression else "majority"): constant, "chance": chance}
