"""Less attention (after LIT, Pan et al. 2022, "Less is More: Pay Less Attention in Vision Transformers");
docs/methods.md#less_attention.

The first `layers` encoder layers do no token mixing: every position attends only to itself, so the attention
sublayer is a position-wise map through the pre-trained value and output projections. The other layers keep softmax
attention with attention-probability dropout, as `vanilla` (the fused SDPA kernel unless a statistics probe needs
the probabilities). At layers=0 and p=0 the method is softmax attention.
"""
from __future__ import annotations

import dataclasses

import torch

from suite.api.attention import has_probe, HyperParameterError, attend, register_method

from .dropout import Vanilla


@dataclasses.dataclass
class LessAttentionConfig:
    layers: int = -1   # attention-free layers counted from the bottom; -1: half the model's layers, rounded down
    p: float = 0.1     # attention-probability dropout in the layers that keep attention


def mixing_free_layers(setting: int, num_layers: int) -> int:
    return num_layers // 2 if setting == -1 else setting


@register_method("less_attention")
class LessAttention(Vanilla):
    """The first N layers (default half) do no token mixing; the others keep softmax attention."""

    Config = LessAttentionConfig
    identity = {"layers": 0, "p": 0.0}
    cost_target = 1.0  # it does less than softmax attention in every layer
    reconstruction = ("the lower layers' attention removed from an encoder pre-trained with attention in every "
                      "layer: it measures how much fine-tuning depends on it, not LIT's model trained that way")

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.free_layers: int | None = None

    def validate(self) -> None:
        super().validate()
        n = self.cfg.layers
        if isinstance(n, bool) or not isinstance(n, int) or n < -1:
            raise HyperParameterError(f"less_attention.layers={n!r} is impossible: it must be an integer >= 0 "
                                      "(or -1 for half the layers)")

    def prepare(self, model: torch.nn.Module) -> None:
        total = model.config.num_hidden_layers
        if self.cfg.layers > total:
            raise HyperParameterError(f"less_attention.layers={self.cfg.layers} exceeds the model's {total} layers")
        self.free_layers = mixing_free_layers(self.cfg.layers, total)

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        free = mixing_free_layers(self.cfg.layers, module.config.num_hidden_layers)
        if module.layer_idx >= free:
            return super().attention(module, query, key, value, attention_mask, scaling, **kwargs)
        if not has_probe(module):
            return value.transpose(1, 2).contiguous(), None
        b, h, length, _ = value.shape
        eye = torch.eye(length, dtype=value.dtype, device=value.device).expand(b, h, length, length)
        return attend(module, eye, value)

    def record(self) -> dict:
        return {"attention_free_layers": self.free_layers} if self.free_layers is not None else {}
