"""The score endpoint's long simulation (lab/stats/score_endpoint.py): its median nulls and the exact sign test's
boundaries it checks, each against a brute-force count."""
from __future__ import annotations

import numpy as np


def test_the_simulations_median_null_is_the_jittered_distributions_not_the_points():
    """lab/stats/score_endpoint.py builds its median nulls from 20 published pairs, each resampled seed jittered:
    the shift must make a jittered seed as likely won as lost. The plain median of the points is not that when the
    points near it sit unevenly (here three just below it, one far above), which inflated the sign test's rate."""
    from lab.stats.score_endpoint import shift_to_null

    d = np.array([-9.0, -7.0, -5.0, -4.0, -3.0, -2.0, -1.6, -1.4, -1.2, -1.0,
                  3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0])
    gone_m = np.zeros(20, bool)
    gone_m[0] = True                       # a degenerate method run always loses its seed
    gone_r = np.zeros(20, bool)
    jitter = 1.5
    rng = np.random.default_rng(0)
    pick = rng.integers(0, 20, 400_000)
    noise = rng.normal(0.0, jitter, pick.size)

    def won(shifted):
        sign = np.where(gone_m[pick], -1.0, np.sign(shifted[pick] + noise))
        return (sign > 0).mean()

    healthy = ~gone_m
    plain = d - np.median(np.where(healthy, d, -np.inf))
    assert abs(won(shift_to_null(d, gone_m, gone_r, "median", jitter)) - 0.5) < 0.003   # 4 se of 400,000 draws
    assert abs(won(plain) - 0.5) > 0.006   # 0.008 off: 10 se


def test_the_checked_exact_sign_boundaries_spend_no_more_than_the_level():
    """The `t + exact sign` alternative's boundaries, recomputed by brute force over all 2^20 sign sequences: the
    chance of any crossing under the null is within alpha, and lowering the last boundary by one step exceeds it."""
    from lab.stats.score_endpoint import ALPHA, LOOKS, exact_sign_bounds

    bounds = exact_sign_bounds(LOOKS, ALPHA, LOOKS[-1])
    sequences = np.arange(2 ** 20, dtype=np.uint32)   # bit i: seed i won
    walk = np.stack([2 * np.bitwise_count(sequences & np.uint32(2 ** n - 1)).astype(int) - n for n in LOOKS], axis=1)

    def crossing(bounds):
        return (np.abs(walk) >= np.array(bounds)).any(axis=1).mean()

    assert crossing(bounds) <= ALPHA
    assert crossing(bounds[:-1] + (bounds[-1] - 2,)) > ALPHA
    assert crossing(bounds) > 0.8 * ALPHA   # the lattice's sizes are used: 0.85 of the level
