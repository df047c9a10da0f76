"""The data-efficiency table's tests: each method against the reference at each training-set size of a curve.

Each cell is the leaderboard's test over seeds and dev examples (`suite.stats.evidence.compare_runs`), its runs
paired by seed, or by (draw, seed) where a curve fixes its data draws. All the cells a report tests form one family,
adjusted together under the report's correction and apart from the leaderboard's families: a curve asks its own
question. A cell with fewer than 2 paired runs, or no test, is left out of the family.
"""
from __future__ import annotations

import math
from typing import Hashable, Mapping

import numpy as np

from suite.stats.evidence import RunOutcome, bootstrap_seed, compare_runs
from suite.stats.families import adjust

__all__ = ["size_tests"]  # what the rest of the suite uses; other names are this module's own

Outcomes = Mapping[Hashable, RunOutcome]


def size_tests(cells: Mapping[Hashable, tuple[str, Outcomes, Outcomes]], correction: str
               ) -> dict[Hashable, tuple[float, float]]:
    """{key: (mean paired difference to the reference x100, adjusted p)} of `cells` {key: (task, method's runs,
    reference's runs)}, in the order given, for the cells with a test."""
    keys, diffs, ps = [], [], []
    for key, (task, method, reference) in cells.items():
        ev = compare_runs(task, method, reference, seed=bootstrap_seed(task, key))
        if ev.n_seeds >= 2 and math.isfinite(ev.p):
            keys.append(key)
            diffs.append(ev.diff)
            ps.append(ev.p)
    adjusted = adjust(np.asarray(ps), correction) if ps else []
    return {k: (d, float(p)) for k, d, p in zip(keys, diffs, adjusted)}
