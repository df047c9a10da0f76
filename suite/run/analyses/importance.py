"""Is attention where the prediction's evidence is? (Meister et al. 2021, "Is Sparse Attention more Interpretable?")

Per example, over its content tokens (special tokens left out):
- input importance: gradient x input and leave-one-out (capture.py), as magnitudes;
- attention importance: the last layer's [CLS] row averaged over heads, and attention rollout (Abnar & Zuidema
  2020: per layer the head-averaged map mixed with the identity, 0.5 A + 0.5 I, rows renormalised, multiplied from
  the first layer up; the [CLS] row of the product);
- Kendall's tau-b (scipy) between each attention importance and each input importance;
- the Shannon entropy (nats) of each importance read as a distribution over the content tokens (its magnitudes
  divided by their sum). Lower entropy: the scores concentrate on fewer tokens.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats as sps

# what the rest of the suite uses; other names are this module's own
__all__ = ["cls_attention", "entropy", "example_scores", "kendall", "rollout", "summarise"]


def cls_attention(last_layer: torch.Tensor) -> torch.Tensor:
    """(H, L, L) -> (L,): the [CLS] (first) query's row averaged over heads."""
    return last_layer[:, 0, :].mean(0)


def rollout(layers: list[torch.Tensor]) -> torch.Tensor:
    """[CLS] row of the attention rollout over (H, L, L) maps, first layer first."""
    length = layers[0].shape[-1]
    eye = torch.eye(length, dtype=torch.float64)
    flow = eye
    for probs in layers:
        mixed = 0.5 * probs.double().mean(0) + 0.5 * eye
        mixed = mixed / mixed.sum(-1, keepdim=True)
        flow = mixed @ flow
    return flow[0].float()


def entropy(scores) -> float:
    """Shannon entropy (nats) of nonnegative scores read as a distribution; NaN when they are all zero."""
    s = np.abs(np.asarray(scores, dtype=np.float64))
    return float(sps.entropy(s)) if s.sum() > 0 else math.nan


def kendall(a, b) -> float:
    """Kendall's tau-b; NaN for fewer than two tokens or a constant side."""
    if len(a) < 2:
        return math.nan
    tau = sps.kendalltau(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)).statistic
    return float(tau)


def example_scores(attention: list[torch.Tensor] | None, importances: dict[str, torch.Tensor],
                   content: list[int]) -> dict[str, float]:
    """Taus and entropies of one example; `content` are the positions compared (special tokens left out)."""
    idx = torch.tensor(content, dtype=torch.long)
    out: dict[str, float] = {"tokens": float(len(content))}
    imp = {k: v[idx] for k, v in importances.items() if v is not None}
    for name, values in imp.items():
        out[f"entropy_{name}"] = entropy(values)
    if attention:
        att = {"cls": cls_attention(attention[-1])[idx], "rollout": rollout(attention)[idx]}
        for a_name, a_values in att.items():
            out[f"entropy_{a_name}"] = entropy(a_values)
            for i_name, i_values in imp.items():
                out[f"tau_{a_name}_{i_name}"] = kendall(a_values, i_values)
    return out


def summarise(per_example: list[dict[str, float]]) -> dict[str, dict]:
    """Per-example lists and their means (NaNs left out of the means)."""
    keys = sorted({k for row in per_example for k in row})
    lists = {k: [row.get(k, math.nan) for row in per_example] for k in keys}
    means = {}
    for k, values in lists.items():
        finite = [v for v in values if not math.isnan(v)]
        means[k] = sum(finite) / len(finite) if finite else math.nan
    return {"per_example": {k: [round(v, 6) for v in vs] for k, vs in lists.items()}, "mean": means}
