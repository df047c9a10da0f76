"""Structured attention dropout: whole heads (DropHead) or whole key columns (DropAttention(c)).

drophead (Zhou et al. 2020, "Scheduled DropHead"): in training, each head of each layer is dropped for a sample with
probability p; the kept heads are rescaled by H / (number kept) so every sample's sum over heads keeps its scale
exactly (at least one head is always kept: a sample that would lose all of them keeps all of them). The rate follows
a schedule over training: `scheduled` (the default, the paper's V: from p down to 0 over the learning rate's warm-up
steps, then linearly back up to p at the end of training; the paper's p_start and p_end are one `p` here),
`constant`, `linear` (p -> 0) or `v` (p -> 0 at mid-training -> p, an earlier reading of the paper). Applied in
place of attention-probability dropout: BERT's own dropout on the attention probabilities is not applied (the
hidden dropout is).

dropattention_col (Lin et al. 2019, DropAttention(c); docs/methods.md#dropattention_col): in training, each key column
of each sample
and head is dropped with probability p after the softmax and every row is renormalised over its kept columns.
Renormalising softmax weights over a subset equals the softmax over that subset, so the drop is applied as a mask
before the softmax (no 0/0 when kept weights underflow). A row whose valid keys were all dropped keeps all of them.

Both are the identity in eval mode and at p = 0; without a statistics probe they run through the fused SDPA kernel.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from suite.api.attention import (
    AttentionMethod,
    HyperParameterError,
    attend,
    has_probe,
    in_graph,
    mask_fill_value,
    register_method,
    scores,
    softmax,
    valid_keys,
)
from suite.api.stochastic import Stochastic

SCHEDULES = ("scheduled", "constant", "linear", "v")


@dataclasses.dataclass
class DropHeadConfig:
    p: float = 0.1               # head drop rate (at the start and the end of training when scheduled)
    # scheduled: the paper's V (p -> 0 over the lr warm-up -> p at the end) | constant | linear (p -> 0 over
    # training) | v (p -> 0 at mid-training -> p)
    schedule: str = "scheduled"


def scheduled_rate(p: float, schedule: str, progress: float, turn: float = 0.5) -> float:
    """The drop rate at `progress` in [0, 1] of training; `turn` is where the `scheduled` V reaches 0 (the end of
    the learning rate's warm-up, as a share of training)."""
    t = min(max(progress, 0.0), 1.0)
    if schedule == "scheduled":
        if t == 0 or t < turn:  # the start is p even without a warm-up (turn 0)
            return p * (1.0 - t / turn) if turn else p
        return p * (t - turn) / (1.0 - turn) if turn < 1 else 0.0  # a warm-up as long as training: no way back
    if schedule == "linear":
        return p * (1.0 - t)
    if schedule == "v":
        return p * abs(1.0 - 2.0 * t)
    return p


@register_method("drophead")
class DropHead(AttentionMethod):
    """DropHead: whole heads dropped per sample in training, the kept ones rescaled by H / kept."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.3  # x eager attention step (CUDA)

    Config = DropHeadConfig
    identity = {"p": 0.0, "schedule": "constant"}
    stochastic = (Stochastic("p", varies=("sample", "head"), schedule="schedule"),)  # whole heads, per sample

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.progress = 0.0  # fraction of training done; updated from the step context during training
        self._ctx = None
        self._total = None
        self._turn = 0.0  # share of training at which the `scheduled` V reaches 0 (set from the warm-up)
        self._rate_tensor: torch.Tensor | None = None  # this step's rate on the device, read by a compiled model

    def validate(self) -> None:
        super().validate()
        if self.cfg.schedule not in SCHEDULES:
            raise HyperParameterError(f"drophead.schedule={self.cfg.schedule!r}: choose one of "
                                      f"{', '.join(SCHEDULES)}")

    def setup_training(self, ctx) -> None:
        self._ctx, self._total = ctx, ctx.total_steps
        # the V turns where the learning rate's warm-up ends, in the same step units as `progress`
        self._turn = (getattr(ctx, "warmup_steps", 0) or 0) / max(self._total - 1, 1) if self._total else 0.0
        if self.cfg.schedule != "constant" and not self._total:
            raise HyperParameterError("drophead.schedule needs the number of training steps (ctx.total_steps)")
        self._rate_tensor = torch.zeros((), device=getattr(ctx, "device", None))

    def before_step(self, ctx) -> None:
        if self._rate_tensor is not None:  # outside a compiled model or captured graph: no guard on the step number
            self._rate_tensor.fill_(self.rate())

    def rate(self) -> float:
        if self._ctx is not None and self._total:
            self.progress = (self._ctx.step - 1) / max(self._total - 1, 1)
        return scheduled_rate(self.cfg.p, self.cfg.schedule, self.progress, self._turn)

    def head_factors(self, batch: int, heads: int, rate: float, device) -> torch.Tensor:
        """(B, H): 0 for a dropped head, H / kept for a kept one."""
        keep = torch.rand(batch, heads, device=device) >= rate
        keep = keep | ~keep.any(dim=1, keepdim=True)  # a sample that lost every head keeps all (no host sync)
        return keep / keep.sum(dim=1, keepdim=True) * heads

    def epoch_record(self) -> dict:
        return {"rate": self.rate()}

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if not module.training or self.cfg.p <= 0:
            rate = 0.0
        elif in_graph() and self._rate_tensor is not None:
            # a compiled model or a captured step reads the rate as a tensor: a Python number of the step would be
            # guarded on (recompiling at every step) or baked into the graph; heads are drawn even at rate 0 (all
            # kept: factors of exactly 1)
            rate = self._rate_tensor
        else:
            rate = self.rate()
        factors = None
        if isinstance(rate, torch.Tensor) or rate > 0:
            factors = self.head_factors(query.shape[0], query.shape[1], rate, query.device)
            factors = factors.to(query.dtype)[:, :, None, None]
        if not has_probe(module):
            keep = None if attention_mask is None else attention_mask == 0
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=keep, dropout_p=0.0, scale=scaling)
            if factors is not None:
                out = out * factors
            return out.transpose(1, 2).contiguous(), None
        p = softmax(scores(query, key, scaling, attention_mask))
        if factors is not None:
            p = p * factors
        return attend(module, p, value)


@dataclasses.dataclass
class DropAttentionConfig:
    p: float = 0.1  # key-column drop rate


@register_method("dropattention_col")
class DropAttentionColumn(AttentionMethod):
    """DropAttention(c): whole key columns dropped per sample and head, rows renormalised over the kept keys."""
    keeps_expectation = False  # renormalised over the kept keys, as the paper's, rather than rescaled
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.3  # x eager attention step (CUDA)

    Config = DropAttentionConfig
    identity = {"p": 0.0}
    stochastic = (Stochastic("p", varies=("sample", "head", "key")),)  # a key column of one sample's head

    def kept_keys(self, attention_mask, shape, device) -> torch.Tensor:
        """Boolean (B, H, Lq, Lk): valid and not dropped; rows left with no key fall back to all their valid keys."""
        b, h, lq, lk = shape
        valid = valid_keys(attention_mask, torch.empty((1, 1, lq, lk), device=device))
        keep = valid & (torch.rand(b, h, 1, lk, device=device) >= self.cfg.p)
        return keep | (valid & ~keep.any(dim=-1, keepdim=True))

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if module.training and self.cfg.p > 0:
            keep = self.kept_keys(attention_mask, (*query.shape[:3], key.shape[-2]), query.device)
        else:
            keep = None if attention_mask is None else attention_mask == 0
        if not has_probe(module):
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=keep, dropout_p=0.0, scale=scaling)
            return out.transpose(1, 2).contiguous(), None
        s = scores(query, key, scaling, attention_mask)
        if keep is not None:
            s = s.masked_fill(~keep, mask_fill_value(s))
        return attend(module, softmax(s), value)
