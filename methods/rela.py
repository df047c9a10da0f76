"""ReLA: rectified linear attention with a gated RMSNorm (Zhang, Titov, Sennrich 2021; docs/methods.md#rela).

Follows the official TensorFlow code (bzhangGo/zero, modules/rela.py):
  A = ReLU(S * M01)                 padded logits are zeroed (multiplicative mask), so ReLU gives them exactly 0
  A = dropout(A)                    rows are never renormalised; an all-zero row is "null attention"
  O = concat_heads(A V)             (B, L, H*d)
  O = g * O / sqrt(mean(O^2) + eps) * sigmoid(w * O)     per attention module, before the output projection
g ("scale") starts at 1; w ("gate") uses the recipe's fan-average uniform initialiser, U(-sqrt(3/n), sqrt(3/n)) for a
vector of n = H*d (gain 1). eps = 1e-8 as in the official code.

`g_init` is the one fine-tuning knob: pre-trained W_o expects the scale of the softmax context, while the norm
outputs a vector of RMS about 0.5 * g (sigmoid gate near 0.5 at init). A smaller g_init keeps the attention branch
closer to the size the residual stream was trained with. Default 1.0 is the paper's. For MiniLM-L6-H384 the
softmax context has an RMS of 0.22-0.30 per layer, and g_init=0.5 matches it (docs/results.md: its effect on SST-2).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from suite.api.attention import (
    AttentionMethod,
    HyperParameterError,
    attend,
    attention_modules,
    probs_dropout,
    register_method,
    valid_keys,
)


@dataclasses.dataclass
class ReLAConfig:
    p: float = 0.1          # dropout on the rectified weights (the official recipe's attention dropout)
    g_init: float = 1.0     # initial RMSNorm scale g (paper: 1.0)
    eps: float = 1e-8       # RMSNorm epsilon (official code: 1e-8)


def gated_rms_norm(x: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """g * x / sqrt(mean(x^2) + eps) * sigmoid(w * x) over the last dimension, in at least fp32 (mean(x^2)
    overflows fp16)."""
    work = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(work)
    rms = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (scale.to(work) * xf * rms * torch.sigmoid(gate.to(work) * xf)).to(x.dtype)


@register_method("rela")
class ReLA(AttentionMethod):
    """ReLU attention (unnormalised, null rows allowed) with a gated RMSNorm on the concatenated heads (ReLA-g)."""
    cost_target = 1.2  # x eager attention step (CUDA)

    Config = ReLAConfig
    identity = None  # replaces softmax: no setting equals softmax attention

    def validate(self) -> None:
        super().validate()
        if not (math.isfinite(self.cfg.g_init) and self.cfg.g_init > 0):
            raise HyperParameterError(f"rela.g_init={self.cfg.g_init} is impossible: it must be > 0")
        if not (math.isfinite(self.cfg.eps) and self.cfg.eps > 0):
            raise HyperParameterError(f"rela.eps={self.cfg.eps} is impossible: it must be > 0")

    def extra_parameters(self, config) -> int:
        return config.num_hidden_layers * 2 * config.hidden_size  # a scale and a gate per attention output unit

    def prepare(self, model: torch.nn.Module) -> None:
        for module in attention_modules(model):
            n = getattr(module, "all_head_size", None) or module.config.hidden_size
            like = module.query.weight if hasattr(module, "query") else next(module.parameters())
            bound = math.sqrt(3.0 / n)
            module.register_parameter(
                "rela_scale", torch.nn.Parameter(torch.full((n,), self.cfg.g_init, dtype=like.dtype,
                                                            device=like.device)))
            module.register_parameter(
                "rela_gate", torch.nn.Parameter(torch.empty(n, dtype=like.dtype, device=like.device)
                                                .uniform_(-bound, bound)))

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = torch.matmul(query, key.transpose(-1, -2)) * scaling
        if attention_mask is not None:
            # Zero the padded logits before the ReLU (never an additive mask after it): they come out exactly 0.
            s = s.masked_fill(~valid_keys(attention_mask, s), 0.0)
        weights = probs_dropout(torch.relu(s), self.cfg.p if module.training else 0.0, module)
        out, _ = attend(module, weights, value)
        b, lq, h, d = out.shape
        out = gated_rms_norm(out.reshape(b, lq, h * d), module.rela_scale, module.rela_gate, self.cfg.eps)
        return out.view(b, lq, h, d), weights
