"""The method check's rules on what evaluation must not depend on (see suite.api.testing for the whole check): a
sample's output does not depend on the batch it is in or on the padded length, nor on padding in bf16 and fp16;
the method runs at 512 tokens, scales its scores with the `scaling` the model passes (not a constant written for a
head dim of 64), and stays finite at the edges of every float hyper-parameter its validation accepts."""
from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from suite.api.attention import AttentionMethod, HyperParameterError, attention_modules
from suite.api.check_common import CheckResult, attached, checked_batch, finite_diff, forward, fresh_model
from suite.api.stochastic import stochastic_fields

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_batch", "check_edges", "check_half_padding", "check_long", "check_scaling"]

TOLERANCE = 1e-5         # on fp32 outputs that must not change (rounding of a different batch stays near 1e-7)
HALF_TOLERANCE = 1e-3    # the same under bf16 and fp16 autocast, where a real output's rounding step is ~1e-2
LONG = 512               # tokens of the long batch: BERT's and RoBERTa's longest input
EXTRA_PADDING = 40       # positions of padding added to the checked batch (the tiny models hold 80 positions)
EDGES = (0.0, 0.5, 0.99, 1.0, 1.01, 2.0)  # values a float hyper-parameter is tried at, where validation accepts them


def _eval_outputs(model, ids, mask, autocast=None, seed: int = 0) -> torch.Tensor:
    model.eval()
    with torch.no_grad(), autocast or contextlib.nullcontext():
        out, _ = forward(model, ids, mask, torch.zeros(ids.shape[0], dtype=torch.long), seed=seed)
    return out.hidden_states[-1].float()


def check_batch(method: AttentionMethod, kind: str) -> CheckResult:
    """In evaluation a sample's real outputs are the same alone (cut to its real length), in the checked batch and
    in that batch padded to a longer length: a rule that reads the padded length (k of a top-k, a log-n scaling)
    or a statistic over the batch makes them move."""
    setting = f"{kind}, eval, batch"
    model = attached(method, kind)
    ids, mask, _ = checked_batch(model)
    pad = model.config.pad_token_id
    batched = _eval_outputs(model, ids, mask)
    if finite_diff(batched, _eval_outputs(model, ids, mask, seed=1))[0] > 0:
        return CheckResult("batch", setting, None, "not judged: evaluation is not deterministic (see the eval check)")
    longer = _eval_outputs(model, torch.cat([ids, torch.full((ids.shape[0], EXTRA_PADDING), pad)], 1),
                           torch.cat([mask, torch.zeros(ids.shape[0], EXTRA_PADDING, dtype=mask.dtype)], 1))
    worst, where = 0.0, ""
    for row in range(ids.shape[0]):
        n = int(mask[row].sum())
        if n == 0:
            continue
        alone = _eval_outputs(model, ids[row:row + 1, :n], mask[row:row + 1, :n])[0]
        for other, how in ((batched[row, :n], "in the batch"), (longer[row, :n], f"padded by {EXTRA_PADDING} more")):
            diff, _ = finite_diff(alone, other)
            if diff > worst:
                worst, where = diff, f"a sample of {n} tokens alone and {how}"
    if worst > TOLERANCE:
        return CheckResult("batch", setting, False, f"evaluation outputs of {where} differ by {worst:.2e}: a "
                           "sample's output depends on its batch or on the padded length (a count of keys, a top-k's "
                           "k or a log-n scaling taken from key.shape[-1] instead of the row's real keys, or a "
                           "statistic over the batch?); count real keys with suite.valid_keys")
    return CheckResult("batch", setting, True, f"a sample's outputs alone, in the batch and padded longer agree "
                       f"(up to {worst:.1e})")


