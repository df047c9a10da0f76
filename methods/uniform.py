"""Uniform attention over the real tokens: the baseline of Wiegreffe & Pinter, "Attention is not not Explanation"."""
from __future__ import annotations

from suite.attention import AttentionMethod, attend, register_method, valid_keys


@register_method("uniform")
class Uniform(AttentionMethod):
    """Every query attends uniformly to all non-padding keys; queries and keys are ignored (no identity setting)."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        b, h, lq, _ = query.shape
        valid = valid_keys(attention_mask, query.new_empty(b, 1, lq, key.shape[-2])).to(query.dtype)
        valid = valid.expand(b, 1, lq, key.shape[-2])
        probs = (valid / valid.sum(-1, keepdim=True).clamp_min(1)).expand(b, h, lq, key.shape[-2])
        return attend(module, probs, value)
