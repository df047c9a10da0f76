"""AttendOut's policy update: advantages from the rewards of several masks, and a REINFORCE step of G.

Rewards arrive as a (K, B) tensor: one reward per mask sample k and training sample i (with batch credit every
sample of a mask gets the mask's batch mean). The advantage of each (k, i) is its reward minus a baseline:

- "defender" (default, the paper's Attacker-vs-Defender comparison): the reward of the Defender's vanilla
  attention-dropout mask on the same sample, batch and hidden-dropout draws;
- "rloo": the mean reward of the other K - 1 masks on the same sample (leave-one-out, Kool et al. 2019), so masks are
  compared on identical data and identical dropout draws (needs K >= 2; the setting the published records ran);
- "ema": an exponential moving average of past batch rewards (the original single-sample REINFORCE baseline).

Advantages are divided by a running root-mean-square (an EMA, bias-corrected) and clipped; the REINFORCE loss
-(adv * log p(m)) is averaged over masks and samples, in per-pair units (divided by the valid pairs per sample) so
that the entropy bonus and the drop-rate penalty mean the same thing at every sequence length. With a placebo the
advantages are replaced by Gaussian noise of the same spread: the control that shows what G does without signal.

Nothing here reads a value back to the host: the running statistics, the floors and the placebo's noise stay on G's
device, and G's Adam is the fused one (the default one reads its step counts with `.item()`), so a training step on a
GPU never waits for it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from suite.api.attention import HyperParameterError, check_integer, check_probability

from .generator import MaskSample, policy_terms

BASELINES = ("rloo", "defender", "ema")


@dataclasses.dataclass(frozen=True)
class PolicyUpdate:
    """What one reward step hands G's update, as a hook on `AttendOut.reward_hooks` sees it (device tensors).

    rewards: (K, B), each of G's K masks on each training sample; defender: (B,), the Defender's on the same samples
    (None unless baseline="defender"); samples: per mask, one `MaskSample` per layer (its drops, valid pairs and G's
    logits, whose graph the update still needs)."""

    rewards: torch.Tensor
    defender: torch.Tensor | None
    samples: list[list[MaskSample]]


# called in order at every policy update, before credit and baseline; returns the update G gets (None: unchanged)
RewardHook = Callable[[PolicyUpdate], "PolicyUpdate | None"]


def check_config(c, credits: tuple[str, ...]) -> None:
    """An `AttendOutConfig`'s values: each in its range, each choice one of its names, rloo with K >= 2."""
    if c.p_max > 0 and not 0 < c.p_init < c.p_max:
        raise HyperParameterError(f"attendout.p_init={c.p_init} must lie in (0, p_max={c.p_max})")
    check_probability("attendout.rate_target", c.rate_target)
    for name in ("d_g", "mask_samples", "g_update_every", "g_accumulate"):
        check_integer(f"attendout.{name}", getattr(c, name), 1)
    for name, value, valid in (("baseline", c.baseline, BASELINES), ("credit", c.credit, credits)):
        if value not in valid:
            raise HyperParameterError(f"attendout.{name}={value!r}: choose one of {', '.join(valid)}")
    if c.baseline == "rloo" and c.mask_samples < 2:
        raise HyperParameterError("attendout.baseline='rloo' compares G's masks with each other: it needs "
                                  "mask_samples >= 2 (the records that ran it used 2)")
    if c.lookahead_lr is not None and not c.lookahead_lr > 0:
        raise HyperParameterError(f"attendout.lookahead_lr={c.lookahead_lr} must be > 0 (or None)")
    # the rates and coefficients: positive, non-negative, or a decay in [0, 1)
    for name in ("g_lr", "fd_decrease", "advantage_clip"):
        if not getattr(c, name) > 0:
            raise HyperParameterError(f"attendout.{name}={getattr(c, name)} must be > 0")
    if not 0 <= c.baseline_decay < 1:
        raise HyperParameterError(f"attendout.baseline_decay={c.baseline_decay} must lie in [0, 1)")
    for name in ("entropy_coef", "rate_penalty", "cost_every", "reward_scale_floor"):
        if getattr(c, name) < 0:
            raise HyperParameterError(f"attendout.{name}={getattr(c, name)} must be >= 0")


