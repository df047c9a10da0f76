"""The method check's rules for how a method meets the runner (see suite.api.testing for the whole check): the
output layout `attention()` returns (its shape and where each element sits), value channels that reach the output,
parameters an optimizer holds, deterministic evaluation, parameters `prepare()` adds on the model's device, and the
training hooks run as the runner runs them, with records that can be written as JSON."""
from __future__ import annotations

import dataclasses
import json

import torch

from suite.api.attention import AttentionMethod, StepContext, attention_modules
from suite.api.check_common import ROWS, CheckResult, attached, checked_batch, finite_diff, forward, rows
from suite.api.tiny_models import tiny_model

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_deterministic", "check_hooks", "check_parameters", "check_prepare_device", "check_shape",
           "check_values"]


def _recording_attention(method: AttentionMethod, calls: list):
    """Wraps the method's `attention` (on the instance) so that each call's query, value and result are kept."""
    original = method.attention

    def recording(module, query, key, value, *args, **kwargs):
        result = original(module, query, key, value, *args, **kwargs)
        calls.append((tuple(query.shape), tuple(value.shape), result))
        return result

    method.attention = recording
    return original


def _structure_problem(query: tuple, value: tuple, result) -> str | None:
    if not (isinstance(result, tuple) and len(result) == 2):
        kind = type(result).__name__ + (f" of {len(result)}" if isinstance(result, (tuple, list)) else "")
        return f"attention() returned a {kind}; it must return (output, probabilities) (suite.attend does)"
    if not isinstance(result[0], torch.Tensor):
        return f"attention() returned an output of type {type(result[0]).__name__}; it must be a tensor"
    return None


def _expected(query: tuple, value: tuple) -> tuple:
    b, h, length, _ = query
    return (b, length, h, value[-1])


def _first_problem(model, calls: list) -> tuple[str, str, tuple | None] | None:
    """(mode, problem, (query, value, output shape) when the output's shape is wrong) for the first call, over train
    and eval mode, padded and unpadded batches, whose result is not (output, probabilities) in (B, L, H, d)."""
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
                problem = _structure_problem(query, value, result)
                if problem:
                    return mode, problem, None
                if tuple(result[0].shape) != _expected(query, value):
                    return mode, "shape", (query, value, tuple(result[0].shape))
            if failure is not None:
                return mode, _raised_on(model, (ids, mask, labels), failure) if padded else _raised(failure), None
            if not calls:
                return mode, "the method's attention() was never called", None
            calls.clear()
    return None


@dataclasses.dataclass
class Response:
    """One attention call of an eval pass over the padded checked batch: the shapes, the output, and how the output
    changed with noise on one head's value vectors (("head", h)), on one channel of every head's value vectors
    (("channel", c)), both at real keys only, or on the queries at one position (("position", l))."""
    query: tuple
    value: tuple
    output: torch.Tensor
    real_query: torch.Tensor  # (B, L) bool
    changes: dict | None  # None: the method gives different outputs for the same inputs


def value_responses(method: AttentionMethod, model) -> list[Response]:
    """Calls the method's attention() again inside one eval-mode forward, once per head and once per channel with
    noise on that part of the values, once per position with noise on its queries, and keeps how the output
    changed."""
    ids, mask, labels = checked_batch(model)
    real = mask.bool()
    found: list[Response] = []
    original = method.attention

    def responding(module, query, key, value, *args, **kwargs):
        result = original(module, query, key, value, *args, **kwargs)
        if _structure_problem(tuple(query.shape), tuple(value.shape), result) is None:
            found.append(Response(tuple(query.shape), tuple(value.shape), result[0].detach(), real,
                                  _changes(original, (module, query, key, value, *args), kwargs, real)))
        return result

    method.attention = responding
    model.eval()
    try:
        with torch.no_grad():
            forward(model, ids, mask, labels)
    except Exception:  # noqa: BLE001  a wrong layout may make transformers fail after the calls it recorded
        pass
    finally:
        del method.attention
    return found


