"""Interpretability analyses run at the end of a run on a fixed dev subset (docs/analyses.md).

- `importance`: attention vs input importance (Meister et al. 2021): Kendall tau between the last layer's [CLS]
  attention / attention rollout and gradient x input / leave-one-out, and the entropies of each (importance.py).
- `seeds`: the per-example attention and prediction arrays that the report pairs across seeds (Wiegreffe & Pinter
  2019): JS divergence of attention next to total-variation distance of predictions (seeds.py).
- `heads`: per layer and head, the mass on [CLS], [SEP], punctuation and the entropy (Clark et al. 2019) (heads.py).

`run_analyses(...)` returns one JSON-able dict per run with the selected analyses, the dev examples used and the
seconds each took. All three share one forward pass per example; `importance` adds a backward pass and a forward
pass over the example's leave-one-out variants (about one extra forward per token), which makes it the costly one.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from suite.run.analyses import heads, importance, seeds
from suite.run.analyses.capture import capture_example, leave_one_out
from suite.run.data import seeded_subset
from suite.run.settings import selected_analyses as selected

SUBSET_SEED = 12345  # the analysed dev examples are the same for every run of a task (and every method and seed)


def _content_positions(input_ids: list[int], special: set[int]) -> list[int]:
    return [i for i, t in enumerate(input_ids) if t not in special]


def run_analyses(model, tokenizer, dev, spec, train, pad_id: int, device, amp_dtype) -> dict[str, Any]:
    """The analyses named in `train.analyses` over `train.analysis_examples` dev examples of `dev` (an Encoded)."""
    from suite.run.attention_stats import token_classes

    names = selected(train.analyses)
    if not names or len(dev) == 0:
        return {}
    indices = seeded_subset(len(dev), train.analysis_examples, SUBSET_SEED)
    autocast = (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext())
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | {pad_id}
    classes = token_classes(tokenizer)
    was_training = model.training
    model.eval()
    cost = {"pass_s": 0.0, "leave_one_out_s": 0.0}
    rows, head_rows, views = [], [], []
    try:
        for i in indices:
            start = time.perf_counter()
            view = capture_example(model, dev.features[i], spec.is_regression, device, autocast,
                                   with_gradients="importance" in names)
            cost["pass_s"] += time.perf_counter() - start
            views.append(view)
            if "heads" in names and view.attention:
                head_rows.append(heads.example_heads(view.attention, view.input_ids, classes))
            if "importance" in names:
                content = _content_positions(view.input_ids, special)
                start = time.perf_counter()
                loo = torch.zeros(len(view.input_ids))
                loo[content] = leave_one_out(model, dev.features[i], content, spec.is_regression, device, autocast)
                cost["leave_one_out_s"] += time.perf_counter() - start
                rows.append(importance.example_scores(view.attention, {"gxi": view.grad_x_input, "loo": loo},
                                                      content))
    finally:
        model.train(was_training)
    return _result(names, indices, views, rows, head_rows, cost, special)


def _result(names, indices, views, rows, head_rows, cost, special=frozenset()) -> dict[str, Any]:
    out: dict[str, Any] = {"examples": len(indices), "indices": indices,
                           "attention_visible": any(v.attention is not None for v in views),
                           "cost_s": {k: round(v, 3) for k, v in cost.items()}}
    if "importance" in names:
        out["importance"] = importance.summarise(rows)
    if "seeds" in names:
        out["seeds"] = seeds.run_arrays(views, special)
    if "heads" in names:
        out["heads"] = heads.summarise(head_rows, [len(v.input_ids) for v in views if v.attention])
    return out
