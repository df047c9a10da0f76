"""The method check's rules for how a method meets the runner (see suite.api.testing for the whole check): the
output layout `attention()` returns, deterministic evaluation, parameters `prepare()` adds on the model's device, and
the training hooks run as the runner runs them, with records that can be written as JSON."""
from __future__ import annotations

import json

import torch

from suite.api.attention import AttentionMethod, StepContext
from suite.api.check_common import CheckResult, attached, checked_batch, forward, max_diff
from suite.api.tiny_models import tiny_model

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_deterministic", "check_hooks", "check_prepare_device", "check_shape"]


def _recording_attention(method: AttentionMethod, calls: list):
    """Wraps the method's `attention` (on the instance) so that each call's query, value and result are kept."""
    original = method.attention

    def recording(module, query, key, value, *args, **kwargs):
        result = original(module, query, key, value, *args, **kwargs)
        calls.append((tuple(query.shape), tuple(value.shape), result))
        return result

    method.attention = recording
    return original


def _shape_problem(query: tuple, value: tuple, result) -> str | None:
    if not (isinstance(result, tuple) and len(result) == 2):
        kind = type(result).__name__ + (f" of {len(result)}" if isinstance(result, (tuple, list)) else "")
        return f"attention() returned a {kind}; it must return (output, probabilities) (suite.attend does)"
    out = result[0]
    b, h, length, _ = query
    expected = (b, length, h, value[-1])
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got == expected:
        return None
    return (f"attention() returned an output of shape {got} for queries of shape (B, H, L, d) = {query}; "
            f"transformers expects (B, L, H, d) = {expected} (suite.attend returns that layout; a (B, H, L, d) "
            "output needs .transpose(1, 2))")


def check_shape(method: AttentionMethod, kind: str) -> CheckResult:
    """`attention()` returns (output, probabilities) with the output in the (B, L, H, d) layout, train and eval."""
    model = attached(method, kind)
    calls: list = []
    _recording_attention(method, calls)
    try:
        for mode in ("train", "eval"):
            model.train(mode == "train")
            for padded in (True, False):
                ids, mask, labels = checked_batch(model, padded=padded)
                failure = None
                try:
                    with torch.no_grad():
                        forward(model, ids, mask, labels)
                except Exception as exc:  # noqa: BLE001  a wrong shape makes transformers fail after the call
                    failure = exc
                for query, value, result in calls:
                    problem = _shape_problem(query, value, result)
                    if problem:
                        return CheckResult("shape", f"{kind}, {mode}", False, problem)
                if failure is not None:
                    raise failure
                if not calls:
                    return CheckResult("shape", kind, False, "the method's attention() was never called")
                calls.clear()
    finally:
        del method.attention  # the class's own again
    return CheckResult("shape", kind, True, "returns (output, probabilities), output (B, L, H, d)")


def check_deterministic(method: AttentionMethod, kind: str) -> CheckResult:
    """In eval mode two passes over the same batch, under different random seeds, give identical outputs."""
    model = attached(method, kind)
    model.eval()
    for padded in (True, False):
        ids, mask, labels = checked_batch(model, padded=padded)
        valid = mask.bool()
        with torch.no_grad():
            first, _ = forward(model, ids, mask, labels, seed=0)
            second, _ = forward(model, ids, mask, labels, seed=1)
        diff = max(max_diff(first.hidden_states[-1][valid], second.hidden_states[-1][valid]),
                   max_diff(first.logits, second.logits))
        if diff != 0.0:
            return CheckResult("eval", f"{kind}, {'padded' if padded else 'unpadded'}", False,
                               f"two eval-mode passes over the same batch differ by {diff:.2e}: the method samples "
                               "(dropout, random rates) in evaluation; sample only when module.training (e.g. "
                               "suite.probs_dropout(p, rate, module))")
    return CheckResult("eval", kind, True, "eval mode is deterministic (same outputs under different seeds, padded "
                       "and unpadded)")


def check_prepare_device(method: AttentionMethod, kind: str) -> CheckResult:
    """Parameters and buffers added by `prepare()` sit on the model's device. The model sits on PyTorch's `meta`
    device, a stand-in for a GPU on any machine: a tensor created without the model's device lands on the CPU."""
    model = tiny_model(kind).to("meta")
    before = {n for n, _ in (*model.named_parameters(), *model.named_buffers())}
    method.attach(model)
    added = {n: t for n, t in (*model.named_parameters(), *model.named_buffers()) if n not in before}
    wrong = [f"{n} ({t.device})" for n, t in added.items() if t.device.type != "meta"]
    setting = f"{kind}, meta device"
    if wrong:
        return CheckResult("prepare", setting, False, f"prepare() created {', '.join(wrong[:3])} on a model that sits "
                           "on another device: create parameters on the model's device (e.g. like = "
                           "module.query.weight; torch.zeros(..., dtype=like.dtype, device=like.device))")
    if not added:
        return CheckResult("prepare", setting, None, "prepare() adds no parameters or buffers")
    return CheckResult("prepare", setting, True, f"the {len(added)} tensors prepare() adds follow the model's device")


def check_hooks(method: AttentionMethod, kind: str) -> CheckResult:
    """Two training steps through the hooks as the runner calls them (`setup_training`, `training_step`, which calls
    `aux_loss`), then `epoch_record()` and `record()`: the loss comes back detached and the records are JSON."""
    model = attached(method, kind)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ctx = StepContext(model, method, optimizer, scheduler, torch.device("cpu"), None, grad_clip=1.0, total_steps=2)
    method.setup_training(ctx)
    ids, mask, labels = checked_batch(model)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    for step in (1, 2):
        ctx.step = step
        loss = method.training_step(ctx, batch, batch if step == 1 else None)
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and not loss.requires_grad):
            return CheckResult("hooks", kind, False, f"training_step() returned {type(loss).__name__}"
                               f"{'' if not isinstance(loss, torch.Tensor) else f' {tuple(loss.shape)}'}"
                               f"{' that requires grad' if getattr(loss, 'requires_grad', False) else ''}: it must "
                               "return the step's loss as a detached scalar tensor (loss.detach())")
    for hook, facts in (("epoch_record()", method.epoch_record()), ("record()", method.record())):
        try:
            json.dumps(facts)  # NaN is allowed: the store writes it as null
        except (TypeError, ValueError) as exc:
            return CheckResult("hooks", kind, False, f"{hook} is not JSON ({exc}): return numbers, strings, lists "
                               "and dicts (float(t) or t.tolist() for a tensor), or the record cannot be written")
    extra = method.training_only_parameters()
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
        return CheckResult("hooks", kind, False, f"training_only_parameters() returned {extra!r}: it must be a "
                           "count (an int >= 0)")
    return CheckResult("hooks", kind, True, "two training steps through the hooks; records are JSON")
