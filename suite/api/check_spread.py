"""The method check's rules on a tiny model whose attention scores have a pre-trained model's spread (see
suite.api.testing for the whole check): the identity rule, where a random init's scores near 0 would hide a doubled
or missing scaling, and an fp16 pass, where a softmax computed in fp16 overflows (exp(s) passes fp16's 65504 at
s = 11.1; pre-trained scores reach 30 and beyond)."""
from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F

from suite.api.attention import AttentionMethod, attention_modules
from suite.api.check_common import (
    ROWS,
    BuiltOnce,
    CheckResult,
    checked_batch,
    forward,
    gradients,
    max_diff,
    pass_seeds,
    repeat_twin,
    rows,
)
from suite.api.tiny_models import tiny_model

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_fp16", "check_identity"]

# the largest |score| each layer of the spread model reaches on the checked batch: the 99.9th percentile of |q k^T
# d^-0.5| in MiniLM-L6-H384's first layer on SST-2 and RTE dev sentences is 30.3 (its largest 55.5; other layers'
# largest 10-24), lab/check/minilm.json
PRETRAINED_SCORES = 30.0
# the standard deviation of those scores in MiniLM's first layer (the widest; 1.4-2.9 in the others), same file: the
# identity rule's spread, where rows are neither flat (a random init's) nor one-hot (a scaling change would not show)
PRETRAINED_STD = 3.85
# per precision: an attention call's output against SDPA's in fp32 on the same inputs (relative to its largest), the
# final real outputs and the gradients (relative to the largest, at least 1) against the model with SDPA. Under
# autocast, 4 units of the half type's rounding (its eps: 7.8e-3 bf16, 9.8e-4 fp16): the built-ins reach at most
# 8.2e-3 / 3.2e-4 / 9.8e-4 (bf16) and 1.3e-3 / 3.5e-5 / 5.9e-4 (fp16) on the three models, 2.3e-7 / 4.8e-7 / 1.0e-7
# in fp32
HALF_ROUNDING = 4
TOLERANCE = {"fp32": {"attention": 1e-5, "outputs": 1e-5, "gradients": 1e-4},
             **{name: dict.fromkeys(("attention", "outputs", "gradients"), HALF_ROUNDING * torch.finfo(dtype).eps)
                for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16))}}
FP16_SEEDS = range(2)  # an overflow at these scores does not wait for a rare draw
SPREAD_PROBE = "suite_spread_probe"  # the attention implementation that measures the scores, then runs SDPA


