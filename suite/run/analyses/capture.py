"""One pass over one dev example: every layer's attention, the prediction, and the input-importance scores.

Examples are processed one at a time and unpadded (exact attention rows, no padding to reason about). The target
whose importance is measured is the model's output for its own prediction: the log-probability of the predicted
class (classification) or the predicted value (regression).
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from suite.api.attention import probes

# what the rest of the suite uses; other names are this module's own
__all__ = ["ExampleView", "capture_example", "leave_one_out"]


@dataclasses.dataclass
class ExampleView:
    input_ids: list[int]
    attention: list[torch.Tensor] | None   # per layer (H, L, L) float32 on the CPU; None if the method hides it
    prediction: list[float]                # class probabilities, or [value] for regression
    target: float                          # the scalar whose importance is measured
    grad_x_input: torch.Tensor | None      # (L,) |sum_d grad * embedding| per token, when asked for


def _inputs(feature: dict, device) -> dict:
    return {k: torch.tensor([v], device=device) for k, v in feature.items()}


def _target(logits: torch.Tensor, regression: bool, label: int | None = None) -> tuple[torch.Tensor, int | None]:
    """(scalar target per row, the class it follows): log p(predicted class) or the regression output."""
    logits = logits.float()
    if regression:
        return logits[:, 0], None
    logp = torch.log_softmax(logits, -1)
    label = int(logp[0].argmax()) if label is None else label
    return logp[:, label], label


@contextlib.contextmanager
def _embedding_grads(model, keep: list):
    """Keeps the word embeddings' output (with its gradient) of the next forward pass."""

    def hook(module, args, out):
        out.retain_grad()
        keep.append(out)

    handle = model.get_input_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def capture_example(model, feature: dict, regression: bool, device, autocast, with_gradients: bool) -> ExampleView:
    """The example's attention maps, prediction, target and (optionally) gradient x input, in eval mode."""
    layers: dict[int, torch.Tensor] = {}

    def probe(module, probs):
        layers[module.layer_idx] = probs.detach()[0].float().cpu()

    kept: list[torch.Tensor] = []
    grads = _embedding_grads(model, kept) if with_gradients else contextlib.nullcontext()
    with torch.set_grad_enabled(with_gradients), probes(model, probe), grads, autocast:
        logits = model(**_inputs(feature, device)).logits
    target, _ = _target(logits, regression)
    gxi = None
    if with_gradients:
        model.zero_grad(set_to_none=True)
        target.sum().backward()
        emb = kept[0]
        gxi = (emb.grad.float() * emb.float()).sum(-1)[0].abs().detach().cpu()
        model.zero_grad(set_to_none=True)
    prediction = logits[0].float().tolist() if regression else torch.softmax(logits[0].float(), -1).tolist()
    attention = [layers[i] for i in sorted(layers)] if layers else None
    return ExampleView(list(feature["input_ids"]), attention, prediction, float(target.detach()), gxi)


@torch.no_grad()
def leave_one_out(model, feature: dict, positions: list[int], regression: bool, device, autocast) -> torch.Tensor:
    """|target(full) - target(without token i)| for each i in `positions`, the target following the full input's
    predicted class. One forward pass over a batch with one row per removed token."""
    full = _inputs(feature, device)
    with autocast:
        base, label = _target(model(**full).logits, regression)
    if not positions:
        return torch.zeros(0)
    rows = {k: torch.stack([torch.cat([v[0, :i], v[0, i + 1:]]) for i in positions]) for k, v in full.items()}
    with autocast:
        reduced, _ = _target(model(**rows).logits, regression, label)
    return (base - reduced).abs().float().cpu()
