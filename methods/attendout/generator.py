"""AttendOut's generator G (G-Net) and its Bernoulli drop policy over query-key pairs.

G is a single-head self-attention scorer per encoder layer (or one shared scorer plus a learned layer embedding)
over the detached input hidden states h_l of attention layer l:

    logits_l = (h_l Wq_l)(h_l Wk_l)^T / sqrt(d_g) + b_l,    pi_l = p_max * sigmoid(logits_l),    m_l ~ Bernoulli(pi_l)

with one mask (B, T, T) per layer, shared across heads. Masks are drawn from G's own random generator, so the
model's dropout draws (from torch's global generator) do not depend on how many masks were drawn: the reward can
then replay the same hidden-dropout draws under different masks (common random numbers).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


class GNet(nn.Module):
    """Single-head self-attention scorer: logits_l = (h Wq_l)(h Wk_l)^T / sqrt(d_g) + b_l over query-key pairs."""

    def __init__(self, hidden: int, d_g: int, num_layers: int, shared: bool, init_bias: float):
        super().__init__()
        n = 1 if shared else num_layers
        self.shared = shared
        self.d_g = d_g
        self.query = nn.ModuleList(nn.Linear(hidden, d_g, bias=False) for _ in range(n))
        self.key = nn.ModuleList(nn.Linear(hidden, d_g, bias=False) for _ in range(n))
        self.bias = nn.Parameter(torch.full((n,), float(init_bias)))
        self.layer_embedding = nn.Embedding(num_layers, hidden) if shared else None
        if shared:
            nn.init.normal_(self.layer_embedding.weight, std=0.02)

    def forward(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """(B, T, hidden) -> logits (B, T, T)."""
        i = 0 if self.shared else layer
        if self.shared:
            h = h + self.layer_embedding.weight[layer]
        q, k = self.query[i](h), self.key[i](h)
        return torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_g) + self.bias[i]


def init_bias(p_init: float, p_max: float) -> float:
    """The bias b with p_max * sigmoid(b) = p_init (0 when p_max = 0: G then drops nothing)."""
    if p_max <= 0:
        return 0.0
    frac = p_init / p_max
    return math.log(frac / (1 - frac))


@dataclasses.dataclass
class MaskSample:
    """One layer's sampled mask with what the policy gradient needs."""

    layer: int
    logits: torch.Tensor   # (B, T, T), attached to G's graph when collected for an update
    drop: torch.Tensor     # (B, T, T) bool, False outside `valid`
    valid: torch.Tensor    # (B or 1, T, T) bool: real query, real key, off the diagonal


def valid_pairs(attention_mask: torch.Tensor | None, length: int, device) -> torch.Tensor:
    """(B or 1, T, T) bool: pairs whose query and key are real tokens, diagonal excluded (it is never dropped)."""
    if attention_mask is None:
        keys = torch.ones(1, 1, length, length, dtype=torch.bool, device=device)
    else:
        keys = attention_mask == 0
    queries = keys.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)  # in self-attention query i is real iff key i is
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return (keys & queries & ~eye)[:, 0]


def policy_log_probs(logits: torch.Tensor, p_max: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pi, log pi, log(1 - pi)) with pi = p_max * sigmoid(logits), computed stably."""
    log_pi = math.log(p_max) + F.logsigmoid(logits)
    pi = log_pi.exp()
    return pi, log_pi, torch.log1p(-pi)


def split_rows(sample: MaskSample, blocks: int) -> list[MaskSample]:
    """A sample drawn for `blocks` copies of a batch (rows copy-major) as one sample per copy (views, no copies)."""
    valid = sample.valid.chunk(blocks) if sample.valid.shape[0] > 1 else [sample.valid] * blocks
    return [MaskSample(sample.layer, lg, d, v)
            for lg, d, v in zip(sample.logits.chunk(blocks), sample.drop.chunk(blocks), valid)]


def _per_layer(samples: list[list[MaskSample]], logits: bool = True):
    """Per layer, the K masks' samples concatenated: (logits or None, drop, valid), each (K * B, T, T)."""
    for layer in zip(*samples, strict=True):
        yield (torch.cat([s.logits for s in layer]) if logits else None, torch.cat([s.drop for s in layer]),
               torch.cat([s.valid.expand_as(s.drop) for s in layer]))


def policy_terms(samples: list[list[MaskSample]], p_max: float, entropy: bool = False, rate: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | float, torch.Tensor]:
    """For K masks' samples (samples[k]: one MaskSample per layer, B rows each): log p(m) (K, B), the Bernoulli
    entropy (K, B) if `entropy` (else None), the sum of pi if `rate` (else 0) and the number of valid pairs; log p(m)
    sums m log pi + (1 - m) log(1 - pi) over layers and valid pairs. Computed once per layer for all K masks.
    """
    logp, ent, pi_sum, pairs = 0.0, None, 0.0, 0.0
    for logits, drop, valid in _per_layer(samples):
        pi, log_pi, log_keep = policy_log_probs(logits, p_max)
        logp = logp + (torch.where(drop, log_pi, log_keep) * valid).sum((-1, -2))  # log pi, log(1-pi) are finite
        if entropy:
            layer_ent = (-(pi * log_pi + (1 - pi) * log_keep) * valid).sum((-1, -2))
            ent = layer_ent if ent is None else ent + layer_ent
        if rate:
            pi_sum = pi_sum + (pi * valid).sum()
        pairs = pairs + valid.sum()
    k = len(samples)
    return logp.view(k, -1), None if ent is None else ent.view(k, -1), pi_sum, pairs


@dataclasses.dataclass(frozen=True)
class LayerSums:
    """Per layer (L,), float64 on G's device: the sums over every training pass's valid pairs of G's drop
    probabilities and of its drawn drops, and the number of valid pairs (`AttendOut.layer_sums`)."""

    pi: torch.Tensor
    drawn: torch.Tensor
    pairs: torch.Tensor


def drop_shares(samples: list[list[MaskSample]]) -> torch.Tensor:
    """(K, B): the share of each sample's valid pairs that each of K masks drops, over all layers."""
    dropped, pairs = 0.0, 0.0
    for _, drop, valid in _per_layer(samples, logits=False):
        dropped = dropped + drop.sum((-1, -2))
        pairs = pairs + valid.sum((-1, -2))
    return (dropped.float() / pairs.float().clamp_min(1)).view(len(samples), -1)