def check_half_padding(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """The padding rule's first part in bf16 and fp16 autocast, in evaluation: noise on the padded positions'
    embeddings moves no real token's output (a half-precision fast path that drops the mask moves them)."""
    model = attached(method, kind)
    ids, mask, _ = checked_batch(model)
    noise = torch.randn(*mask.shape, model.config.hidden_size, generator=torch.Generator().manual_seed(1)) * 3.0
    noise = noise * (mask == 0).unsqueeze(-1)
    results = []
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        if name == "fp16" and not type(method).supports_fp16:
            continue
        autocast = torch.autocast("cpu", dtype=dtype)
        clean = _eval_outputs(model, ids, mask, autocast)
        handle = model.get_input_embeddings().register_forward_hook(lambda mod, args, out: out + noise.to(out))
        try:
            noisy = _eval_outputs(model, ids, mask, autocast)
        finally:
            handle.remove()
        diff, non_finite = finite_diff(clean[mask.bool()], noisy[mask.bool()])
        setting = f"{kind}, eval, {name}"
        if diff > HALF_TOLERANCE:
            results.append(CheckResult("padding", setting, False, f"under {name} autocast real tokens' outputs "
                                       f"changed by {diff:.2e} when only padded positions' inputs changed (fp32 is "
                                       "the padding rule above): a half-precision path that drops or mis-casts the "
                                       "mask (an SDPA fast path called without attn_mask, or finfo.min cast to "
                                       "another dtype?)"))
        elif non_finite:
            results.append(CheckResult("padding", setting, None, "not judged: outputs not finite (see finite)"))
        else:
            results.append(CheckResult("padding", setting, True, f"real tokens' outputs unchanged under {name} "
                                       "autocast when padded positions change"))
    return results


def check_long(cls: type[AttentionMethod], values: dict, kind: str) -> CheckResult:
    """A 512-token sample runs in training (a forward, where every table is read) with finite outputs: a table sized
    for fewer positions fails at the first longer input."""
    setting = f"{kind}, {LONG} tokens"
    model = fresh_model(kind, max_position_embeddings=LONG + 2)
    cls(cls.Config(**values)).attach(model)
    ids = torch.randint(3, model.config.vocab_size, (1, LONG), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    for mode in ("train",):
        model.train(mode == "train")
        try:
            with torch.no_grad():
                out, _ = forward(model, ids, mask, torch.tensor([0]))
        except Exception as exc:  # noqa: BLE001  the finding
            return CheckResult("long", setting, False, f"{mode} mode at {LONG} tokens raised {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''} (a table or buffer sized for fewer "
                               "positions? size it from the input, or refuse longer models in check_model_config)")
        if not torch.isfinite(out.hidden_states[-1][mask.bool()]).all():
            return CheckResult("long", setting, False, f"{mode} mode at {LONG} tokens gives non-finite outputs")
    return CheckResult("long", setting, True, f"a training forward runs at {LONG} tokens, outputs finite")


def check_scaling(method: AttentionMethod, kind: str) -> CheckResult:
    """A method whose output reads the keys scales its scores with the `scaling` it is given (d^-0.5 of the
    model's head dim): calling `attention()` with another scaling changes its output. A constant such as
    1/sqrt(64) is right for one head dim only (MiniLM's is 32, the tiny models' 8)."""
    setting = f"{kind}, eval, scaling"
    model = attached(method, kind)
    original = method.attention
    found: list[tuple[float, float]] = []  # per call: (change with the keys, change with the scaling)

    def probing(module, query, key, value, attention_mask, scaling, *args, **kwargs):
        result = original(module, query, key, value, attention_mask, scaling, *args, **kwargs)
        if not found:
            noise = torch.randn(key.shape, generator=torch.Generator().manual_seed(6)).to(key)
            keyed = original(module, query, key + noise, value, attention_mask, scaling, *args, **kwargs)
            rescaled = original(module, query, key, value, attention_mask, scaling * 1.5, *args, **kwargs)
            found.append((finite_diff(result[0], keyed[0])[0], finite_diff(result[0], rescaled[0])[0]))
        return result

    method.attention = probing
    try:
        _eval_outputs(model, *checked_batch(model)[:2])
    finally:
        del method.attention
    if not found or found[0][0] <= TOLERANCE:
        return CheckResult("scaling", setting, None, "the output does not read the keys: no scores to scale")
    if found[0][1] <= TOLERANCE:
        head_dim = model.config.hidden_size // model.config.num_attention_heads
        return CheckResult("scaling", setting, False, "the output reads the keys but does not change when the "
                           "model passes another `scaling`: the scores are scaled by a constant (1/sqrt(64) is "
                           f"right for a head dim of 64 only; here it is {head_dim}) "
                           "or by one computed apart from the model's; use the `scaling` argument")
    return CheckResult("scaling", setting, True, "the scores follow the `scaling` the model passes")


def check_edges(cls: type[AttentionMethod], values: dict, kind: str) -> CheckResult:
    """Every float hyper-parameter (stochastic ones aside: the hparams rule tries those) at the edges its validation
    accepts among EDGES (0, 1 and either side of 1, as an entmax alpha's) gives finite outputs, loss and gradients in
    training and evaluation: a value validate() lets through must run."""
    setting = f"{kind}, edges"
    stochastic = {s.field for s in stochastic_fields(cls)}
    base = cls.Config(**values)
    fields = [f.name for f in dataclasses.fields(base) if f.name not in stochastic
              and isinstance(getattr(base, f.name), float)]
    ids, mask, labels = checked_batch(fresh_model(kind))
    tried = []
    for name in fields:
        for value in EDGES:
            if value == getattr(base, name):
                continue
            try:
                method = cls(cls.Config(**{**values, name: value}))
            except HyperParameterError:
                continue
            model = attached(method, kind)
            bad = None
            for mode in ("train",):  # eval computes what training does, without the draws
                model.train(mode == "train")
                try:
                    out, loss = forward(model, ids, mask, labels)
                    loss.backward()
                except Exception as exc:  # noqa: BLE001  the finding
                    bad = f"raises {type(exc).__name__} in {mode} mode"
                    break
                grads = [p.grad for m in attention_modules(model) for p in m.parameters() if p.grad is not None]
                if not (math.isfinite(float(loss.detach())) and torch.isfinite(out.hidden_states[-1][mask.bool()]).all()
                        and all(torch.isfinite(g).all() for g in grads)):
                    bad = f"gives non-finite outputs, loss or gradients in {mode} mode"
                    break
            if bad:
                return CheckResult("edges", setting, False, f"{cls.name}.{name}={value} is accepted by validate() "
                                   f"but {bad}: refuse values outside the parameter's domain with "
                                   "HyperParameterError (an entmax alpha must stay above 1), or keep it there")
            tried.append(f"{name}={value}")
    if not tried:
        return CheckResult("edges", setting, None, "no float hyper-parameter beyond the stochastic ones to try")
    return CheckResult("edges", setting, True, f"finite at {len(tried)} edge values validate() accepts "
                       f"({', '.join(tried[:4])}{', ...' if len(tried) > 4 else ''})")
