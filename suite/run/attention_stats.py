"""Attention statistics of a fine-tuned model: one implementation for every method (docs/methods.md,
docs/analyses.md#heads).

The runner calls `attention_statistics` at the end of each run. It puts the model in eval mode, sets a probe on every
attention module (`suite.api.attention.probes`, which `attend` calls with the layer's probabilities) and
feeds the first dev batches. Each layer's map is reduced at once to sums and counts, so no map is kept.

The reduction is a set of pure tensor functions of (probs (B, H, L, L), valid (B, L), input_ids (B, L)), so tests can
feed hand-made maps. Definitions, per layer, over the valid (non-padding) queries and keys of every head:

- sparsity        share of exact zeros among valid query-key pairs (ReLA, Correia et al.).
- null_rows       share of (head, query) rows whose valid weights are all zero (ReLA's "null attention").
- attended_keys   mean number of nonzero weights per (head, query) row.
- entropy         mean row entropy in nats, after Clark et al.'s smoothing P' = 0.9999 P + 0.0001 / T (T: the
                  query's number of valid keys). Rows are first divided by their L1 mass, so rows that do not sum to
                  one (ReLA) are read as distributions; null rows have no distribution and are left out.
- head_disagreement
                  Correia et al. (2019)'s disagreement between heads: the generalised Jensen-Shannon divergence of
                  the heads' rows for the same query, H(mean_h p_h) - mean_h H(p_h) (nats, no smoothing,
                  0 log 0 = 0; between 0 for identical heads and ln H), averaged over queries. Null rows are left
                  out of both means; a query with fewer than two non-null rows does not count.
- head_diversity  the suite's own pairwise variant: the two-distribution Jensen-Shannon divergence between the rows
                  of every pair of heads for the same query (at most ln 2), averaged over the pairs, then over
                  queries. Pairs in which either row is null are left out; a query with no such pair does not count.
                  It costs H(H-1)/2 passes over a row, most of the statistics' time.
                  Both head statistics are averaged over a systematic sample of query positions: every s-th with
                  s = ceil(L / DIVERSITY_QUERIES) (all when L <= 32).
- mass_cls, mass_sep, mass_punct
                  mean share of a row's mass on [CLS], on [SEP] (all of them in a pair input), and on "." and ","
                  tokens (Clark et al.), over non-null rows. RoBERTa's <s> and </s> play [CLS] and [SEP].

Per-layer values weigh every row of every batch equally; `mean` is the plain mean of the per-layer values.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import torch

from suite.api.attention import probes

__all__ = ["DIVERSITY_QUERIES", "LayerAccumulator", "SMOOTHING", "STATS", "attention_statistics", "map_sums",
           "token_classes"]  # what the rest of the suite uses; other names are this module's own

STATS = ("sparsity", "entropy", "null_rows", "attended_keys", "head_diversity", "head_disagreement", "mass_cls",
         "mass_sep", "mass_punct")
SMOOTHING = 1e-4  # Clark et al.: P' = (1 - SMOOTHING) * P + SMOOTHING / T
PUNCTUATION = (".", ",")
DIVERSITY_QUERIES = 32  # query positions per sequence sampled for head diversity


# ---------------------------------------------------------------------------------------------------------
# Token classes
# ---------------------------------------------------------------------------------------------------------

def token_classes(tokenizer) -> dict[str, list[int]]:
    """Token ids of the classes whose received attention is measured: cls, sep, punct."""

    def first(*names: str) -> list[int]:
        for name in names:
            tid = getattr(tokenizer, name, None)
            if tid is not None:
                return [int(tid)]
        return []

    punct = set()
    unk = getattr(tokenizer, "unk_token_id", None)
    # WordPiece spells them ".", byte-level BPE also "Ġ." (after a space), SentencePiece "▁.".
    for sym in PUNCTUATION:
        for tok in (sym, "\u0120" + sym, "\u2581" + sym):
            tid = tokenizer.convert_tokens_to_ids(tok)
            if tid is not None and tid != unk and tokenizer.convert_ids_to_tokens(tid) == tok:
                punct.add(int(tid))
    return {"cls": first("cls_token_id", "bos_token_id"), "sep": first("sep_token_id", "eos_token_id"),
            "punct": sorted(punct)}


# ---------------------------------------------------------------------------------------------------------
# Pure tensor functions
# ---------------------------------------------------------------------------------------------------------

def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p, p).sum(-1)


def _entropy_(p: torch.Tensor) -> torch.Tensor:
    """Row entropies, overwriting `p` (saves an allocation on maps of hundreds of MB)."""
    return -torch.special.xlogy(p, p, out=p).sum(-1)


def map_sums(probs: torch.Tensor, valid: torch.Tensor, input_ids: torch.Tensor | None = None,
             classes: dict[str, list[int]] | None = None) -> dict[str, tuple[float, float]]:
    """Per statistic, (sum, count) over one layer's map; the statistic is sum / count.

    probs (B, H, L, L) with nonnegative weights, valid (B, L) bool (True: a real token), input_ids (B, L) for the
    token-class masses (left out when None). Sums and counts add up across batches.
    """
    p = probs.detach()
    p = p.double() if p.dtype == torch.float64 else p.float()
    valid = valid.to(device=p.device, dtype=torch.bool)
    b, h, lq, lk = p.shape
    pair = (valid[:, :lq, None] & valid[:, None, :lk])[:, None]            # (B, 1, L, L)
    p = p.masked_fill(~pair, 0)                                              # also drops NaN at padding
    rows = valid[:, None, :lq].expand(b, h, lq)                              # valid (head, query) rows
    n_rows = float(rows.sum())
    out: dict[str, tuple[float, float]] = {}

    nonzero = (p != 0).sum(-1)                                               # (B, H, L)
    n_pairs = float(pair.sum()) * h
    out["sparsity"] = (n_pairs - float(nonzero[rows].sum()), n_pairs)
    out["attended_keys"] = (float(nonzero[rows].sum()), n_rows)
    null = (nonzero == 0) & rows
    out["null_rows"] = (float(null.sum()), n_rows)

    live = rows & ~null                                                      # rows that are a distribution
    n_live = float(live.sum())
    mass = p.sum(-1, keepdim=True)
    q = p.div_(torch.where(mass > 0, mass, torch.ones_like(mass)))           # L1-normalised rows, in place
    del p

    n_keys = valid[:, :lk].sum(-1).clamp_min(1).to(q.dtype)[:, None, None, None]   # T per query
    smoothed = q.mul(1 - SMOOTHING).add_(SMOOTHING / n_keys).masked_fill_(~pair, 0)
    out["entropy"] = (float(_entropy_(smoothed)[live].sum()), n_live)
    del smoothed

    if input_ids is not None and classes is not None:
        ids = input_ids.to(q.device)[:, :lk]
        names = ("cls", "sep", "punct")
        members = [torch.tensor(classes.get(n, []), dtype=ids.dtype, device=q.device) for n in names]
        on = torch.stack([torch.isin(ids, m) & valid[:, :lk] for m in members], -1).to(q.dtype)  # (B, L, 3)
        got = torch.matmul(q, on[:, None])                                   # (B, H, L, 3), one pass over q
        for c, name in enumerate(names):
            out[f"mass_{name}"] = (float(got[..., c][live].sum()), n_live)

    stride = -(-lq // DIVERSITY_QUERIES)
    out["head_diversity"] = _head_diversity(q[:, :, ::stride], live[:, :, ::stride])
    out["head_disagreement"] = _head_disagreement(q[:, :, ::stride], live[:, :, ::stride])
    return out


def _head_disagreement(q: torch.Tensor, live: torch.Tensor) -> tuple[float, float]:
    """(sum over queries of H(mean_h p_h) - mean_h H(p_h) over the non-null heads, queries with >= 2 of them)."""
    w = live.to(q.dtype)                                                     # (B, H, L)
    n = w.sum(1)                                                             # (B, L) non-null heads per query
    mixture = (q * w[..., None]).sum(1) / n.clamp_min(1)[..., None]          # (B, L, K)
    mean_entropy = (_entropy(q) * w).sum(1) / n.clamp_min(1)
    js = (_entropy(mixture) - mean_entropy).clamp_min(0)
    has = n >= 2
    return float(js[has].sum()), float(has.sum())


def _head_diversity(q: torch.Tensor, live: torch.Tensor) -> tuple[float, float]:
    """(sum over queries of the mean pairwise JSD between heads, number of queries with at least one pair)."""
    b, h, lq, _ = q.shape
    if h < 2:
        return 0.0, 0.0
    ent = _entropy(q)                                                        # (B, H, L)
    jsd_sum = torch.zeros(b, lq, dtype=q.dtype, device=q.device)
    pairs = torch.zeros(b, lq, dtype=q.dtype, device=q.device)
    for i in range(h - 1):
        # JSD(p, r) = H(m) - (H(p) + H(r)) / 2 with m = (p + r) / 2, for head i against every later head at once.
        # With s = p + r (which sums to 2): H(m) = ln 2 + (-sum s ln s) / 2, one pass fewer than forming m.
        h_mix = math.log(2) + 0.5 * _entropy_(q[:, i + 1:] + q[:, i:i + 1])
        jsd = (h_mix - 0.5 * (ent[:, i + 1:] + ent[:, i:i + 1])).clamp_min(0)
        both = (live[:, i + 1:] & live[:, i:i + 1]).to(q.dtype)
        jsd_sum += (jsd * both).sum(1)
        pairs += both.sum(1)
    has = pairs > 0
    per_query = jsd_sum[has] / pairs[has]
    return float(per_query.sum()), float(has.sum())


def _ratio(total: float, count: float) -> float:
    return total / count if count > 0 else math.nan


class LayerAccumulator:
    """Sums and counts per layer and statistic, accumulated over batches."""

    def __init__(self, layers: int):
        self.layers = layers
        self.sums = [{k: [0.0, 0.0] for k in STATS} for _ in range(layers)]
        self.seen = [False] * layers

    def add(self, layer: int, sums: dict[str, tuple[float, float]]) -> None:
        self.seen[layer] = True
        for k, (s, n) in sums.items():
            self.sums[layer][k][0] += s
            self.sums[layer][k][1] += n

    def result(self, batches: int) -> dict[str, Any]:
        per_layer = {k: [_ratio(*self.sums[i][k]) for i in range(self.layers)] for k in STATS}
        mean = {}
        for k, values in per_layer.items():
            finite = [v for v in values if not math.isnan(v)]
            mean[k] = sum(finite) / len(finite) if finite else math.nan
        return {"batches": batches, "layers": self.layers, "per_layer": per_layer, "mean": mean}


# ---------------------------------------------------------------------------------------------------------
# The model-level entry point
# ---------------------------------------------------------------------------------------------------------

@torch.no_grad()
def attention_statistics(model, tokenizer, dev, spec, train, pad_id: int, device, amp_dtype) -> dict[str, Any]:
    """Statistics of the model's attention, in eval mode, over the first `train.stats_batches` dev batches."""
    from suite.run.batching import collate, sorted_batches, to_device

    classes = token_classes(tokenizer)
    batches = sorted_batches(dev.lengths(), train.eval_batch_size)[:train.stats_batches]
    current: dict[str, torch.Tensor] = {}

    def probe(module, probs):
        acc.add(index[module], map_sums(probs, current["valid"], current["ids"], classes))

    was_training = model.training
    model.eval()
    autocast = (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None
                else contextlib.nullcontext())
    try:
        with probes(model, probe) as modules:
            # layer_idx numbers the encoder's layers; fall back to module order if a model lacks it
            index = {m: (m.layer_idx if isinstance(getattr(m, "layer_idx", None), int) else i)
                     for i, m in enumerate(modules)}
            acc = LayerAccumulator(max(index.values()) + 1 if modules else 0)
            for b in batches:
                batch = to_device(collate([dev.features[i] for i in b], [dev.labels[i] for i in b], pad_id,
                                          spec.is_regression), device)
                current["valid"] = batch["attention_mask"].bool()
                current["ids"] = batch["input_ids"]
                with autocast:
                    model(**batch)
    finally:
        model.train(was_training)
    if batches and not all(acc.seen):
        missing = [i for i, s in enumerate(acc.seen) if not s]
        warnings.warn(f"attention statistics: layers {missing} never reported probabilities (the method does not "
                      "finish through suite.api.attention.attend); their statistics are NaN")
    return acc.result(len(batches))
