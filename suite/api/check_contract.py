"""The method check's rules for how a method meets the runner (see suite.api.testing for the whole check):
parameters an optimizer holds, deterministic evaluation, parameters `prepare()` adds on the model's device, and the
training hooks run as the runner runs them, with records that can be written as JSON. The output's layout and value
channels are `suite.api.check_layout`'s."""
from __future__ import annotations

import json

import torch

from suite.api.attention import AttentionMethod, StepContext, attention_modules
from suite.api.check_common import (
    HIGH_RATES,
    CheckResult,
    accepted,
    attached,
    checked_batch,
    finite_diff,
    forward,
    fresh_model,
)
from suite.api.stochastic import stochastic_fields

TOLERANCE = 1e-5  # on outputs that must not change

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_deterministic", "check_hooks", "check_moved_model", "check_parameters", "check_prepare_device",
           "check_rate_free_eval", "check_trained"]

def check_deterministic(method: AttentionMethod, kind: str) -> CheckResult:
    """In eval mode two passes over the same batch, under different random seeds, give identical outputs (compared
    where both are finite: NaN and inf are the finite check's finding, not a difference)."""
    model = attached(method, kind)
    model.eval()
    non_finite = False
    for padded in (True, False):
        ids, mask, labels = checked_batch(model, padded=padded)
        valid = mask.bool()
        with torch.no_grad():
            first, _ = forward(model, ids, mask, labels, seed=0)
            second, _ = forward(model, ids, mask, labels, seed=1)
        (d_out, nf_out), (d_logits, nf_logits) = (finite_diff(first.hidden_states[-1][valid],
                                                              second.hidden_states[-1][valid]),
                                                  finite_diff(first.logits, second.logits))
        non_finite = non_finite or nf_out or nf_logits
        diff = max(d_out, d_logits)
        if diff != 0.0:
            return CheckResult("eval", f"{kind}, {'padded' if padded else 'unpadded'}", False,
                               f"two eval-mode passes over the same batch differ by {diff:.2e}: the method samples "
                               "(dropout, random rates) in evaluation; sample only when module.training (e.g. "
                               "suite.probs_dropout(p, rate, module))")
    return CheckResult("eval", kind, True, "eval mode is deterministic (same outputs under different seeds, padded "
                       "and unpadded)" + ("; compared where finite (see the finite check)" if non_finite else ""))


def check_rate_free_eval(cls: type[AttentionMethod], hparams: dict, kind: str) -> CheckResult:
    """Evaluation does not depend on any rate: the eval-mode outputs at this configuration equal those with each
    stochastic parameter (declared, or p, p_*) alone set to 0 and to a high value. Dropout left on in evaluation
    through a generator of the method's own, re-seeded at every call, gives the same outputs in every pass (so the
    eval check cannot see it) but not at another rate."""
    setting = f"{kind}, eval, rates"
    ids, mask, labels = checked_batch(fresh_model(kind))
    valid = mask.bool()

    def outputs(values: dict) -> torch.Tensor:
        model = attached(cls(cls.Config(**values)), kind)
        model.eval()
        with torch.no_grad():
            out, _ = forward(model, ids, mask, labels)
        return torch.cat([out.hidden_states[-1][valid].flatten(), out.logits.flatten()])

    reference = outputs(hparams)
    compared = []
    for declared in stochastic_fields(cls):
        name = declared.field
        current = getattr(cls.Config(**hparams), name)
        if not isinstance(current, (int, float)):
            continue
        for rate in (0.0, *(HIGH_RATES if declared.kind == "rate" else (max(1.0, 4 * current),))):
            values = {**hparams, name: rate}
            if rate == current or not accepted(cls, values):
                continue
            diff, _ = finite_diff(reference, outputs(values))
            if diff > TOLERANCE:
                return CheckResult("eval", setting, False, f"eval-mode outputs change by {diff:.2e} when {name} "
                                   f"goes from {current} to {rate}: evaluation depends on a rate, so dropout is left "
                                   "on in eval mode (a generator of the method's own, re-seeded at every call, draws "
                                   "the same mask in every pass); sample only when module.training")
            compared.append(f"{name}={rate}")
            if rate > 0:
                break  # the highest rate the method accepts
    if not compared:
        return CheckResult("eval", setting, None, "no stochastic parameter (declared, or p, p_*) to vary")
    return CheckResult("eval", setting, True, f"eval-mode outputs unchanged at {', '.join(compared)}")


