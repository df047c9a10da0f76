"""How much do attention and predictions vary across seeds? (Wiegreffe & Pinter 2019, "Attention is not not
Explanation").

Each run stores, for a fixed dev subset (the same examples for every seed), two attention distributions per example
and the predicted distribution:
- "content_attention" (the default comparison): the last layer's attention averaged over heads, restricted to content
  tokens, [CLS], [SEP], padding and the tokenizer's other special tokens dropped from the queries and the keys, each
  remaining row renormalised to sum to one, then averaged over the content queries: a distribution over the content
  tokens. Wiegreffe & Pinter compare attention over the input's words; kept in, the boundary tokens (where BERT's
  heads park most of their mass) dominate the divergence, which then mostly measures attention to the sinks;
- "attention" (`tokens="boundary"`, the earlier measure): the [CLS] query's row over all real tokens, boundary
  tokens included.
Two runs of the same configuration that differ only in the seed are then compared per example: the Jensen-Shannon
divergence of their attention (natural log, so in [0, ln 2]) next to the total-variation distance of their predictions
(1/2 sum |p - q|, in [0, 1]; for regression the absolute difference of the predicted values). The spread of these
per-example values is the natural variance against which differences between methods are read. Records written
before the content measure existed hold only the boundary one: they have no content JSD.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.spatial.distance import jensenshannon

# what the rest of the suite uses; other names are this module's own
__all__ = ["js_divergence", "run_arrays", "seed_divergence", "total_variation"]


def js_divergence(p, q) -> float:
    """Jensen-Shannon divergence in nats; inputs are normalised to sum to one (scipy returns the square root)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if len(p) != len(q) or p.sum() <= 0 or q.sum() <= 0:
        return math.nan
    return float(jensenshannon(p, q)) ** 2


def total_variation(p, q) -> float:
    """1/2 sum |p - q| for distributions; |p - q| for one regression value."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if len(p) == 1:
        return float(abs(p[0] - q[0]))
    return float(0.5 * np.abs(p - q).sum())


TOKENS = {"content": "content_attention", "boundary": "attention"}  # which stored distribution is compared


def content_attention(last_layer, content: list[int]):
    """(H, L, L) -> (len(content),) float64: the head-averaged map on content queries x content keys, each row
    renormalised (rows with no mass on content keys left out), averaged over the rows; None without content."""
    import torch

    if not content:
        return None
    idx = torch.as_tensor(content)
    block = last_layer.double().mean(0)[idx][:, idx]
    mass = block.sum(-1, keepdim=True)
    rows = (block / mass.clamp_min(1e-300))[mass[:, 0] > 0]
    return rows.mean(0) if len(rows) else None


def run_arrays(views, special: set[int] = frozenset()) -> dict:
    """What one run stores: per example its content-token attention and [CLS] attention (None when hidden) and its
    prediction. `special`: the token ids that are not content (special tokens and padding)."""
    from .importance import cls_attention

    def rounded(x):
        return None if x is None else [round(float(v), 6) for v in x]

    return {"content_attention": [None if v.attention is None else rounded(content_attention(
                v.attention[-1], [i for i, t in enumerate(v.input_ids) if t not in special])) for v in views],
            "attention": [None if v.attention is None else rounded(cls_attention(v.attention[-1])) for v in views],
            "prediction": [[round(float(x), 6) for x in v.prediction] for v in views]}


def seed_divergence(a: dict, b: dict, tokens: str = "content") -> dict[str, list[float]]:
    """Per-example JSD of attention (over content tokens, or `tokens="boundary"`: the [CLS] row with the boundary
    tokens) and TVD of predictions between two runs' `run_arrays` (same examples)."""
    if len(a["prediction"]) != len(b["prediction"]):
        raise ValueError("the two runs analysed different dev subsets")
    if tokens not in TOKENS:
        raise ValueError(f"tokens={tokens!r}: choose one of {', '.join(TOKENS)}")
    key = TOKENS[tokens]
    none = [None] * len(a["prediction"])  # an older record without this measure
    jsd = [js_divergence(x, y) if x is not None and y is not None else math.nan
           for x, y in zip(a.get(key, none), b.get(key, none))]
    tvd = [total_variation(x, y) for x, y in zip(a["prediction"], b["prediction"])]
    return {"jsd": jsd, "tvd": tvd}
