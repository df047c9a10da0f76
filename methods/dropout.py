"""Dropout on attention: on the probabilities (vanilla BERT) or on the scores before the softmax
(docs/methods.md#vanilla, #scores_dropout, #scores_dropout_naive)."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from suite.api.attention import (
    AttentionMethod,
    NoConfig,
    attend,
    drop_scores,
    has_probe,
    probs_dropout,
    register_method,
    scores,
    softmax,
)
from suite.api.stochastic import Stochastic


@dataclasses.dataclass
class DropoutConfig:
    p: float = 0.1


@register_method("vanilla")
class Vanilla(AttentionMethod):
    """Attention-probability dropout as in BERT/RoBERTa: P' = P * m / (1-p) after the softmax (fused SDPA)."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.3  # x eager attention step (CUDA)

    Config = DropoutConfig
    identity = {"p": 0.0}
    stochastic = (Stochastic("p"),)  # one draw per sample, head, query and key, on the probabilities

    def rate(self, module) -> float:
        return self.cfg.p if module.training else 0.0

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if not has_probe(module):
            # The fused kernel; a boolean mask avoids casting finfo(fp32).min to bf16 under autocast.
            mask = None if attention_mask is None else attention_mask == 0
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=self.rate(module),
                                                 scale=scaling)
            return out.transpose(1, 2).contiguous(), None
        p = probs_dropout(softmax(scores(query, key, scaling, attention_mask)), self.rate(module), module)
        return attend(module, p, value)


@register_method("no_dropout")
class NoDropout(Vanilla):
    """Softmax attention with no attention dropout at all (hidden dropout unchanged)."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

    Config = NoConfig
    identity = {}
    stochastic = ()

    def rate(self, module) -> float:
        return 0.0


@register_method("scores_dropout")
class ScoresDropout(AttentionMethod):
    """Scores dropout: dropped query-key pairs are masked before the softmax; diagonal kept, no rescale."""
    keeps_expectation = False  # the softmax renormalises over the kept keys: their weights grow, nothing rescales
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.3  # x eager attention step (CUDA)

    Config = DropoutConfig
    identity = {"p": 0.0}
    stochastic = (Stochastic("p"),)  # a dropped pair is masked: weight exactly 0

    def drop_rate(self, module, batch_size: int, device) -> float | torch.Tensor:
        """The drop probability for this layer: a float, or a tensor broadcastable to (B, H, Lq, Lk)."""
        return self.cfg.p

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = scores(query, key, scaling, attention_mask)
        if module.training:
            rate = self.drop_rate(module, s.shape[0], s.device)
            if not (isinstance(rate, float) and rate == 0.0):
                drop = torch.rand(s.shape, device=s.device) < rate
                s = drop_scores(s, drop, attention_mask)
        return attend(module, softmax(s), value)


@register_method("scores_dropout_naive")
class ScoresDropoutNaive(AttentionMethod):
    """nn.Dropout on the raw scores: dropped logits become 0 (not masked), survivors scaled by 1/(1-p).

    The dropout acts before the padding mask is added, so a dropped padded logit can never unmask padding.
    """
    keeps_expectation = False  # the 1/(1-p) acts on logits, and the softmax is not linear in them
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 1.3  # x eager attention step (CUDA)

    Config = DropoutConfig
    identity = {"p": 0.0}
    stochastic = (Stochastic("p", lands="elsewhere"),)  # a dropped logit becomes 0, its weight stays above 0

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = torch.matmul(query, key.transpose(-1, -2)) * scaling
        s = probs_dropout(s, self.cfg.p if module.training else 0.0, module)
        if attention_mask is not None:
            s = s + attention_mask
        return attend(module, softmax(s), value)
