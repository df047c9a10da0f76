"""Whether a cell beats the predictor that learns nothing (majority class / constant mean), over both noise sources.

The leaderboard's mark and the reference's note read this one test. Each run is paired with the constant predictor
on the dev examples it was scored on, and the evidence is the differences' (`suite.stats.evidence.compare_runs`):
the seeds' spread plus the dev examples resampled, the constant predictor re-scored on each resample too (its class
stays the dev set's majority; its share of the resample moves). One-sided, in the task's direction: a dev set of a
few hundred examples can leave a model a few points above the majority class without evidence that it beats it on
the task's examples. A run without a score (constant predictions: an undefined correlation) counts at the predictor's
score. Over seeds only (a one-sample t-test) on regression tasks (the constant mean's correlation is undefined on
every resample; other regression metrics are treated alike) and where the runs kept no readable predictions or were
scored on different examples; the text says which. A single run gives no test, only its sign.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from suite.report import significance as sig
from suite.report.baseline_scores import Baseline
from suite.report.formatting import SCALE
from suite.report.registry_info import higher_is_better, is_regression
from suite.stats.evidence import RunOutcome, compare_runs, loaded_predictions


@dataclasses.dataclass(frozen=True)
class VsConstant:
    margin: float      # mean points above the predictor (below it for lower-is-better tasks)
    runs: int          # runs counted, those without a score included
    p: float           # one-sided; nan for a single run
    better: bool       # p < alpha (a single run: its sign)
    seeds_only: bool   # the dev examples' noise is not in p (no predictions, or a regression task)


def majority_predictions(preds: dict) -> dict:
    """The majority-class predictor on the examples one run was scored on, per eval split, as a run's sidecar."""
    out = {}
    for suffix, arrays in preds.items():
        n_labels = arrays["logits"].shape[1]
        majority = int(np.bincount(arrays["label"].astype(int), minlength=n_labels).argmax())
        logits = np.eye(n_labels, dtype=np.float32)[np.full(len(arrays["label"]), majority)]
        out[suffix] = {"index": arrays["index"], "label": arrays["label"], "logits": logits}
    return out


def _loaded(path) -> dict | None:
    """A run's sidecar with the arrays this test reads; None for no path or an unreadable or incomplete file."""
    if not isinstance(path, str) or not path:
        return None
    preds = loaded_predictions(path)
    ok = preds and all({"index", "label", "logits"} <= set(arrays) and np.ndim(arrays["logits"]) == 2
                       for arrays in preds.values())
    return preds if ok else None


def vs_constant(task: str, runs: pd.DataFrame, base: Baseline, alpha: float) -> VsConstant | None:
    """`runs`: one cell's records (any status). None without a finished run or a baseline."""
    ok = runs[runs["status"] == "ok"]
    if not len(ok) or not base.available:
        return None
    higher = higher_is_better(task)
    scores = ok["score"].astype(float).to_numpy() * SCALE
    scores = np.where(np.isfinite(scores), scores, base.constant)
    margin = float(scores.mean() - base.constant) * (1 if higher else -1)
    if len(scores) == 1:
        return VsConstant(margin, 1, math.nan, margin > 0, True)
    paths = ok["predictions"] if "predictions" in ok else [None] * len(ok)
    preds = [None] * len(ok) if is_regression(task) else [_loaded(p) for p in paths]
    ev = None
    if any(p is not None for p in preds):
        model = {i: RunOutcome(float(s), p) for i, (s, p) in enumerate(zip(scores, preds))}   # paired by run
        constant = {i: RunOutcome(base.constant, majority_predictions(p) if p else None) for i, p in enumerate(preds)}
        ev = compare_runs(task, model, constant, higher_is_better=higher)
    if ev is None or not math.isfinite(ev.p):
        p = sig.beats_level_p(scores, base.constant, higher)
        return VsConstant(margin, len(scores), p, p < alpha, True)
    p = ev.p / 2 if (ev.diff > 0) == higher else 1 - ev.p / 2
    # no dev-example variance although runs kept predictions: the examples could not be resampled (e.g. runs scored
    # on different examples), unless the runs predicted the constant exactly (no difference on any example)
    seeds_only = ev.example_se == 0 and abs(ev.diff) > 0
    return VsConstant(margin, len(scores), float(p), bool(p < alpha), seeds_only)
