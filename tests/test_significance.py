"""The report's statistics against independent references: scipy's own tests, hand-computed values, exact
enumeration and Monte Carlo simulation; and a calibration of the corrected procedure on synthetic tables."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from suite.report import significance as sig


def holm_rows(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of each row, without a Python loop: an independent check of `sig.holm`
    (statsmodels), and fast enough to calibrate over hundreds of simulated tables."""
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="mergesort")
    ranked = np.take_along_axis(p, order, axis=-1)
    steps = np.minimum(np.maximum.accumulate((m - np.arange(m)) * ranked, axis=-1), 1.0)
    out = np.empty_like(steps)
    np.put_along_axis(out, order, steps, axis=-1)
    return out


def test_paired_t_matches_scipy_ttest_rel_and_handles_degenerate_differences():
    a, b = np.array([70.0, 71.0, 73.0, 69.0]), np.array([62.0, 66.0, 64.0, 65.0])
    assert sig.paired_t_p(a - b) == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-12)
    # by hand: d = 8, 5, 9, 4; mean 6.5, sd 2.380; t = 6.5 / (2.380 / 2) = 5.462 with 3 df
    assert stats.t.sf(5.462, 3) * 2 == pytest.approx(float(sig.paired_t_p(a - b)), rel=1e-3)
    assert sig.paired_t_p(np.zeros(3)) == 1.0 and math.isnan(sig.paired_t_p(np.full(3, 2.0)))
    assert math.isnan(sig.paired_t_p(np.array([1.0])))
    batch = np.stack([a - b, b - a, np.array([1.0, -1.0, 2.0, -2.0])])
    assert np.allclose(sig.paired_t_p(batch), [stats.ttest_rel(a, b).pvalue, stats.ttest_rel(b, a).pvalue,
                                                stats.ttest_1samp([1, -1, 2, -2], 0).pvalue])


def test_holm_matches_hand_computed_values_and_skips_untested_cells():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan])
    # sorted 0.005, 0.01, 0.03, 0.04 with m = 4: 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert np.allclose(sig.holm(p)[:4], [0.03, 0.06, 0.06, 0.02]) and math.isnan(sig.holm(p)[4])
    assert np.allclose(sig.holm(np.array([0.5, 0.9])), [1.0, 1.0])
    rng = np.random.default_rng(0)
    many = rng.random((5, 7))  # row by row: each row its own family, as Holm's step-down computes it
    assert np.allclose(sig.holm(many), holm_rows(many))


def test_benjamini_hochberg_matches_hand_computed_values():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan])
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): p * m / rank = 0.02, 0.02, 0.04, 0.04; min from the top: the same
    assert np.allclose(sig.benjamini_hochberg(p)[:4], [0.02, 0.04, 0.04, 0.02])


def test_bootstrap_interval_matches_exact_enumeration_over_seeds():
    d = np.array([1.0, 4.0, 10.0])
    # all 27 equally likely resamples of three seeds: their means' 2.5 and 97.5 percentiles
    means = np.sort([np.mean(r) for r in itertools.product(d, repeat=3)])
    lo, hi = sig.bootstrap_ci(d, resamples=20_000)
    assert lo == pytest.approx(np.percentile(means, 2.5, method="inverted_cdf"), abs=0.35)
    assert hi == pytest.approx(np.percentile(means, 97.5, method="inverted_cdf"), abs=0.35)
    assert sig.bootstrap_ci(np.full(3, 2.0)) == (2.0, 2.0)
    assert all(math.isnan(x) for x in sig.bootstrap_ci(np.array([1.0])))
    assert sig.bootstrap_ci(d, seed=3) == sig.bootstrap_ci(d, seed=3)   # seeded: reports are reproducible


def test_power_of_the_paired_t_test_matches_simulation():
    rng = np.random.default_rng(1)
    n, delta, sd, alpha = 6, 1.5, 1.2, 0.01
    d = rng.normal(delta, sd, size=(20_000, n))
    simulated = float(np.mean(sig.paired_t_p(d) < alpha))
    assert sig.power_paired(delta, sd, n, alpha) == pytest.approx(simulated, abs=0.015)
    mdd = sig.min_detectable(sd, n, alpha)
    assert sig.power_paired(mdd, sd, n, alpha) == pytest.approx(0.8, abs=1e-6)
    needed = sig.seeds_needed(1.0, sd, alpha)
    assert sig.power_paired(1.0, sd, needed, alpha) >= 0.8 > sig.power_paired(1.0, sd, needed - 1, alpha)
    assert math.isnan(sig.min_detectable(0.0, 3, alpha)) and sig.seeds_needed(1.0, 0.0, alpha) is None


def test_pooled_sd_by_hand():
    # deviations from each set's mean: (-1, 1) and (-2, 0, 2): squares 2 + 8 over 1 + 2 degrees of freedom
    assert sig.pooled_sd([np.array([1.0, 3.0]), np.array([0.0, 2.0, 4.0]), np.array([5.0])]) == \
        pytest.approx(math.sqrt(10 / 3))


def test_aso_orders_clearly_separated_samples_and_not_identical_ones():
    better, worse = np.array([71.0, 72.0, 73.0, 74.0, 75.0]), np.array([60.0, 61.0, 62.0, 63.0, 64.0])
    assert sig.aso_epsilon(better, worse, 1) < 0.05
    assert sig.aso_epsilon(worse, better, 1) > 0.95
    assert math.isnan(sig.aso_epsilon(better[:1], worse, 1))


def test_calibration_of_the_corrected_procedure_on_synthetic_tables():
    """14 null methods and one with a planted +2-point effect, paired by seed; the corrected procedure flags the
    planted method at about the rate the power calculation predicts, and any null method at most at the nominal
    family-wise rate."""
    rng = np.random.default_rng(12)
    tables, methods, seeds, alpha, sd = 600, 15, 8, 0.05, 1.5
    effect = np.zeros(methods)
    effect[0] = 2.0
    seed_effect = rng.normal(0, 3.0, size=(tables, 1, seeds))          # shared by all methods of a seed
    reference = 70 + seed_effect + rng.normal(0, sd / math.sqrt(2), size=(tables, 1, seeds))
    scores = 70 + effect[None, :, None] + seed_effect + rng.normal(0, sd / math.sqrt(2), (tables, methods, seeds))
    flagged = holm_rows(sig.paired_t_p(scores - reference)) < alpha  # Holm, as sig.holm
    fwer = float(np.mean(flagged[:, 1:].any(axis=1)))
    planted = float(np.mean(flagged[:, 0]))
    predicted = sig.power_paired(2.0, sd, seeds, alpha / methods)   # Holm's first step, as the report states it
    assert fwer <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / tables)
    assert 0.3 < predicted < 0.9                                      # a test that can fail both ways
    assert planted == pytest.approx(predicted, abs=3 * math.sqrt(predicted * (1 - predicted) / tables) + 0.02)


def test_one_sided_test_against_a_baseline_level_matches_scipy():
    v = np.array([76.0, 75.5, 77.0])
    assert sig.beats_level_p(v, 75.33) == pytest.approx(stats.ttest_1samp(v, 75.33, alternative="greater").pvalue)
    assert sig.beats_level_p(v, 78.0, higher=False) == pytest.approx(
        stats.ttest_1samp(v, 78.0, alternative="less").pvalue)
    assert sig.beats_level_p(np.full(3, 75.33), 75.33) == 1.0 and sig.beats_level_p(np.full(3, 80.0), 75.33) == 0.0
    assert math.isnan(sig.beats_level_p(np.array([80.0]), 75.33))
