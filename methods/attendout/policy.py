"""AttendOut's policy update: advantages from the rewards of several masks, and a REINFORCE step of G.

Rewards arrive as a (K, B) tensor: one reward per mask sample k and training sample i (with batch credit every
sample of a mask gets the mask's batch mean). The advantage of each (k, i) is its reward minus a baseline:

- "rloo": the mean reward of the other K - 1 masks on the same sample (leave-one-out, Kool et al. 2019), so masks are
  compared on identical data and identical dropout draws;
- "defender": the reward of the Defender's vanilla attention-dropout mask on the same sample;
- "ema": an exponential moving average of past batch rewards (the original single-sample REINFORCE baseline).

Advantages are divided by a running root-mean-square (an EMA, bias-corrected) and clipped; the REINFORCE loss
-(adv * log p(m)) is averaged over masks and samples, in per-pair units (divided by the valid pairs per sample) so
that the entropy bonus and the drop-rate penalty mean the same thing at every sequence length. With a placebo the
advantages are replaced by Gaussian noise of the same spread: the control that shows what G does without signal.
"""
from __future__ import annotations

import math

import torch

from .generator import MaskSample, mask_entropy, mask_log_prob

BASELINES = ("rloo", "defender", "ema")


def leave_one_out(rewards: torch.Tensor) -> torch.Tensor:
    """(K, B) rewards -> advantages: each reward minus the mean of the other K - 1 rewards of its column."""
    k = rewards.shape[0]
    return (rewards - (rewards.sum(0, keepdim=True) - rewards) / (k - 1)) if k > 1 else torch.zeros_like(rewards)


class RunningMean:
    """Bias-corrected exponential moving average."""

    def __init__(self, decay: float):
        self.decay, self.value, self.count = decay, 0.0, 0

    def mean(self) -> float | None:
        return self.value / (1 - self.decay ** self.count) if self.count else None

    def update(self, x: float) -> float:
        self.value = self.decay * self.value + (1 - self.decay) * x
        self.count += 1
        return self.mean()


class Policy:
    """G's optimizer and the REINFORCE update; keeps the running baseline and advantage scale."""

    def __init__(self, generator: torch.nn.Module, cfg):
        self.generator, self.cfg = generator, cfg
        self.optimizer = torch.optim.Adam(generator.parameters(), lr=cfg.g_lr)
        self.mean_square = RunningMean(cfg.baseline_decay)  # of the advantages: their running scale
        self.reward_mean = RunningMean(cfg.baseline_decay)  # of the batch rewards: the "ema" baseline
        self.pending = 0      # reward steps whose policy gradient is accumulated but not yet applied
        self.updates = 0      # Adam steps of G
        self._placebo_rng: torch.Generator | None = None

    def advantages(self, rewards: torch.Tensor, defender: torch.Tensor | None = None) -> torch.Tensor | None:
        """Normalised, clipped advantages (K, B); None when the baseline has nothing to compare yet."""
        r = rewards.detach().double()
        if self.cfg.baseline == "rloo":
            adv = leave_one_out(r)
        elif self.cfg.baseline == "defender":
            adv = r - defender.detach().double()[None]
        else:
            baseline = self.reward_mean.mean()
            self.reward_mean.update(r.mean().item())
            if baseline is None:  # the first reward only sets the baseline
                return None
            adv = r - baseline
        if self.cfg.placebo:  # same spread, no information
            noise = torch.randn(adv.shape, generator=self._placebo_generator(), dtype=adv.dtype)
            adv = noise.to(adv.device) * adv.std()
        # below ~1e-9 of the rewards themselves an advantage is rounding in r - baseline, not a signal
        floor = max(self.cfg.reward_scale_floor, 1e-9 * float(r.abs().mean()))
        scale = max(math.sqrt(self.mean_square.update(float((adv ** 2).mean()))), floor)
        return (adv / scale).clamp(-self.cfg.advantage_clip, self.cfg.advantage_clip).float()

    def _placebo_generator(self) -> torch.Generator:
        if self._placebo_rng is None:  # seeded from the run's global generator, once
            self._placebo_rng = torch.Generator().manual_seed(int(torch.randint(2**62, ()).item()))
        return self._placebo_rng

    def update(self, samples: list[list[MaskSample]], adv: torch.Tensor) -> float:
        """Accumulate the REINFORCE gradient of K mask samples; step G every `g_accumulate` calls. Returns the loss."""
        cfg = self.cfg
        logp = torch.stack([mask_log_prob(s, cfg.p_max) for s in samples])          # (K, B)
        parts = [mask_entropy(s, cfg.p_max) for s in samples]
        entropy = torch.stack([p[0] for p in parts])                                # (K, B)
        pi_sum, pairs = sum(p[1] for p in parts), sum(p[2] for p in parts)
        pairs_per_sample = pairs.clamp_min(1) / logp.numel()
        loss = -((adv.to(logp.device) * logp).mean() + cfg.entropy_coef * entropy.mean()) / pairs_per_sample
        if cfg.rate_penalty > 0:
            loss = loss + cfg.rate_penalty * (pi_sum / pairs.clamp_min(1) - cfg.rate_target) ** 2
        (loss / cfg.g_accumulate).backward()
        self.pending += 1
        if self.pending >= cfg.g_accumulate:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.pending = 0
            self.updates += 1
        return loss.item()