def _score_spread(model, batch: tuple, statistic: str) -> list[float]:
    """Per layer, the largest |q k^T * scaling| ("max") or its standard deviation ("std") over real query-key pairs
    of `batch` (an eval pass), read from the queries and keys the attention interface receives (after ModernBERT's
    rotary positions)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    found: dict[int, float] = {}
    real = batch[1].bool()
    pairs = (real[:, None, :, None] & real[:, None, None, :])
    layers = {id(m): i for i, m in enumerate(attention_modules(model))}

    def record(module, query, key, value, attention_mask, scaling=None, **kwargs):
        s = (query @ key.transpose(-1, -2)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
        real_scores = s[pairs.expand_as(s)]
        found[layers[id(module)]] = float(real_scores.abs().max() if statistic == "max" else real_scores.std())
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register(SPREAD_PROBE, record)
    AttentionMaskInterface.register(SPREAD_PROBE, sdpa_mask)
    before = model.config._attn_implementation
    model.set_attn_implementation(SPREAD_PROBE)
    model.eval()
    try:
        with torch.no_grad():
            forward(model, *batch)
    finally:
        model.set_attn_implementation(before)
    return [found[i] for i in sorted(found)]


def _query_key_parameters(module) -> list[torch.Tensor]:
    """The weights and biases that make a layer's queries and keys (ModernBERT's fused projection: its first two
    thirds)."""
    if hasattr(module, "Wqkv"):
        rows = 2 * module.Wqkv.out_features // 3
        return [p[:rows] for p in module.Wqkv.parameters()]
    return [*module.query.parameters(), *module.key.parameters()]


def spread_model(kind: str, statistic: str = "max"):
    """A tiny random-init model (SDPA attention) whose query and key projections are scaled, layer by layer, so that
    each layer's real scores on the checked batch reach PRETRAINED_SCORES ("max") or spread with MiniLM's standard
    deviation, PRETRAINED_STD ("std"): a copy of one built once per process, the CPU's generator left as the build
    left it."""
    return _spread(kind, statistic)


def _spread_built(kind: str, statistic: str):
    model = tiny_model(kind)
    batch = checked_batch(model)
    target = PRETRAINED_SCORES if statistic == "max" else PRETRAINED_STD
    for layer, module in enumerate(attention_modules(model)):
        factor = math.sqrt(target / _score_spread(model, batch, statistic)[layer])
        with torch.no_grad():
            for p in _query_key_parameters(module):
                p.mul_(factor)
    return model


_spread = BuiltOnce(_spread_built)


@contextlib.contextmanager
def _sdpa_gaps(model, real: torch.Tensor, gaps: list[float]):
    """While active, every attention call of `model`'s method is compared with SDPA on the same queries, keys and
    values, computed in fp32 (under autocast the method's own rounding is what the tolerance allows): the largest
    difference at real queries, relative to SDPA's largest output, is appended to `gaps`."""
    method = attention_modules(model)[0].suite_method
    original = method.attention

    def compared(module, query, key, value, attention_mask, scaling, **kwargs):
        result = original(module, query, key, value, attention_mask, scaling, **kwargs)
        keep = None if attention_mask is None else attention_mask == 0
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            expected = F.scaled_dot_product_attention(query.float(), key.float(), value.float(), attn_mask=keep,
                                                      scale=scaling).transpose(1, 2)
            if isinstance(result, tuple) and result[0].shape == expected.shape:
                gaps.append(max_diff(result[0][real], expected[real]) / max(float(expected[real].abs().max()), 1e-12))
        return result

    method.attention = compared
    try:
        yield
    finally:
        del method.attention


def _autocast(precision: str):
    return (contextlib.nullcontext() if precision == "fp32" else
            torch.autocast("cpu", dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[precision]))


def check_identity(cls: type[AttentionMethod], kind: str) -> CheckResult:
    """At `cls.identity` the method equals SDPA on a padded batch, on the model with a pre-trained score spread:
    outputs and gradients, train and eval mode, in fp32 and under bf16 and fp16 autocast (fp16 where the method
    supports it), each within its precision's TOLERANCE."""
    setting = f"{kind}, score sd {PRETRAINED_STD:g}"
    model = spread_model(kind, "std")
    cls(cls.Config(**cls.identity)).attach(model)
    precisions = [p for p in TOLERANCE if p != "fp16" or cls.supports_fp16]
    for precision in precisions:
        found = _identity_gap(cls, model, kind, precision)
        if found:
            return CheckResult("identity", setting, False, found if precision == "fp32" else (
                f"under {precision} autocast, where fp32 agrees (a path the method takes in half precision only "
                f"differs: another scaling, mask or softmax there, or a cast in the wrong place?): {found}"))
    return CheckResult("identity", setting, True, f"at {cls.identity}: equals SDPA (outputs, gradients; train and "
                       f"eval; {', '.join(precisions)}; scores with a pre-trained model's spread)")


def _identity_batch(model) -> tuple:
    # rows with a real token: SDPA's output on a row with none is a convention of its own, not softmax attention
    return rows(checked_batch(model), [i for name, which in ROWS.items() if name != "a fully padded row"
                                       for i in which])


@functools.lru_cache(maxsize=None)
def _sdpa_reference(kind: str, precision: str, mode: str) -> tuple:
    """(real tokens' final outputs, gradients) of the spread model with SDPA on the identity batch: the same for
    every method, so computed once per process."""
    ref = spread_model(kind, "std")
    ids, mask, labels = _identity_batch(ref)
    ref.train(mode == "train")
    with _autocast(precision):
        out, loss = forward(ref, ids, mask, labels)
    loss.backward()
    return out.hidden_states[-1][mask.bool()].detach(), gradients(ref)


def _identity_gap(cls, model, kind: str, precision: str) -> str | None:
    """What differs between `model` (the method at its identity) and the spread model with SDPA in one precision,
    or None."""
    ids, mask, labels = _identity_batch(model)
    valid = mask.bool()
    tolerance = TOLERANCE[precision]
    cause = (f"at {cls.identity}, with scores of a pre-trained model's spread (a scaling other than d^-0.5, a mask or "
             "a softmax that differ from SDPA's?)")
    for mode in ("train", "eval"):
        out_ref, g_ref = _sdpa_reference(kind, precision, mode)
        model.train(mode == "train")
        model.zero_grad()
        gaps: list[float] = []
        with _autocast(precision), _sdpa_gaps(model, valid, gaps):
            out, loss = forward(model, ids, mask, labels)
        if gaps and not max(gaps) <= tolerance["attention"]:
            layer = max(range(len(gaps)), key=gaps.__getitem__)
            return (f"{mode} mode: layer {layer}'s attention output differs from SDPA's on the same queries, keys and "
                    f"values by {max(gaps):.2e} of its size (tolerance {tolerance['attention']:.0e}) {cause}")
        diff = max_diff(out.hidden_states[-1][valid], out_ref)
        if not diff <= tolerance["outputs"]:
            return (f"{mode} mode: real tokens' outputs differ from SDPA by {diff:.2e} (tolerance "
                    f"{tolerance['outputs']:.0e}) {cause}")
        loss.backward()
        g = gradients(model)
        for name in g_ref:
            diff = max_diff(g[name], g_ref[name]) if name in g else math.inf
            scale = max(1.0, float(g_ref[name].abs().max()))
            if not diff <= tolerance["gradients"] * scale:
                return f"{mode} mode: gradient of {name} differs from SDPA by {diff:.2e}"
    return None


def _non_finite(model, batch: tuple, mode: str, seed: int, autocast) -> str | None:
    """What is NaN or inf in one forward and backward (real tokens' outputs, logits, loss, gradients), or None."""
    ids, mask, labels = batch
    model.train(mode == "train")
    model.zero_grad()
    with autocast:
        out, loss = forward(model, ids, mask, labels, seed=seed)
    if not (torch.isfinite(out.hidden_states[-1][mask.bool()].float()).all() and torch.isfinite(out.logits).all()):
        return "outputs"
    if not torch.isfinite(loss.float()):
        return "loss"
    loss.backward()
    bad = [n for n, g in gradients(model).items() if not torch.isfinite(g).all()]
    return f"gradients (in {', '.join(bad[:2])})" if bad else None


def check_fp16(method: AttentionMethod, kind: str) -> CheckResult:
    """Under fp16 autocast (the CPU's, as a GPU's: matmuls in fp16), with scores of a pre-trained model's spread,
    outputs, loss and gradients are finite in train and eval mode, padded and unpadded, wherever they are finite in
    fp32. Skipped for methods that declare supports_fp16 = False (the suite never trains them in fp16)."""
    setting = f"{kind}, fp16, scores up to {PRETRAINED_SCORES:g}"
    if not type(method).supports_fp16:
        return CheckResult("fp16", setting, None, "declared supports_fp16 = False: never trained in fp16")
    model = spread_model(kind)
    method.attach(model)
    fp16 = torch.autocast("cpu", dtype=torch.float16)
    for padded in (True, False):
        batch = checked_batch(model, padded=padded)
        for mode in ("train", "eval"):
            for seed in pass_seeds(method, mode, FP16_SEEDS):
                # fp32 reruns the same draws, of a generator of the method's own too
                state = repeat_twin(method, model, mode)
                found = _non_finite(model, batch, mode, seed, fp16)
                if found is None:
                    continue
                where = f"{mode} mode, {'padded' if padded else 'unpadded'} batch, seed {seed}"
                if _non_finite(state, batch, mode, seed, contextlib.nullcontext()) is not None:
                    return CheckResult("fp16", setting, None, f"not judged: non-finite in fp32 too ({where}; see the "
                                       "finite check)")
                return CheckResult("fp16", setting, False, f"non-finite {found} under fp16 autocast ({where}), finite "
                                   "in fp32: with a pre-trained model's scores an exponential or sum computed in fp16 "
                                   "overflows (exp(s) > 65504 once s > 11.1); compute the softmax in fp32 "
                                   "(suite.softmax) or subtract each row's maximum first")
    return CheckResult("fp16", setting, True, "finite under fp16 autocast (train and eval, padded and unpadded)")
