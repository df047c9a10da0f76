"""The method check: what every attention method must satisfy, runnable by a method's author.

`check_method(name_or_class, **hparams)` runs, on tiny random-init BERT and RoBERTa models with padded batches:

- hparams     the method's own validation refuses impossible values of its probability fields (`p`, `p_*`: -0.1,
              1.5 and NaN raise HyperParameterError) while the hyper-parameters under test are accepted;
- shape       `attention()` returns `(output, probabilities)` with the output in transformers' (B, L, H, d) layout
              (a wrong layout would be reshaped silently into wrong hidden states); when it fails, the checks
              below are not run for that model, so the report names the shapes, not a symptom;
- identity    at the method's `identity` setting it equals transformers' SDPA attention (outputs and gradients,
              train and eval mode); skipped when the method declares no identity setting;
- padding     padded positions are never attended: changing what sits at the padded positions changes no real
              position's output, and the probabilities a method hands to `suite.attend` are 0 on padded keys;
- finite      outputs, loss and gradients are finite under fp32 and under bf16 autocast, with and without padding;
- eval        evaluation is deterministic: two eval-mode passes over the same batch, under different random seeds,
              give identical outputs, with and without padding;
- prepare     parameters and buffers that `prepare()` adds sit on the model's device (a model on PyTorch's `meta`
              device stands in for a GPU);
- hooks       two training steps through the hooks as the runner calls them: `training_step` returns the detached
              loss, `epoch_record()` and `record()` are JSON, `training_only_parameters()` is a count.

The checks on the output layout, evaluation, `prepare` and the hooks live in `suite.api.check_contract`; the report
types and the checked batch in `suite.api.check_common`.

`python -m suite check METHOD [...]` is the same from the command line. The tiny-model builders (`tiny_model`,
`tiny_config`, `padded_batch`, `tiny_tokenizer`, from `suite.api.tiny_models`) are the ones the test suite uses too.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from typing import Any, Callable

import torch

from suite.api.attention import METHODS, AttentionMethod, HyperParameterError, probes
from suite.api.check_common import CheckReport, CheckResult, attached, checked_batch, forward, gradients, max_diff
from suite.api.check_contract import check_deterministic, check_hooks, check_prepare_device, check_shape
from suite.api.tiny_models import WORDS, padded_batch, tiny_config, tiny_model, tiny_tokenizer  # noqa: F401

MODEL_KINDS = ("bert", "roberta")
INVALID_PROBABILITIES = (-0.1, 1.5, math.nan)
TOLERANCE = {"outputs": 1e-5, "gradients": 1e-4}
PERTURBATION = 3.0  # size of the noise put on padded positions' embeddings


# ---------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------

def check_identity(cls: type[AttentionMethod], kind: str) -> CheckResult:
    """At `cls.identity` the method equals SDPA on a padded batch: outputs and gradients, train and eval mode."""
    setting = kind
    ref = tiny_model(kind)
    model = copy.deepcopy(ref)
    cls(cls.Config(**cls.identity)).attach(model)
    ids, mask, labels = checked_batch(ref)
    valid = mask.bool()
    for mode in ("train", "eval"):
        for m in (ref, model):
            m.train(mode == "train")
            m.zero_grad()
        out_ref, loss_ref = forward(ref, ids, mask, labels)
        out, loss = forward(model, ids, mask, labels)
        diff = max_diff(out.hidden_states[-1][valid], out_ref.hidden_states[-1][valid])
        if not diff <= TOLERANCE["outputs"]:
            return CheckResult("identity", setting, False, f"{mode} mode: real tokens' outputs differ from SDPA "
                               f"by {diff:.2e} (tolerance {TOLERANCE['outputs']:.0e})")
        loss_ref.backward()
        loss.backward()
        g_ref, g = gradients(ref), gradients(model)
        for name in g_ref:
            diff = max_diff(g[name], g_ref[name]) if name in g else math.inf
            scale = max(1.0, float(g_ref[name].abs().max()))
            if not diff <= TOLERANCE["gradients"] * scale:
                return CheckResult("identity", setting, False, f"{mode} mode: gradient of {name} differs from "
                                   f"SDPA by {diff:.2e}")
    return CheckResult("identity", setting, True, f"at {cls.identity}: equals SDPA (outputs, gradients; train and "
                       "eval)")


@contextlib.contextmanager
def _noise_on_padding(model, mask: torch.Tensor, scale: float):
    """Adds noise to the word embeddings of padded positions: their keys and values change in every layer."""
    noise = torch.randn(*mask.shape, model.config.hidden_size, generator=torch.Generator().manual_seed(1)) * scale
    noise = noise * (mask == 0).unsqueeze(-1)
    handle = model.get_input_embeddings().register_forward_hook(lambda mod, args, out: out + noise.to(out))
    try:
        yield
    finally:
        handle.remove()


def _padded_mass_probe(mask: torch.Tensor, found: list[float]):
    """A statistics probe that records, per call of `suite.attend`, the largest weight a real query puts on a
    padded key."""
    padded_key = (mask == 0)[:, None, None, :]
    real_query = mask.bool()[:, None, :, None]

    def probe(module, probs):
        found.append(float((probs.detach().float().abs() * (padded_key & real_query)).max()))

    return probe


def check_padding(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """Padding never attended: output invariance under noise at padded positions, and zero weight on them."""
    model = attached(method, kind)
    ids, mask, labels = checked_batch(model)
    valid = mask.bool()
    results = []
    for mode in ("train", "eval"):
        model.train(mode == "train")
        with torch.no_grad():
            clean, _ = forward(model, ids, mask, labels)
            with _noise_on_padding(model, mask, PERTURBATION):
                noisy, _ = forward(model, ids, mask, labels)
        diff = max_diff(clean.hidden_states[-1][valid], noisy.hidden_states[-1][valid])
        ok = diff <= TOLERANCE["outputs"]
        detail = ("real tokens' outputs unchanged when padded positions change" if ok else
                  f"real tokens' outputs changed by {diff:.2e} when only padded positions' inputs changed: the "
                  "method attends to padding (is the attention_mask used, also when it is None or boolean?)")
        results.append(CheckResult("padding", f"{kind}, {mode}", ok, detail))
    results.append(_padded_weight_result(model, kind, ids, mask, labels))
    return results


def _padded_weight_result(model, kind, ids, mask, labels) -> CheckResult:
    found: list[float] = []
    model.eval()
    with torch.no_grad(), probes(model, _padded_mass_probe(mask, found)):
        forward(model, ids, mask, labels)
    setting = f"{kind}, probabilities"
    if not found:
        return CheckResult("padding", setting, None, "the method never calls suite.attend: its probabilities "
                           "cannot be inspected (attention statistics and analyses will be empty)")
    worst = max(found)
    if worst == 0.0:
        return CheckResult("padding", setting, True, f"weight on padded keys is 0 in all {len(found)} layers")
    return CheckResult("padding", setting, False, f"real queries put weight up to {worst:.3g} on padded keys "
                       "(must be exactly 0)")


def check_finite(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """Finite outputs, loss and gradients in fp32 and under bf16 autocast, padded and unpadded, train and eval."""
    model = attached(method, kind)
    results = []
    for precision in ("fp32", "bf16"):
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                    else contextlib.nullcontext())
        bad = _non_finite(model, autocast) + _non_finite_rows(model, autocast)
        results.append(CheckResult("finite", f"{kind}, {precision}", not bad,
                                   "; ".join(bad) if bad else "outputs, attention rows, loss and gradients finite"))
    return results


def _non_finite(model, autocast) -> list[str]:
    bad = []
    for padded in (True, False):
        ids, mask, labels = checked_batch(model, padded=padded)
        for mode in ("train", "eval"):
            model.train(mode == "train")
            model.zero_grad()
            with autocast:
                out, loss = forward(model, ids, mask, labels)
            where = f"{mode}, {'padded' if padded else 'unpadded'}"
            if not torch.isfinite(out.hidden_states[-1][mask.bool()].float()).all():
                bad.append(f"{where}: non-finite outputs at real tokens")
            loss.backward()
            if not torch.isfinite(loss.float()):
                bad.append(f"{where}: loss is {float(loss.detach())}")
            grads = [n for n, g in gradients(model).items() if not torch.isfinite(g).all()]
            if grads:
                bad.append(f"{where}: non-finite gradients in {', '.join(grads[:3])}")
    return bad


def _non_finite_rows(model, autocast) -> list[str]:
    """Attention rows of real queries (as handed to `suite.attend`) that hold NaN or inf, in eval mode."""
    ids, mask, labels = checked_batch(model)
    real_query = mask.bool()[:, None, :, None]
    bad_layers: list[int] = []

    def probe(module, probs):
        if not torch.isfinite(probs.detach().float().masked_fill(~real_query, 0)).all():
            bad_layers.append(module.layer_idx)

    model.eval()
    with torch.no_grad(), autocast, probes(model, probe):
        forward(model, ids, mask, labels)
    return [f"eval, padded: non-finite attention rows in layers {sorted(set(bad_layers))}"] if bad_layers else []


def probability_fields(cls: type[AttentionMethod]) -> list[str]:
    """Config fields that hold a probability by the suite's naming rule: `p` or `p_*`, typed float."""
    return [f.name for f in dataclasses.fields(cls.Config)
            if (f.name == "p" or f.name.startswith("p_")) and isinstance(getattr(cls.Config(), f.name), float)]


