"""DropKey (Li et al., CVPR 2023, "DropKey for Vision Transformer"; docs/methods.md#dropkey).

The paper's Algorithm 1 drops keys on the attention logits, before the softmax, with one Bernoulli draw per
(sample, head, query, key) and no rescaling:

    attn = q k^T * scale;  attn = attn + bernoulli(p) * -1e12;  attn = softmax(attn)

and its decreasing schedule lowers the drop ratio along the stack of layers; the suite's reading is linear, from `p`
at the first layer to `p_last` (0 by default) at the last.

What the suite computes is that formula in exact arithmetic. A dropped key of a row that keeps at least one real key
gets weight e^(-1e12) = 0, so it is masked (the padding mask's minimum): no weight, no gradient. A row whose real keys
are all dropped has every score shifted by the same constant, which the softmax cancels: it keeps its undropped
attention. The literal addition of -1e12 does not compute this in floating point (in fp32 every dropped score below
32768 in size rounds to the same number, so such a row turns uniform; in fp16 -1e12 is -inf); and the obvious
masked_fill of dropped keys alone lets such a row tie its dropped keys with the padded ones, which then share its
weight. Padded keys are never drawn: the mask keeps them at its minimum whatever the draw, and a sample without a
real token drops nothing.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from suite.api.attention import (
    AttentionMethod,
    attend,
    has_probe,
    mask_fill_value,
    register_method,
    scores,
    softmax,
    valid_keys,
)
from suite.api.stochastic import Stochastic

from .regularizers import layerwise_rate


@dataclasses.dataclass
class DropKeyConfig:
    p: float = 0.1       # drop ratio of the first (lowest) layer
    p_last: float = 0.0  # drop ratio of the last layer; the rates in between fall linearly with depth


def dropped_keys(draw: torch.Tensor, attention_mask) -> torch.Tensor:
    """Boolean (B, H, Lq, Lk): the real keys the draw (B, H, Lq, Lk) removes. Padded keys are never drawn, and a row
    whose real keys were all drawn loses none of them (the formula's softmax cancels a shift common to the row)."""
    valid = valid_keys(attention_mask, draw)
    drop = draw & valid
    return drop & (valid & ~drop).any(dim=-1, keepdim=True)


@register_method("dropkey")
class DropKey(AttentionMethod):
    """DropKey: keys dropped per query on the logits before the softmax, no rescale, rate falling with depth."""
    keeps_expectation = False  # the paper's: no rescale, the softmax renormalises over the kept keys
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.3  # x eager attention step (CUDA)

    Config = DropKeyConfig
    identity = {"p": 0.0, "p_last": 0.0}
    stochastic = (Stochastic("p"), Stochastic("p_last"))  # one Bernoulli draw per sample, head, query and key

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.num_layers: int | None = None

    def prepare(self, model) -> None:
        self.num_layers = model.config.num_hidden_layers

    @property
    def layer_specific(self) -> str | None:
        return "a drop rate of its own (falling with depth)" if self.cfg.p != self.cfg.p_last else None

    def rate(self, module) -> float:
        """This layer's drop ratio: linear from `p` at the first layer to `p_last` at the last."""
        return layerwise_rate(module.layer_idx, module.config.num_hidden_layers, self.cfg.p, self.cfg.p_last)

    def rates(self, num_layers: int) -> list[float]:
        return [layerwise_rate(layer, num_layers, self.cfg.p, self.cfg.p_last) for layer in range(num_layers)]

    def record(self) -> dict:
        return {"drop_rate_per_layer": self.rates(self.num_layers)} if self.num_layers else {}

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        rate = self.rate(module) if module.training else 0.0
        drop = None
        if rate > 0:
            draw = torch.rand((*query.shape[:3], key.shape[-2]), device=query.device) < rate
            drop = dropped_keys(draw, attention_mask)
        if not has_probe(module):
            keep = None if attention_mask is None else attention_mask == 0
            if drop is not None:
                keep = ~drop if keep is None else keep & ~drop
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=keep, dropout_p=0.0, scale=scaling)
            return out.transpose(1, 2).contiguous(), None
        s = scores(query, key, scaling, attention_mask)
        if drop is not None:
            s = s.masked_fill(drop, mask_fill_value(s))
        return attend(module, softmax(s), value)
