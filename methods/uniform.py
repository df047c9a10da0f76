"""Uniform attention over the real tokens: the baseline of Wiegreffe & Pinter, "Attention is not not Explanation".

Queries and keys are ignored; every query spreads its weight evenly over the keys it may attend. Two variants:

- `boundary_tokens=True` (the default, the suite's own choice): every non-padding key, [CLS] and [SEP] (<s>, </s>)
  included, gets 1 / len. In a BERT-style encoder the boundary tokens are ordinary positions (the classifier reads
  [CLS]), so the default treats them like any other token.
- `boundary_tokens=False`: Wiegreffe & Pinter's baseline, 1 / (len - 2) over the real tokens without the first and
  the last one (their SOS/EOS; here [CLS] and the final [SEP]). A middle [SEP] of a sentence pair stays a real
  token. Sequences of at most two real tokens have nothing else and fall back to 1 / len.
"""
from __future__ import annotations

import dataclasses

import torch

from suite.api.attention import AttentionMethod, attend, register_method, valid_keys


@dataclasses.dataclass
class UniformConfig:
    boundary_tokens: bool = True    # False: Wiegreffe & Pinter's 1 / (len - 2) without the first and last token


def uniform_weights(valid: torch.Tensor, boundary_tokens: bool) -> torch.Tensor:
    """Rows of 1 / n over the allowed keys of `valid` (bool, (..., Lk)), optionally without the first and last."""
    keep = valid
    if not boundary_tokens:
        count = valid.long().cumsum(-1)
        first = valid & (count == 1)
        last = valid & (count == count[..., -1:])
        inner = valid & ~first & ~last
        keep = torch.where(inner.any(-1, keepdim=True), inner, valid)
    keep = keep.float()
    return keep / keep.sum(-1, keepdim=True).clamp_min(1)


@register_method("uniform")
class Uniform(AttentionMethod):
    """Every query attends uniformly to the real keys (optionally without [CLS]/[SEP]); no identity setting."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

    hashed_when_changed = {"boundary_tokens": True}  # the W&P variant came later
    Config = UniformConfig

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        b, h, lq, _ = query.shape
        lk = key.shape[-2]
        valid = valid_keys(attention_mask, query.new_empty(b, 1, lq, lk)).expand(b, 1, lq, lk)
        probs = uniform_weights(valid, self.cfg.boundary_tokens).to(query.dtype).expand(b, h, lq, lk)
        return attend(module, probs, value)