def check_hparams(cls: type[AttentionMethod], hparams: dict[str, Any]) -> list[CheckResult]:
    """The hyper-parameters under test are accepted; impossible probabilities raise HyperParameterError."""
    results = []
    try:
        cls(cls.Config(**hparams))
        results.append(CheckResult("hparams", "accepted", True, f"{hparams or 'defaults'} accepted"))
    except Exception as exc:  # noqa: BLE001  any failure here is the finding
        results.append(CheckResult("hparams", "accepted", False, f"{type(exc).__name__}: {exc}"))
    fields = probability_fields(cls)
    if not fields:
        results.append(CheckResult("hparams", "probabilities", None, "no probability fields (p, p_*) to test"))
    for name in fields:
        for value in INVALID_PROBABILITIES:
            results.append(_refuses(cls, {**hparams, name: value}, f"{name}={value}"))
    return results


def _refuses(cls, values: dict[str, Any], setting: str) -> CheckResult:
    try:
        cls(cls.Config(**values))
    except HyperParameterError as exc:
        return CheckResult("hparams", setting, True, f"refused: {exc}")
    except Exception as exc:  # noqa: BLE001
        return CheckResult("hparams", setting, False, f"raised {type(exc).__name__} ({exc}), not "
                           "HyperParameterError: the CLI would not report it as bad input")
    return CheckResult("hparams", setting, False, "accepted an impossible value (validate() should raise "
                       "HyperParameterError)")


