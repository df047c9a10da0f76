"""ReLA: rectified linear attention with a gated RMSNorm (Zhang, Titov, Sennrich 2021; docs/methods.md#rela).

Follows the official TensorFlow code (bzhangGo/zero, modules/rela.py):
  A = ReLU(S * M01)                 padded logits are zeroed (multiplicative mask), so ReLU gives them exactly 0
                                    (here they get the additive mask minimum instead: the same exact 0s and no
                                    gradient, in one operator with the scaling)
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
import torch.nn.functional as F

from suite.api.attention import (
    AttentionMethod,
    HyperParameterError,
    attend,
    attention_modules,
    has_probe,
    probs_dropout,
    register_method,
)
from suite.api.stochastic import Stochastic

from .entmax_attention import at_least_fp32


@dataclasses.dataclass
class ReLAConfig:
    p: float = 0.1          # dropout on the rectified weights (the official recipe's attention dropout)
    g_init: float = 1.0     # initial RMSNorm scale g (paper: 1.0)
    eps: float = 1e-8       # RMSNorm epsilon (official code: 1e-8)


def gated_rms_norm(x: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """g * x / sqrt(mean(x^2) + eps) * sigmoid(w * x) over the last dimension, in at least fp32 (mean(x^2)
    overflows fp16). `F.rms_norm` is one fused kernel on CUDA (and the same formula elsewhere)."""
    work = at_least_fp32(x.dtype)
    xf = x.to(work)
    return (F.rms_norm(xf, xf.shape[-1:], scale.to(work), eps) * torch.sigmoid(gate.to(work) * xf)).to(x.dtype)


@register_method("rela")
class ReLA(AttentionMethod):
    """ReLU attention (unnormalised, null rows allowed) with a gated RMSNorm on the concatenated heads (ReLA-g)."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.2  # x eager attention step (CUDA)

    Config = ReLAConfig
    identity = None  # replaces softmax: no setting equals softmax attention
    stochastic = (Stochastic("p"),)

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
        s = torch.matmul(query, key.transpose(-1, -2))
        if attention_mask is None:
            s = s * scaling
        else:
            # mask + scaling * s in one operator: a padded logit lands at the mask minimum (or -inf in half
            # precision), so the ReLU gives it exactly 0 and no gradient, as zeroing it would; a real one is
            # scaling * s exactly (its mask entry is 0)
            s = torch.add(attention_mask.to(s.dtype), s, alpha=scaling)
        weights = probs_dropout(torch.relu(s), self.cfg.p if module.training else 0.0, module)
        if has_probe(module):
            out = attend(module, weights, value)[0]  # the probe sees the weights
        else:
            out = torch.matmul(weights.to(value.dtype), value).transpose(1, 2)
        b, lq, h, d = out.shape
        # the heads side by side in the norm's precision: one copy makes both the layout and the upcast
        work = at_least_fp32(out.dtype)
        out = out.contiguous() if work == out.dtype else out.to(work, memory_format=torch.contiguous_format)
        out = gated_rms_norm(out.view(b, lq, h * d), module.rela_scale, module.rela_gate, self.cfg.eps)
        return out.to(value.dtype).view(b, lq, h, d), weights