def _plain_tensors(method: AttentionMethod, model) -> list[str]:
    """Tensors of more than one element kept as plain attributes (no parameter, no buffer) on the method or on the
    attention modules, outside PyTorch's meta device: `model.to(device)` leaves them where they are."""
    found = [(f"method.{n}", t) for n, t in vars(method).items() if isinstance(t, torch.Tensor)]
    for module in attention_modules(model):
        found += [(f"module.{n}", t) for n, t in vars(module).items() if isinstance(t, torch.Tensor)]
    return [f"{n} ({t.device})" for n, t in found if t.device.type != "meta" and t.numel() > 1]


def check_moved_model(method: AttentionMethod, kind: str, modes: tuple[str, ...] = ("eval", "train")) -> CheckResult:
    """A model the method is attached to, then moved to another device (PyTorch's `meta`, a stand-in for a GPU), runs
    in each of `modes`: a tensor the method keeps as a plain attribute stays on the CPU when the model moves, and
    one created without a device in `attention()` is made on the CPU; either fails on a GPU. Where a mode cannot run
    on `meta` at all (a device generator, autocast on `meta`), the plain tensor attributes are listed instead."""
    model = attached(method, kind).to("meta")
    ids, mask, _ = checked_batch(model)
    setting = f"{kind}, moved to meta"
    ran, not_run = [], []
    for mode in modes:
        model.train(mode == "train")
        try:
            with torch.no_grad():
                model(input_ids=ids.to("meta"), attention_mask=mask.to("meta"))
        except RuntimeError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "device" in first and "cpu" in first:
                kept = _plain_tensors(method, model)
                return CheckResult("device", setting, False, f"{mode} mode on a model moved to another device "
                                   f"raised: {first}" + (f"; kept as plain attributes: {', '.join(kept[:3])}"
                                                         if kept else "") + ". model.to(device) moves parameters and "
                                   "buffers only: register a tensor the method keeps (module.register_buffer), and "
                                   "create tensors inside attention() on query.device")
            not_run.append(f"{mode} ({first})")
            continue
        ran.append(mode)
    if not not_run:
        return CheckResult("device", setting, True, f"{' and '.join(ran)} passes run after the model moved to "
                           "another device")
    kept = _plain_tensors(method, model)
    if kept:
        return CheckResult("device", setting, None, f"not judged: cannot run on the meta device in "
                           f"{', '.join(not_run)}; plain tensor attributes that model.to() leaves on the CPU: "
                           f"{', '.join(kept[:3])}")
    return CheckResult("device", setting, True, (f"{' and '.join(ran)} ran after the model moved to another device; "
                       if ran else "") + f"no tensor kept as a plain attribute (cannot run on the meta device in "
                       f"{', '.join(not_run)})")


def check_prepare_device(method: AttentionMethod, kind: str) -> CheckResult:
    """Parameters and buffers added by `prepare()` sit on the model's device. The model sits on PyTorch's `meta`
    device, a stand-in for a GPU on any machine: a tensor created without the model's device lands on the CPU."""
    model = fresh_model(kind).to("meta")
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


def _gradient_leaves(loss: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every tensor the loss's gradient accumulates into (the leaves of its autograd graph), by id."""
    leaves: dict[int, torch.Tensor] = {}
    seen, stack = set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # AccumulateGrad nodes hold the leaf
        if variable is not None:
            leaves[id(variable)] = variable
        stack.extend(f for f, _ in fn.next_functions)
    return leaves


def _own_optimizers(obj, depth: int = 2) -> list[torch.optim.Optimizer]:
    """Optimizers a method keeps for networks of its own (a policy trained by its own updates), found among its
    attributes and theirs."""
    found = []
    for value in vars(obj).values():
        if isinstance(value, torch.optim.Optimizer):
            found.append(value)
        elif depth > 1 and hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, torch.Tensor, type)):
            found.extend(_own_optimizers(value, depth - 1))
    return found


def _kept(model, method) -> dict[int, str]:
    """Tensors that outlive a step, by id: the model's parameters and the tensors kept on the method or on the
    attention modules (a detached copy made inside one forward to take a gradient of its own is no parameter)."""
    known = {id(t): f"method.{n}" for n, t in vars(method).items() if isinstance(t, torch.Tensor)}
    for module in attention_modules(model):
        known.update({id(t): f"attention module's {n}" for n, t in vars(module).items() if isinstance(t, torch.Tensor)})
    known.update({id(t): n for n, t in model.named_parameters()})
    return known