def _guarded(results: list[CheckResult], check: str, setting: str, fn: Callable[[], Any]) -> None:
    """Runs one check; an exception inside the method becomes a failed result instead of ending the check."""
    try:
        found = fn()
    except Exception as exc:  # noqa: BLE001
        results.append(CheckResult(check, setting, False, f"raised {type(exc).__name__}: {exc}"))
        return
    results.extend(found if isinstance(found, list) else [found])


def resolve_method(name_or_class: str | type[AttentionMethod]) -> type[AttentionMethod]:
    if isinstance(name_or_class, str):
        return METHODS.get(name_or_class)
    if not (isinstance(name_or_class, type) and issubclass(name_or_class, AttentionMethod) and name_or_class.name):
        raise TypeError("check_method takes a registered method's name or a class decorated with "
                        "@suite.register_method")
    return name_or_class


def check_method(name_or_class: str | type[AttentionMethod], **hparams: Any) -> CheckReport:
    """Run every check on a registered method (its defaults, overridden by `hparams`) and return the report."""
    cls = resolve_method(name_or_class)
    report = CheckReport(cls.name, hparams)
    report.results.extend(check_hparams(cls, hparams))
    if report.failures():
        return report  # without a valid configuration the model checks cannot run
    with one_thread():
        _model_checks(cls, hparams, report)
    return report


@contextlib.contextmanager
def one_thread():
    """Tiny models run fastest on one thread; on a busy machine a second one makes them several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _model_checks(cls: type[AttentionMethod], hparams: dict[str, Any], report: CheckReport) -> None:
    torch.manual_seed(0)
    results = report.results
    for kind in MODEL_KINDS:
        _guarded(results, "shape", kind, lambda: check_shape(cls(cls.Config(**hparams)), kind))
        if results[-1].passed is False:  # every later check would only see the scrambled outputs
            results.append(CheckResult("others", kind, None, "not run on this model: the output shape is wrong"))
            continue
        if cls.identity is None:
            results.append(CheckResult("identity", kind, None, "no identity setting declared"))
        else:
            _guarded(results, "identity", kind, lambda: check_identity(cls, kind))
        _guarded(results, "padding", kind, lambda: check_padding(cls(cls.Config(**hparams)), kind))
        _guarded(results, "finite", kind, lambda: check_finite(cls(cls.Config(**hparams)), kind))
        _guarded(results, "eval", kind, lambda: check_deterministic(cls(cls.Config(**hparams)), kind))
        _guarded(results, "prepare", kind, lambda: check_prepare_device(cls(cls.Config(**hparams)), kind))
        _guarded(results, "hooks", kind, lambda: check_hooks(cls(cls.Config(**hparams)), kind))
