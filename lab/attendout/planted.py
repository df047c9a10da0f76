"""The positive control: a planted reward that G can learn, in place of the real one or on top of it.

Per reward step the rewards (K masks x B samples) are replaced by

    planted = strength * sigma * z + sigma * noise,    z = standardised layer-`layer` drop share of each (mask, sample)

with sigma the standard deviation of that step's real rewards and noise standard Gaussian: a reward of the real
one's scale whose only information is "dropping more pairs of layer `layer` is better" (`strength` > 0) or worse
(< 0), at signal-to-noise `strength`. Everything downstream (leave-one-out baseline, normalisation, clipping, Adam)
is AttendOut's own. With strength 0 it is a placebo at the reward level: noise of the real reward's scale.

`AddedReward` keeps the real reward and adds a term to it (any baseline, the Defender's included): the advantage G
forms becomes adv + beta * z, with z the standardised (baseline-centred) layer-`layer` drop share of each of the K x B
units and beta = c / sqrt(1 - c^2) * sd(adv), so that the advantage's correlation with the share is `c` on top of
whatever the real reward carries (exactly c when the real reward carries none). `c` is then the same quantity as the
offline measurement's bound (lab/attendout/results/decisive: the per-batch correlation of the advantage with a layer's
drop share over the batch's units).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from suite.methods.attendout import MaskSample, PolicyUpdate
from suite.methods.attendout.policy import leave_one_out


def layer_drop_share(samples: list[MaskSample], layer: int) -> torch.Tensor:
    """(B,): the share of each sample's valid pairs in `layer` that the mask drops."""
    s = next(s for s in samples if s.layer == layer)
    valid = s.valid.expand_as(s.drop)
    return s.drop.sum((-1, -2)).float() / valid.sum((-1, -2)).float().clamp_min(1)


def standardised(x: torch.Tensor) -> torch.Tensor:
    std = x.std()
    return (x - x.mean()) / std if std > 0 else torch.zeros_like(x)


def planted_rewards(real: torch.Tensor, samples: list[list[MaskSample]], strength: float, layer: int,
                    generator: torch.Generator) -> torch.Tensor:
    """(K, B) planted rewards for the K masks' samples, at the scale of the real (K, B) rewards."""
    share = torch.stack([layer_drop_share(s, layer) for s in samples]).to(real.device, torch.float64)
    sigma = float(real.double().std()) if real.numel() > 1 else 1.0
    sigma = sigma if sigma > 0 else 1.0
    noise = torch.randn(real.shape, generator=generator, dtype=torch.float64).to(real.device)
    return (sigma * (strength * standardised(share) + noise)).to(real.dtype)


class PlantedReward:
    """The planted reward as a reward hook of an AttendOut instance (added to its `reward_hooks`): G gets the planted
    rewards and no Defender's; keeps what was handed to G and the real reward it replaced, for the analysis (`log`:
    per step, K x B tensors)."""

    def __init__(self, method, strength: float, layer: int = 0, seed: int = 0, keep_log: bool = False):
        if method.cfg.placebo:
            raise ValueError("the planted reward replaces the real one: run it with placebo=False")
        if method.cfg.baseline == "defender":  # the Defender's reward would stay real: not comparable
            raise ValueError("the planted reward needs baseline 'rloo' or 'ema', not 'defender'")
        self.method, self.strength, self.layer = method, float(strength), layer
        self.generator = torch.Generator().manual_seed(seed)
        self.keep_log, self.log = keep_log, []
        method.reward_hooks.append(self)

    def __call__(self, update: PolicyUpdate) -> PolicyUpdate:
        """The method's update with its rewards replaced by planted ones."""
        planted = planted_rewards(update.rewards, update.samples, self.strength, self.layer, self.generator)
        if self.keep_log:
            self.log.append({"real": update.rewards.detach().cpu(), "planted": planted.detach().cpu()})
        return dataclasses.replace(update, rewards=planted, defender=None)


def baseline_advantage(rewards: torch.Tensor, defender: torch.Tensor | None, baseline: str) -> torch.Tensor:
    """(K, B) advantages before normalisation, as `Policy.advantages` forms them (for "ema": the rewards centred on
    their own mean, the moving baseline's stand-in within one step)."""
    r = rewards.detach().double()
    if baseline == "defender":
        return r - defender.detach().double()[None]
    if baseline == "rloo":
        return leave_one_out(r)
    return r - r.mean()


def centred_shares(samples: list[list[MaskSample]], layer: int, baseline: str) -> torch.Tensor:
    """(K, B) each unit's layer drop share, centred as the baseline centres the rewards (the Defender's and the
    moving average's shares are not G's: raw shares; leave-one-out: minus the other masks' mean)."""
    share = torch.stack([layer_drop_share(s, layer) for s in samples]).double()
    return leave_one_out(share) if baseline == "rloo" else share


class AddedReward:
    """Adds a planted term to the real reward of an AttendOut instance (a reward hook), so that the
    advantage's correlation with layer `layer`'s drop share rises by `c` (module docstring). The term is added to
    the rewards of G's masks, never to the Defender's, so the method's own baseline, normalisation and Adam act on
    it unchanged."""

    def __init__(self, method, c: float, layer: int = 0):
        if method.cfg.placebo:
            raise ValueError("the added reward needs the real advantages: run it with placebo=False")
        if not -1 < c < 1:
            raise ValueError(f"c={c} is a correlation: it must lie in (-1, 1)")
        self.method, self.c, self.layer = method, float(c), layer
        method.reward_hooks.append(self)

    def term(self, rewards: torch.Tensor, defender: torch.Tensor | None, samples) -> torch.Tensor:
        """(K, B) the term added to the rewards: after the baseline it is beta * z."""
        baseline = self.method.cfg.baseline
        adv = baseline_advantage(rewards, defender, baseline)
        z = standardised(centred_shares(samples, self.layer, baseline).to(adv.device))
        beta = self.c / math.sqrt(1 - self.c ** 2) * adv.std()
        k = rewards.shape[0]
        # leave-one-out maps a term with zero column sums to k / (k - 1) times itself: pre-scaled so it gives beta z
        return beta * z * ((k - 1) / k if baseline == "rloo" else 1.0)

    def __call__(self, update: PolicyUpdate) -> PolicyUpdate:
        """The method's update with the term added to the rewards of G's masks."""
        rewards = update.rewards
        added = rewards + self.term(rewards, update.defender, update.samples).to(rewards.dtype)
        return dataclasses.replace(update, rewards=added)