def _names(known: dict[int, str], tensors: list[torch.Tensor]) -> str:
    return ", ".join(known.get(id(t), f"a {tuple(t.shape)} parameter") for t in tensors[:3]) + (
        f" and {len(tensors) - 3} more" if len(tensors) > 3 else "")


def check_parameters(method: AttentionMethod, kind: str) -> CheckResult:
    """Every tensor a training step's gradient reaches is held by an optimizer: the runner builds its optimizer from
    the model's parameters once `prepare()` has run, so a parameter made later (lazily inside `attention()`, or in
    `setup_training()`) or kept outside the model never trains."""
    model = attached(method, kind)
    named = dict(model.named_parameters())
    optimizer = torch.optim.AdamW([p for p in named.values() if p.requires_grad], lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    method.setup_training(StepContext(model, method, optimizer, scheduler, torch.device("cpu"), None, grad_clip=1.0,
                                      total_steps=1, step=1))
    in_setup = [n for n, _ in model.named_parameters() if n not in named]
    model.train()
    _, loss = forward(model, *checked_batch(model))
    leaves = _gradient_leaves(loss)
    in_forward = [n for n, _ in model.named_parameters() if n not in named and n not in in_setup]
    held = {id(p) for o in (optimizer, *_own_optimizers(method)) for g in o.param_groups for p in g["params"]}
    kept = _kept(model, method)
    stray = [t for i, t in leaves.items() if i not in held and (i in kept or isinstance(t, torch.nn.Parameter))]
    setting = f"{kind}, train"
    if in_forward:
        return CheckResult("params", setting, False, f"the forward pass created parameters ({', '.join(in_forward[:3])}"
                           "): the optimizer is built from the model's parameters after prepare() and never holds "
                           "them, so they never train; create them in prepare()")
    if in_setup:
        return CheckResult("params", setting, False, f"setup_training() added parameters ({', '.join(in_setup[:3])}) "
                           "after the optimizer was built: it never holds them; create them in prepare()")
    if stray:
        return CheckResult("params", setting, False, f"the loss's gradient reaches {len(stray)} "
                           f"tensor{'s' if len(stray) > 1 else ''} that no optimizer holds "
                           f"({_names(kept, stray)}): they never train. Register them on the attention "
                           "modules in prepare() (module.register_parameter), or train them with an optimizer of the "
                           "method's own built in setup_training()")
    return CheckResult("params", setting, True, f"every tensor the gradient reaches ({len(leaves)}) is held by an "
                       "optimizer; no parameter appears after prepare()")


def check_trained(method: AttentionMethod, kind: str) -> CheckResult:
    """Every parameter `prepare()` adds receives a gradient from a training step's loss (the task loss and
    `aux_loss`), unless it is frozen (requires_grad=False) or named in the method's `frozen_parameters`: a learned
    parameter whose gradient never arrives (used through .detach() or .data, or not used at all) keeps its initial
    value while the run reports it as learned."""
    before = {n for n, _ in fresh_model(kind).named_parameters()}
    model = attached(method, kind)
    frozen = set(type(method).frozen_parameters)
    added = {n: p for n, p in model.named_parameters() if n not in before}
    learned = {n: p for n, p in added.items() if p.requires_grad and n.rsplit(".", 1)[-1] not in frozen}
    setting = f"{kind}, train"
    if not learned:
        return CheckResult("trained", setting, None, "prepare() adds no learned parameters" if not added else
                           f"the {len(added)} parameters prepare() adds are frozen")
    model.train()
    _, loss = forward(model, *checked_batch(model))
    aux = method.aux_loss(model)
    (loss if aux is None else loss + aux).backward()
    dead = [n for n, p in learned.items() if p.grad is None or not bool(p.grad.ne(0).any())]
    if dead:
        return CheckResult("trained", setting, False, f"{len(dead)} of the {len(learned)} parameters prepare() adds "
                           f"receive no gradient ({', '.join(dead[:3])}): they never train. Use them in the forward "
                           "without .detach() or .data, or declare them in frozen_parameters (or requires_grad=False) "
                           "if they are not meant to learn")
    return CheckResult("trained", setting, True, f"all {len(learned)} parameters prepare() adds receive a gradient")


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
        method.before_step(ctx)
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
