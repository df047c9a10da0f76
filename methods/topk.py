"""Top-k selective attention (Explicit Sparse Transformer, Zhao et al. 2019; see docs/methods.md).

After the padding mask, each query row keeps the scores >= its k-th largest score (ties at the k-th value are all
kept, so more than k keys may survive) and the rest get the mask minimum; then softmax and the usual
attention-probability dropout. The threshold is a constant for autograd: gradients flow only through the kept scores.
A k at least the number of a row's valid keys drops nothing there, so the method then equals softmax attention.

How k is chosen (one of three):
- `k`: a fixed k for every row (the paper's usual setting, k = 8).
- `div` (the official code's ratio mode, `--div`/`--lb`): k = ceil(padded key length / div), raised to at least `lb`
  and capped at the padded length. The padded length is the batch's, so k depends on the batch's composition.
- `k_frac` (the suite's own rule, not the official code's): k = ceil(k_frac * the row's real length), at least 1, so
  every row keeps the same share of its own tokens whatever the batch.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from suite.api.attention import (
    AttentionMethod,
    HyperParameterError,
    attend,
    check_integer,
    mask_fill_value,
    probs_dropout,
    register_method,
    softmax,
    valid_keys,
)
from suite.api.stochastic import Stochastic


@dataclasses.dataclass
class TopKConfig:
    k: int = 8                      # keys kept per query (the paper's usual value); ignored when div or k_frac is set
    div: float | None = None        # official ratio mode: k = max(lb, ceil(padded key length / div)), div > 0
    lb: int = 1                     # lower bound on k in the official ratio mode
    k_frac: float | None = None     # the suite's per-row rule: ceil(k_frac * row's real length) keys, 0 < k_frac <= 1
    p: float = 0.1                  # attention-probability dropout after the softmax, as vanilla


def official_ratio_k(key_length: int, div: float, lb: int) -> int:
    """The official code's k for `--div > 0`: ceil(key_length / div), at least lb, at most key_length."""
    return min(max(math.ceil(key_length / div), lb), key_length)


def topk_mask(s: torch.Tensor, valid: torch.Tensor | None, k: int | None, k_frac: float | None) -> torch.Tensor:
    """Boolean (like `s`): True where a score is below its row's k-th largest valid score (to be masked).

    `s` already carries the padding mask (padded keys at the mask minimum), so padding never enters the top k
    ahead of a valid key.
    """
    lk = s.shape[-1]
    if k_frac is None:
        if k >= lk:
            return torch.zeros((), dtype=torch.bool, device=s.device).expand(s.shape)
        threshold = torch.topk(s.detach(), k, dim=-1).values[..., -1:]
    else:
        n = valid.sum(-1, keepdim=True).expand(*s.shape[:-1], 1)
        # the small offset keeps k_frac * n that is an integer in exact arithmetic (0.1 * 30) from rounding up
        k_row = torch.ceil(n.double() * k_frac - 1e-9).long().clamp(min=1).clamp(max=lk)
        # each row's k-th largest score from the sorted row: no host sync for the largest k (a topk of k_max
        # would need it as a Python number), and a compiled model keeps one graph
        threshold = torch.sort(s.detach(), dim=-1, descending=True).values.gather(-1, k_row - 1)
    return s < threshold


@register_method("topk")
class TopK(AttentionMethod):
    """Top-k selective attention: only each query's k largest scores (ties kept) enter the softmax."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.3  # x eager attention step (CUDA)

    hashed_when_changed = {"div": None, "lb": 1}  # the official ratio mode came later
    Config = TopKConfig
    stochastic = (Stochastic("p"),)
    identity = {"k": 1_000_000, "div": None, "k_frac": None, "p": 0.0}

    def validate(self) -> None:
        super().validate()
        k, frac = self.cfg.k, self.cfg.k_frac
        check_integer("topk.k", k, 1)
        if frac is not None and not (isinstance(frac, (int, float)) and math.isfinite(frac) and 0 < frac <= 1):
            raise HyperParameterError(f"topk.k_frac={frac!r} is impossible: it must lie in (0, 1] (or be None "
                                      "to use the fixed topk.k)")
        div, lb = self.cfg.div, self.cfg.lb
        if div is not None and not (isinstance(div, (int, float)) and math.isfinite(div) and div > 0):
            raise HyperParameterError(f"topk.div={div!r} is impossible: it must be > 0 (or None; a fixed k is "
                                      "topk.k)")
        check_integer("topk.lb", lb, 1)
        if div is not None and frac is not None:
            raise HyperParameterError("topk.div and topk.k_frac are two ways of choosing k: set one of them")

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = torch.matmul(query, key.transpose(-1, -2))
        # `scores` in one operator: mask + scaling * s (a real key's mask entry is 0, so its score is the same)
        s = s * scaling if attention_mask is None else torch.add(attention_mask, s, alpha=scaling)
        k = self.cfg.k if self.cfg.div is None else official_ratio_k(s.shape[-1], self.cfg.div, self.cfg.lb)
        valid = None if self.cfg.k_frac is None else valid_keys(attention_mask, s)  # only k_frac counts keys
        s = s.masked_fill(topk_mask(s, valid, k, self.cfg.k_frac), mask_fill_value(s))
        p = probs_dropout(softmax(s), self.cfg.p if module.training else 0.0, module)
        return attend(module, p, value)