def leave_one_out(rewards: torch.Tensor) -> torch.Tensor:
    """(K, B) rewards -> advantages: each reward minus the mean of the other K - 1 rewards of its column."""
    k = rewards.shape[0]
    return (rewards - (rewards.sum(0, keepdim=True) - rewards) / (k - 1)) if k > 1 else torch.zeros_like(rewards)


class RunningMean:
    """Bias-corrected exponential moving average; values may be device tensors (nothing is read back)."""

    def __init__(self, decay: float):
        self.decay, self.value, self.count = decay, 0.0, 0

    def mean(self):
        return self.value / (1 - self.decay ** self.count) if self.count else None

    def update(self, x):
        self.value = self.decay * self.value + (1 - self.decay) * x
        self.count += 1
        return self.mean()


class Policy:
    """G's optimizer and the REINFORCE update; keeps the running baseline and advantage scale."""

    def __init__(self, generator: torch.nn.Module, cfg):
        self.generator, self.cfg = generator, cfg
        # fused: no host read of the step counts (the default implementation calls .item() on them every step)
        self.optimizer = torch.optim.Adam(generator.parameters(), lr=cfg.g_lr, fused=True)
        self.mean_square = RunningMean(cfg.baseline_decay)  # of the advantages: their running scale
        self.reward_mean = RunningMean(cfg.baseline_decay)  # of the batch rewards: the "ema" baseline
        self.pending = 0      # reward steps whose policy gradient is accumulated but not yet applied
        self.updates = 0      # Adam steps of G
        self._placebo_rng: torch.Generator | None = None
        if cfg.placebo:  # seeded once from the run's global generator, on G's device (the noise is drawn there)
            device = next(generator.parameters()).device
            self._placebo_rng = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, ())))

    def advantages(self, rewards: torch.Tensor, defender: torch.Tensor | None = None) -> torch.Tensor | None:
        """Normalised, clipped advantages (K, B); None when the baseline has nothing to compare yet."""
        r = rewards.detach().double()
        if self.cfg.baseline == "rloo":
            adv = leave_one_out(r)
        elif self.cfg.baseline == "defender":
            adv = r - defender.detach().double()[None]
        else:
            baseline = self.reward_mean.mean()
            self.reward_mean.update(r.mean())
            if baseline is None:  # the first reward only sets the baseline
                return None
            adv = r - baseline
        if self.cfg.placebo:  # same spread, no information
            noise = torch.randn(adv.shape, generator=self._placebo_rng, dtype=adv.dtype, device=adv.device)
            adv = noise * adv.std()
        # below ~1e-9 of the rewards themselves an advantage is rounding in r - baseline, not a signal
        floor = (1e-9 * r.abs().mean()).clamp_min(self.cfg.reward_scale_floor)
        scale = torch.maximum(self.mean_square.update((adv ** 2).mean()).sqrt(), floor)
        return (adv / scale).clamp(-self.cfg.advantage_clip, self.cfg.advantage_clip).float()

    def update(self, samples: list[list[MaskSample]], adv: torch.Tensor) -> torch.Tensor:
        """Accumulate the REINFORCE gradient of K mask samples; step G every `g_accumulate` calls. Returns the loss
        (a detached tensor: reading it would wait for the device)."""
        cfg = self.cfg
        logp, entropy, pi_sum, pairs = policy_terms(samples, cfg.p_max, cfg.entropy_coef > 0, cfg.rate_penalty > 0)
        pairs_per_sample = pairs.clamp_min(1) / logp.numel()
        objective = (adv.to(logp.device) * logp).mean()
        if entropy is not None:  # a zero coefficient would add exactly nothing: skipped
            objective = objective + cfg.entropy_coef * entropy.mean()
        loss = -objective / pairs_per_sample
        if cfg.rate_penalty > 0:
            loss = loss + cfg.rate_penalty * (pi_sum / pairs.clamp_min(1) - cfg.rate_target) ** 2
        (loss / cfg.g_accumulate).backward()
        self.pending += 1
        if self.pending >= cfg.g_accumulate:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.pending = 0
            self.updates += 1
        return loss.detach()
