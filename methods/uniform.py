"""Uniform attention over the real tokens: the baseline of Wiegreffe & Pinter, "Attention is not not Explanation".

Queries and keys are ignored; every query spreads its weight evenly over the keys it may attend. Two variants:

- `boundary_tokens=False` (the default): Wiegreffe & Pinter's baseline, 1 / (len - 2) over each row's real tokens
  without the first and the last one (their SOS/EOS; here [CLS] and the final [SEP], found per row on padded
  batches). A middle [SEP] of a sentence pair stays a real token. Sequences of at most two real tokens have nothing
  else and fall back to 1 / len.
- `boundary_tokens=True` (the suite's earlier default, which the published study ran and pins): every non-padding
  key, [CLS] and [SEP] (<s>, </s>) included, gets 1 / len.
"""
from __future__ import annotations

import dataclasses

import torch

from suite.api.attention import AttentionMethod, attend, register_method, valid_keys


@dataclasses.dataclass
class UniformConfig:
    boundary_tokens: bool = False   # Wiegreffe & Pinter's 1 / (len - 2) without the first and last real token;
    #                                 True: 1 / len over every real token, [CLS]/[SEP] included


def uniform_weights(valid: torch.Tensor, boundary_tokens: bool) -> torch.Tensor:
    """Rows of 1 / n over the allowed keys of `valid` (bool, (..., Lq, Lk)), optionally without the sequence's first
    and last real tokens: those any query may attend (in a local layer, a row's window ends are other tokens)."""
    keep = valid
    if not boundary_tokens:
        real = valid.any(dim=-2, keepdim=True)
        count = real.long().cumsum(-1)
        first = real & (count == 1)
        last = real & (count == count[..., -1:])
        inner = valid & ~first & ~last
        keep = torch.where(inner.any(-1, keepdim=True), inner, valid)
    keep = keep.float()
    return keep / keep.sum(-1, keepdim=True).clamp_min(1)


@register_method("uniform")
class Uniform(AttentionMethod):
    """Every query attends uniformly to the real keys (by default without [CLS] and the last [SEP]); no identity
    setting."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

    # the W&P variant came later: records of the old default (True) carry no key, so True stays out of the hash
    hashed_when_changed = {"boundary_tokens": True}
    Config = UniformConfig
    stochastic = ()

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        b, h, lq, _ = query.shape
        lk = key.shape[-2]
        valid = valid_keys(attention_mask, query.new_empty(b, 1, lq, lk)).expand(b, 1, lq, lk)
        probs = uniform_weights(valid, self.cfg.boundary_tokens).to(query.dtype).expand(b, h, lq, lk)
        return attend(module, probs, value)
