"""Expected validation performance (suite.stats.evp): the closed form against every draw enumerated and against a
Monte-Carlo draw."""
import itertools
import math

import numpy as np
import pytest

from suite.stats.evp import expected_best, max_weights


def _enumerated(values, k, best=max):
    """The mean and std of the best of k draws with replacement, over all N^k equally likely draws."""
    bests = [best(draw) for draw in itertools.product(values, repeat=k)]
    return float(np.mean(bests)), float(np.std(bests))


@pytest.mark.parametrize("values", [[0.7, 0.85, 0.8], [0.5, 0.5, 0.9, 0.1], [0.62], [0.3, 0.3, 0.3, 0.8, 0.2]])
def test_the_closed_form_is_the_mean_over_every_draw(values):
    means, stds = expected_best(values)
    assert len(means) == len(values)
    for k in range(1, len(values) + 1):
        mean, std = _enumerated(values, k)
        assert means[k - 1] == pytest.approx(mean, abs=1e-12) and stds[k - 1] == pytest.approx(std, abs=1e-12)
    assert means[0] == pytest.approx(np.mean(values))  # one configuration: its expected score is the mean
    assert np.all(np.diff(means) >= -1e-12) and means[-1] <= max(values)


def test_lower_is_better_takes_the_minimum():
    values = [0.4, 0.1, 0.3]
    means, stds = expected_best(values, higher_is_better=False)
    for k in (1, 2, 3):
        mean, std = _enumerated(values, k, best=min)
        assert means[k - 1] == pytest.approx(mean) and stds[k - 1] == pytest.approx(std)
    assert np.all(np.diff(means) <= 1e-12)


def test_a_monte_carlo_draw_agrees():
    rng = np.random.default_rng(0)
    values = rng.normal(0.8, 0.05, size=12)
    means, stds = expected_best(values, ks=[1, 3, 12, 30])
    draws = rng.choice(values, size=(200_000, 30))
    for i, k in enumerate([1, 3, 12, 30]):
        best = draws[:, :k].max(axis=1)
        assert means[i] == pytest.approx(best.mean(), abs=4 * best.std() / math.sqrt(len(best)))
        assert stds[i] == pytest.approx(best.std(), rel=0.02)


def test_failed_configurations_are_left_out_and_nothing_gives_nan():
    means, _ = expected_best([0.6, float("nan"), 0.8, None])
    assert len(means) == 2 and means[0] == pytest.approx(0.7) and means[1] == pytest.approx(0.75)
    means, stds = expected_best([float("nan")], ks=[1, 2])
    assert np.isnan(means).all() and np.isnan(stds).all()
    assert max_weights(4, 3).sum() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        expected_best([0.5], ks=[0])
