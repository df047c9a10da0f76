"""The report's statistics and the corrections and power of suite.stats against independent references: scipy's own
tests, hand-computed values and Monte Carlo simulation; and a calibration of the corrected procedure on synthetic
tables."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from suite.stats import families, power
from suite.stats.aso import aso_epsilon
from suite.stats.constant import beats_level_p
from suite.stats.evidence import Evidence, evidence_arrays, paired_t_p


def holm_rows(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of each row, without a Python loop: an independent check of `families.holm`
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
    assert paired_t_p(a - b) == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-12)
    # by hand: d = 8, 5, 9, 4; mean 6.5, sd 2.380; t = 6.5 / (2.380 / 2) = 5.462 with 3 df
    assert stats.t.sf(5.462, 3) * 2 == pytest.approx(float(paired_t_p(a - b)), rel=1e-3)
    assert paired_t_p(np.zeros(3)) == 1.0 and math.isnan(paired_t_p(np.full(3, 2.0)))
    assert math.isnan(paired_t_p(np.array([1.0])))
    batch = np.stack([a - b, b - a, np.array([1.0, -1.0, 2.0, -2.0])])
    assert np.allclose(paired_t_p(batch), [stats.ttest_rel(a, b).pvalue, stats.ttest_rel(b, a).pvalue,
                                                stats.ttest_1samp([1, -1, 2, -2], 0).pvalue])


def test_holm_matches_hand_computed_values_and_skips_untested_cells():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan])
    # sorted 0.005, 0.01, 0.03, 0.04 with m = 4: 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert np.allclose(families.holm(p)[:4], [0.03, 0.06, 0.06, 0.02]) and math.isnan(families.holm(p)[4])
    assert np.allclose(families.holm(np.array([0.5, 0.9])), [1.0, 1.0])
    rng = np.random.default_rng(0)
    many = rng.random(7)
    assert np.allclose(families.holm(many), holm_rows(many))


def test_benjamini_hochberg_matches_hand_computed_values():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan])
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): p * m / rank = 0.02, 0.02, 0.04, 0.04; min from the top: the same
    assert np.allclose(families.benjamini_hochberg(p)[:4], [0.02, 0.04, 0.04, 0.02])


def test_families_primary_entries_name_methods_tasks_or_one_comparison():
    primary = ["topk", "sst2", "drophead:cola"]
    assert families.family_of("topk", "rte", primary) == families.PRIMARY
    assert families.family_of("vanilla2", "sst2", primary) == families.PRIMARY
    assert families.family_of("drophead", "cola", primary) == families.PRIMARY
    assert families.family_of("drophead", "rte", primary) == families.EXPLORATORY
    assert families.family_of("drophead", "rte", []) == families.ALL


def evidence(sd: float, n: int, example_se: float = 0.0) -> Evidence:
    return Evidence(n, 0.0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 1.0, seed_sd=sd,
                    example_se=example_se)


@pytest.mark.parametrize("example_se", [0.0, 0.5])
def test_power_of_the_test_matches_simulation(example_se):
    """statsmodels' power with the Cochran-Cox df against the rejection rate of suite.stats.evidence's own test."""
    rng = np.random.default_rng(1)
    n, delta, sd, alpha = 6, 1.5, 1.2, 0.01
    d = rng.normal(delta, sd, size=(20_000, n)) + rng.normal(0, example_se, size=(20_000, 1))
    simulated = float(np.mean(evidence_arrays(d, example_se ** 2)["p"] < alpha))
    ev = evidence(sd, n, example_se)
    assert power.decision_power(ev, n, alpha, delta) == pytest.approx(simulated, abs=0.02)
    mdd = power.min_detectable(ev, alpha)
    assert power.decision_power(ev, n, alpha, mdd) == pytest.approx(0.8, abs=1e-6)


def test_seeds_needed_is_the_fewest_with_enough_power_and_the_dev_set_can_be_the_limit():
    alpha = 0.05
    ev = Evidence(3, 1.0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0.5, seed_sd=1.2)
    needed = int(power.seeds_needed(ev, alpha))
    assert power.decision_power(ev, needed, alpha) >= 0.8 > power.decision_power(ev, needed - 1, alpha)
    # the shared dev-example part does not shrink with seeds: a 1-point difference with a shared se of 0.6 is
    # never detected with 80% power (it would need se below about 1 / 2.8)
    stuck = Evidence(3, 1.0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0.5, seed_sd=1.2,
                     example_se=0.6)
    assert math.isinf(power.seeds_needed(stuck, alpha))
    assert math.isnan(power.seeds_needed(evidence(0.0, 3), alpha))


def test_effect_size_is_the_difference_over_one_seeds_total_sd():
    # 4 seeds, seed sd 2, dev-example se 0.5 of the mean: one seed's total variance 4 + 4 * 0.25 = 5
    ev = Evidence(4, 1.5, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 1.0, seed_sd=2.0,
                  example_se=0.5)
    assert power.effect_size(ev) == pytest.approx(1.5 / math.sqrt(5))


def test_aso_orders_clearly_separated_samples_and_not_identical_ones():
    better, worse = np.array([71.0, 72.0, 73.0, 74.0, 75.0]), np.array([60.0, 61.0, 62.0, 63.0, 64.0])
    assert aso_epsilon(better, worse, 1) < 0.05
    assert aso_epsilon(worse, better, 1) > 0.95
    assert math.isnan(aso_epsilon(better[:1], worse, 1))


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
    flagged = holm_rows(paired_t_p(scores - reference)) < alpha  # Holm, as families.holm
    fwer = float(np.mean(flagged[:, 1:].any(axis=1)))
    planted = float(np.mean(flagged[:, 0]))
    predicted = power.decision_power(evidence(sd, seeds), seeds, alpha / methods, 2.0)  # Holm's first step
    assert fwer <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / tables)
    assert 0.3 < predicted < 0.9                                      # a test that can fail both ways
    assert planted == pytest.approx(predicted, abs=3 * math.sqrt(predicted * (1 - predicted) / tables) + 0.02)


def test_one_sided_test_against_a_baseline_level_matches_scipy():
    v = np.array([76.0, 75.5, 77.0])
    assert beats_level_p(v, 75.33) == pytest.approx(stats.ttest_1samp(v, 75.33, alternative="greater").pvalue)
    assert beats_level_p(v, 78.0, higher=False) == pytest.approx(
        stats.ttest_1samp(v, 78.0, alternative="less").pvalue)
    assert beats_level_p(np.full(3, 75.33), 75.33) == 1.0 and beats_level_p(np.full(3, 80.0), 75.33) == 0.0
    assert math.isnan(beats_level_p(np.array([80.0]), 75.33))