def _changes(attention, args: tuple, kwargs: dict, real: torch.Tensor) -> dict | None:
    """How the output changes with noise on one head's values, one channel of the values (real keys only) and the
    queries at one position, each alone: {(part, index): change in the output's own shape}. Every call draws the
    same random numbers; None when two calls on the same inputs still differ (the eval check says why)."""
    query, value = args[1], args[3]

    def call(*moved) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(3)
            return attention(*moved, **kwargs)[0].detach().float()

    output = call(*args)
    if not torch.equal(output.nan_to_num(), call(*args).nan_to_num()):
        return None
    at_real_keys = real[:, None, :, None].to(value.dtype)
    g = torch.Generator().manual_seed(2)
    changes = {}
    for part, count in (("head", value.shape[1]), ("channel", value.shape[-1]), ("position", query.shape[2])):
        for i in range(count):
            where = {"head": (slice(None), i), "channel": (..., i), "position": (slice(None), slice(None), i)}[part]
            tensor = query if part == "position" else value
            noise = torch.zeros_like(tensor)
            noise[where] = torch.randn(noise[where].shape, generator=g).to(tensor)
            moved = (*args[:1], query + noise, *args[2:]) if part == "position" else (
                *args[:3], value + noise * at_real_keys, *args[4:])
            changes[(part, i)] = torch.nan_to_num(call(*moved) - output, 0.0, 0.0, 0.0)
    return changes


LEAK_TOLERANCE = 1e-5


def _leaks(response: Response, arrange) -> dict[str, tuple[float, str]]:
    """For the output read in the (B, L, H, d) layout by `arrange`: per kind of noise ("values": one head or one
    channel; "queries": one position), the largest change outside the part that changed, relative to the largest
    inside it, and which noise gave it. A query's noise may change its own position's outputs only; a value's noise
    its own head and channel (a norm over the heads, as ReLA's, couples them: the queries then decide)."""
    found = {"values": (0.0, ""), "queries": (0.0, "")}
    for (part, i), change in response.changes.items():
        c = arrange(change).abs()
        inside = torch.zeros_like(c, dtype=torch.bool)
        inside[{"head": (slice(None), slice(None), i), "channel": (..., i), "position": (slice(None), i)}[part]] = True
        leak = float(c[~inside].max()) / max(float(c[inside].max()), 1e-12) if c.numel() else 0.0
        kind = "queries" if part == "position" else "values"
        if leak > found[kind][0]:
            found[kind] = (leak, f"the {'queries at position' if part == 'position' else 'values of ' + part} {i}")
    return found


def _misplaced(response: Response, arrange) -> str | None:
    """None when the output read by `arrange` keeps changes in their place; else which noise moved elsewhere. A
    scrambled layout moves both: a value's noise into other heads and a query's noise into other positions. Either
    alone can be the method's own doing (a norm over the heads, as ReLA's; a normalisation over the queries, as a
    Sinkhorn method's), so the queries are read only where the method reads them."""
    leaks = _leaks(response, arrange)
    uses_queries = any(float(c.abs().max()) > 0 for (part, _), c in response.changes.items() if part == "position")
    (value_leak, value_where), (query_leak, query_where) = leaks["values"], leaks["queries"]
    if value_leak <= LEAK_TOLERANCE or (uses_queries and query_leak <= LEAK_TOLERANCE):
        return None
    return f"noise on {value_where} changed other heads' or channels' outputs" + (
        f", noise on {query_where} outputs at other positions" if uses_queries else "")


def layout_problem(response: Response) -> str | None:
    """None when the output has the (B, L, H, d) shape and each position's and head's output sits where that layout
    puts it; otherwise what the output is, as far as reading it in the candidate layouts tells."""
    b, h, length, _ = response.query
    d = response.value[-1]
    expected, got = (b, length, h, d), tuple(response.output.shape)
    if response.changes is None or response.output.numel() != b * length * h * d:
        return None  # not judged (the eval check says why), or no reading fits (the shape message says it)
    as_is = _misplaced(response, lambda t: t.reshape(expected))
    if as_is is None:
        if got == expected:
            return None
        return (f"attention() returned an output of shape {got}; transformers expects (B, L, H, d) = {expected}. "
                "Its elements are in (B, L, H, d) order: reshape it to that shape")
    heads_first = _misplaced(response, lambda t: t.reshape(b, h, length, d).transpose(1, 2)) is None
    if heads_first and got == (b, h, length, d):
        return (f"attention() returned an output of shape {got} for queries of shape (B, H, L, d) = "
                f"{response.query}: it is in the (B, H, L, d) layout; transformers expects (B, L, H, d) = {expected} "
                "(suite.attend returns that layout): a (B, H, L, d) output needs .transpose(1, 2)")
    if heads_first:
        return (f"attention() returned an output of shape {got} whose elements are a (B, H, L, d) result reshaped "
                f"(.view/.reshape) without moving its axes, so heads and positions are mixed up ({as_is}). Swap "
                "the axes with .transpose(1, 2) before reshaping (suite.attend does)")
    return (f"attention() returned an output of shape {got} whose elements are in no (B, L, H, d) order, nor a "
            f"reshaped (B, H, L, d) one: {as_is}. Each position's output must sit at its own position, each "
            "head's at its own head (a .view/.reshape that mixes axes?)")


