"""The positive control: a planted reward that G can learn, handed to G in place of the real one.

Per reward step the rewards (K masks x B samples) are replaced by

    planted = strength * sigma * z + sigma * noise,    z = standardised layer-`layer` drop share of each (mask, sample)

with sigma the standard deviation of that step's real rewards and noise standard Gaussian: a reward of the real
one's scale whose only information is "dropping more pairs of layer `layer` is better" (`strength` > 0) or worse
(< 0), at signal-to-noise `strength`. Everything downstream (leave-one-out baseline, normalisation, clipping, Adam)
is AttendOut's own. With strength 0 it is a placebo at the reward level: noise of the real reward's scale.
"""
from __future__ import annotations

import torch

from suite.methods.attendout.generator import MaskSample


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
    """Installs the planted reward on an AttendOut instance (wrapping its policy update); keeps what was handed
    to G and the real reward it replaced, for the analysis (`log`: per step, K x B tensors)."""

    def __init__(self, method, strength: float, layer: int = 0, seed: int = 0, keep_log: bool = False):
        if method.cfg.placebo:
            raise ValueError("the planted reward replaces the real one: run it with placebo=False")
        if method.cfg.baseline == "defender":  # the Defender's reward would stay real: not comparable
            raise ValueError("the planted reward needs baseline 'rloo' or 'ema', not 'defender'")
        self.method, self.strength, self.layer = method, float(strength), layer
        self.generator = torch.Generator().manual_seed(seed)
        self.keep_log, self.log = keep_log, []
        self._original = method._update_policy
        method._update_policy = self._update_policy

    def _update_policy(self, rewards: torch.Tensor, defender, samples) -> None:
        planted = planted_rewards(rewards, samples, self.strength, self.layer, self.generator)
        if self.keep_log:
            self.log.append({"real": rewards.detach().cpu(), "planted": planted.detach().cpu()})
        self._original(planted, None, samples)
