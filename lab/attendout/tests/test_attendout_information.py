"""The offline information measurement of AttendOut's reward (lab/attendout/information.py): the
correlation, slope and standard-error estimators recover a planted correlation, the horizon follows the planted
control's 1/c^2 scaling, masks drop only valid pairs at their rates, and the reward of a mask that drops nothing equals
the reward of the same mask replayed (one forward difference, common random numbers) on a tiny random model."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lab.attendout import information as info
from suite.methods.attendout import AttendOut
from suite.testing import padded_batch, tiny_model


def _planted(c: float, n: int, layers: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Advantages with correlation c with layer 0's share and none with the others."""
    shares = rng.uniform(0, 0.3, (n, layers))
    z = (shares[:, 0] - shares[:, 0].mean()) / shares[:, 0].std()
    adv = c * z + math.sqrt(1 - c * c) * rng.standard_normal(n)
    return adv, shares


def test_correlations_recover_a_planted_correlation_and_se_covers_it():
    rng = np.random.default_rng(0)
    per_batch = np.stack([info.correlations(*_planted(0.3, 256, 3, rng)) for _ in range(200)])
    summary = info.over_batches(per_batch)
    assert summary["n"] == 200
    assert abs(summary["mean"][0] - 0.3) < 3 * summary["se"][0]
    for layer in (1, 2):  # no planted signal: zero within a few standard errors
        assert abs(summary["mean"][layer]) < 3 * summary["se"][layer]
    # the standard error over batches is about the spread of a correlation on 256 units over sqrt(200)
    assert summary["se"][1] == pytest.approx(1 / math.sqrt(256) / math.sqrt(200), rel=0.25)


def test_slopes_and_constant_columns():
    rng = np.random.default_rng(1)
    shares = rng.uniform(0, 0.3, (500, 2))
    adv = 2.0 * shares[:, 0] - 1.0 * shares[:, 1] + 0.01 * rng.standard_normal(500)
    assert info.slopes(adv, shares) == pytest.approx([2.0, -1.0], abs=0.02)
    flat = np.column_stack([shares[:, 0], np.full(500, 0.1)])
    assert info.correlations(adv, flat)[1] == 0.0  # a constant share carries no correlation (and no NaN)


def test_bound_and_horizon_follow_the_planted_control():
    assert info.horizon(info.PLANTED_C) == pytest.approx(info.PLANTED_UPDATES)
    assert info.horizon(info.PLANTED_C / 3) == pytest.approx(9 * info.PLANTED_UPDATES)
    assert info.horizon(0.0) == math.inf
    assert info.bound(-0.002, 0.0016) == pytest.approx(0.0052)


def test_masks_drop_valid_pairs_at_their_rates():
    _, mask = padded_batch(4, 30, seed=0)
    valid = info.pair_validity(mask)
    assert not valid.diagonal(dim1=-2, dim2=-1).any()
    assert valid[1].sum() < valid[0].sum()  # padding excluded
    rates = torch.tensor([[0.0] * 4, [0.5] * 4, [1.0] * 4])
    masks = info.draw_masks(valid, rates, torch.Generator().manual_seed(0))
    assert not (masks & ~valid).any()
    shares = info.shares_of(masks, valid)
    assert torch.all(shares[0] == 0) and torch.all(shares[2] == 1)
    assert torch.all((shares[1] - 0.5).abs() < 0.2)


def test_batch_statistics_shapes_and_rloo_pairs():
    torch.manual_seed(0)
    layers, k, b = 2, 4, 5
    shares = torch.rand(layers, 2 * k, b).double()
    rewards = 3.0 * shares[0] + 0.0 * shares[1]  # the reward is layer 0's share exactly
    stats = info.batch_statistics(rewards, torch.zeros(b).double(), shares,
                                  {"random": list(range(k)), "g_init": list(range(k, 2 * k))})
    for design in ("random", "g_init"):
        assert stats[design]["defender"][0] == pytest.approx(1.0)
        assert stats[design]["rloo"][0] == pytest.approx(1.0)  # differences of pairs: still exact
        assert stats[design]["slope_rloo"] == pytest.approx([3.0, 0.0], abs=1e-9)


def test_reward_of_replayed_masks_matches_the_method_on_a_tiny_model():
    """Two copies of one mask in a batched replay get the same per-sample rewards (shared hidden draws), and a mask
    that drops nothing gets the reward of plain attention (the method's forward difference)."""
    model = tiny_model(seed=0)
    torch.manual_seed(0)
    method = AttendOut(AttendOut.Config())
    method.attach(model)
    model.train()
    ids, mask = padded_batch(4, 12, seed=1)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.arange(4) % 2}
    ids2, mask2 = padded_batch(4, 12, seed=2)
    nxt = {"input_ids": ids2, "attention_mask": mask2, "labels": torch.arange(4) % 2}
    valid = info.pair_validity(mask)
    one = info.draw_masks(valid, torch.full((1, 4), 0.3), torch.Generator().manual_seed(0))
    masks = torch.stack([torch.cat([one, one, torch.zeros_like(one)]) for _ in range(model.config.num_hidden_layers)])
    torch.manual_seed(5)
    rewards, defender = info.reward_batch(method, model, batch, nxt, masks, eta=1e-3, fd_decrease=1e-2)
    assert rewards.shape == (3, 4) and defender.shape == (4,)
    assert torch.allclose(rewards[0], rewards[1], rtol=1e-4, atol=1e-9)
    assert torch.isfinite(rewards).all() and torch.isfinite(defender).all()
    assert not torch.allclose(rewards[0], rewards[2])  # the drops change the reward
