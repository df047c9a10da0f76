"""What the heads look at (Clark et al. 2019, "What Does BERT Look At?").

Per layer and head, averaged over the queries of an example and then over examples: the attention mass on [CLS], on
[SEP] (every separator of a pair input) and on punctuation ("." and ","), and the row entropy in nats after Clark et
al.'s smoothing P' = 0.9999 P + 0.0001 / T (T: the example's length). Rows are divided by their sum first, so
unnormalised rows (ReLA) read as distributions; all-zero rows are left out. The token classes come from
`suite.run.attention_stats.token_classes`; `uniform_entropy` is the mean ln T, the entropy of attention spread evenly.
"""
from __future__ import annotations

import math

import torch

from suite.run.attention_stats import SMOOTHING

# what the rest of the suite uses; other names are this module's own
__all__ = ["STATISTICS", "example_heads", "summarise"]

CLASSES = ("cls", "sep", "punct")
STATISTICS = tuple(f"mass_{c}" for c in CLASSES) + ("entropy",)


def example_heads(layers: list[torch.Tensor], input_ids: list[int], classes: dict[str, list[int]]) -> torch.Tensor:
    """(len(STATISTICS), layers, heads) for one example: the query-mean of each statistic per head."""
    probs = torch.stack(layers).double()                          # (N, H, T, T)
    mass = probs.sum(-1, keepdim=True)
    live = (mass[..., 0] > 0).double()                            # (N, H, T): rows that are a distribution
    q = probs / torch.where(mass > 0, mass, torch.ones_like(mass))
    ids = torch.tensor(input_ids)
    out = []
    for name in CLASSES:
        on = torch.isin(ids, torch.tensor(classes.get(name, []), dtype=ids.dtype)).double()
        out.append(_row_mean(q @ on, live))
    t = q.shape[-1]
    smoothed = q * (1 - SMOOTHING) + SMOOTHING / t
    out.append(_row_mean(-torch.special.xlogy(smoothed, smoothed).sum(-1), live))
    return torch.stack(out)


def _row_mean(values: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Mean over the query axis of (N, H, T) values, counting live rows only (NaN where a head has none)."""
    return (values * live).sum(-1) / live.sum(-1)


def summarise(per_example: list[torch.Tensor], lengths: list[int]) -> dict:
    """Mean over examples of `example_heads` as nested lists [layer][head], plus the uniform reference entropy."""
    if not per_example:
        return {}
    mean = torch.stack(per_example).nanmean(0)
    out = {name: [[round(float(v), 6) for v in row] for row in mean[i]] for i, name in enumerate(STATISTICS)}
    out["uniform_entropy"] = sum(math.log(n) for n in lengths) / len(lengths)
    return out
