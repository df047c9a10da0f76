"""The method check's rules for the output `attention()` returns (see suite.api.testing for the whole check): its
structure and shape, where each element sits in transformers' (B, L, H, d) layout (read from how noise on one head's
values and on one position's queries moves the output), and value channels that reach the output."""
from __future__ import annotations

import dataclasses

import torch

from suite.api.attention import AttentionMethod, attention_modules
from suite.api.check_common import ROWS, CheckResult, attached, checked_batch, forward, rows
from suite.api.layers import local_window
from suite.api.tiny_models import seed_cpu

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_shape", "check_values"]

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
            seed_cpu(3)
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
            if name == "rows with real tokens" and any(local_window(m) is not None for m in attention_modules(model)):
                return _raised(exc, name) + (": in a local layer a padded query's window may hold no real key, a "
                                             "row with no key that must work like any other")
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