def _dead_channels(call: Response) -> dict[int, list[int]]:
    """{head: value channels that changed none of that head's outputs at real queries}."""
    dead = {}
    for head in range(call.value[1]):
        change = call.changes[("head", head)].reshape(_expected(call.query, call.value))[:, :, head]
        reached = change[call.real_query].abs().amax(dim=0) > 1e-6  # (d,)
        if not reached.all():
            dead[head] = (~reached).nonzero().flatten().tolist()
    return dead


def check_values(method: AttentionMethod, kind: str) -> CheckResult:
    """Every value channel of every head reaches that head's output: noise on one head's value vectors (at real keys)
    changes each of its d output channels at some real query, in eval mode. A method that drops value channels
    (a slice of the head dimension, a mask left on) fails, with or without an identity setting."""
    model = attached(method, kind)
    calls = value_responses(method, model)
    judged = [c for c in calls if c.changes is not None and torch.isfinite(c.output[c.real_query]).all()]
    if not judged:
        return CheckResult("values", kind, None, "not judged: " + (
            "attention() returned no output to read" if not calls else "the outputs are not finite (see the finite "
            "check) or differ between calls on the same inputs (see the eval check)"))
    dead = {(layer, head): channels for layer, call in enumerate(judged)
            for head, channels in _dead_channels(call).items()}
    if dead:
        (layer, head), channels = next(iter(dead.items()))
        return CheckResult("values", kind, False, f"value channels never reach the output: {len(dead)} heads lose "
                           f"{sum(map(len, dead.values()))} of their value channels (e.g. layer {layer}, head {head}: "
                           f"channels {channels}); the attention output did not change when only those channels of "
                           "the values changed. Every channel of each head's values must reach its output (is a "
                           "slice or mask of the head dimension left on?)")
    return CheckResult("values", kind, True, f"all {judged[0].value[-1]} value channels of every head reach its "
                       f"output ({len(judged)} layers, eval mode)")


def _raised(exc: Exception, rows_name: str = "") -> str:
    return f"the model raised {type(exc).__name__}: {exc}" + (f" on {rows_name} (run alone)" if rows_name else "")


def _raised_on(model, batch: tuple, failure: Exception) -> str:
    """The exception a forward over the padded batch raised, with the rows that raise it when run alone."""
    for name, which in ROWS.items():
        try:
            with torch.no_grad():
                forward(model, *rows(batch, which))
        except Exception as exc:  # noqa: BLE001  the finding
            return _raised(exc, name) + ("" if name == "rows with real tokens" else
                                         ": a row with no or one real key must work like any other")
    return _raised(failure)


def check_shape(method: AttentionMethod, kind: str) -> CheckResult:
    """`attention()` returns (output, probabilities) with the output in the (B, L, H, d) layout, train and eval: the
    right shape, and each output where (B, L, H, d) puts it (see `_misplaced`). A .view/.reshape of a (B, H, L, d)
    result has the right shape and mixes heads and positions. When the layout is wrong the message says which layout
    the output is in, as far as reading it in the candidate layouts shows."""
    model = attached(method, kind)
    calls: list = []
    _recording_attention(method, calls)
    try:
        found = _first_problem(model, calls)
    finally:
        del method.attention  # the class's own again
    if found is not None and found[2] is None:
        return CheckResult("shape", f"{kind}, {found[0]}", False, found[1])
    for call in value_responses(method, model):
        problem = layout_problem(call)
        if problem:
            return CheckResult("shape", f"{kind}, eval", False, problem)
    if found is not None:
        (query, _, got), expected = found[2], _expected(*found[2][:2])
        return CheckResult("shape", f"{kind}, {found[0]}", False, f"attention() returned an output of shape {got} "
                           f"for queries of shape (B, H, L, d) = {query}; transformers expects (B, L, H, d) = "
                           f"{expected} (suite.attend returns that layout)")
    return CheckResult("shape", kind, True, "returns (output, probabilities), output (B, L, H, d), each head's "
                       "output in its place")


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
