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
              device stands in for a GPU).

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
from suite.api.tiny_models import WORDS, padded_batch, tiny_config, tiny_model, tiny_tokenizer  # noqa: F401

MODEL_KINDS = ("bert", "roberta")
INVALID_PROBABILITIES = (-0.1, 1.5, math.nan)
TOLERANCE = {"outputs": 1e-5, "gradients": 1e-4}
PERTURBATION = 3.0  # size of the noise put on padded positions' embeddings


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class CheckResult:
    check: str          # hparams | shape | identity | padding | finite | eval | prepare
    setting: str        # which model / precision / value it ran on
    passed: bool | None  # None: skipped
    detail: str = ""


@dataclasses.dataclass
class CheckReport:
    method: str
    hparams: dict[str, Any]
    results: list[CheckResult] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.passed is not False for r in self.results)

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.passed is False]

    def __str__(self) -> str:
        mark = {True: "ok", False: "FAIL", None: "skip"}
        lines = [f"{self.method} {self.hparams or ''}".rstrip() + f": {'passed' if self.ok else 'FAILED'}"]
        for r in self.results:
            lines.append(f"  {mark[r.passed]:<4} {r.check:<8} {r.setting:<24} {r.detail}".rstrip())
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------

def _batch(model, seed: int = 0, padded: bool = True):
    ids, mask = padded_batch(length=12, vocab=model.config.vocab_size, seed=seed, pad_id=model.config.pad_token_id)
    if not padded:
        mask = torch.ones_like(mask)
        ids[ids == model.config.pad_token_id] = 3
    return ids, mask, torch.tensor([0, 1, 0])


def _attached(method: AttentionMethod, kind: str):
    model = tiny_model(kind)
    method.attach(model)
    return model


def _forward(model, ids, mask, labels, seed: int = 0):
    torch.manual_seed(seed)  # methods that sample (dropout masks) draw the same numbers in compared passes
    out = model(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    valid = mask.bool()
    # a loss on every real token's final state, so the gradients see every attention row, not just [CLS]
    return out, out.loss + out.hidden_states[-1][valid].square().mean()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def check_identity(cls: type[AttentionMethod], kind: str) -> CheckResult:
    """At `cls.identity` the method equals SDPA on a padded batch: outputs and gradients, train and eval mode."""
    setting = kind
    ref = tiny_model(kind)
    model = copy.deepcopy(ref)
    cls(cls.Config(**cls.identity)).attach(model)
    ids, mask, labels = _batch(ref)
    valid = mask.bool()
    for mode in ("train", "eval"):
        for m in (ref, model):
            m.train(mode == "train")
            m.zero_grad()
        out_ref, loss_ref = _forward(ref, ids, mask, labels)
        out, loss = _forward(model, ids, mask, labels)
        diff = _max_diff(out.hidden_states[-1][valid], out_ref.hidden_states[-1][valid])
        if not diff <= TOLERANCE["outputs"]:
            return CheckResult("identity", setting, False, f"{mode} mode: real tokens' outputs differ from SDPA "
                               f"by {diff:.2e} (tolerance {TOLERANCE['outputs']:.0e})")
        loss_ref.backward()
        loss.backward()
        g_ref, g = _grads(ref), _grads(model)
        for name in g_ref:
            diff = _max_diff(g[name], g_ref[name]) if name in g else math.inf
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
    model = _attached(method, kind)
    ids, mask, labels = _batch(model)
    valid = mask.bool()
    results = []
    for mode in ("train", "eval"):
        model.train(mode == "train")
        with torch.no_grad():
            clean, _ = _forward(model, ids, mask, labels)
            with _noise_on_padding(model, mask, PERTURBATION):
                noisy, _ = _forward(model, ids, mask, labels)
        diff = _max_diff(clean.hidden_states[-1][valid], noisy.hidden_states[-1][valid])
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
        _forward(model, ids, mask, labels)
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
    model = _attached(method, kind)
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
        ids, mask, labels = _batch(model, padded=padded)
        for mode in ("train", "eval"):
            model.train(mode == "train")
            model.zero_grad()
            with autocast:
                out, loss = _forward(model, ids, mask, labels)
            where = f"{mode}, {'padded' if padded else 'unpadded'}"
            if not torch.isfinite(out.hidden_states[-1][mask.bool()].float()).all():
                bad.append(f"{where}: non-finite outputs at real tokens")
            loss.backward()
            if not torch.isfinite(loss.float()):
                bad.append(f"{where}: loss is {float(loss.detach())}")
            grads = [n for n, g in _grads(model).items() if not torch.isfinite(g).all()]
            if grads:
                bad.append(f"{where}: non-finite gradients in {', '.join(grads[:3])}")
    return bad


def _non_finite_rows(model, autocast) -> list[str]:
    """Attention rows of real queries (as handed to `suite.attend`) that hold NaN or inf, in eval mode."""
    ids, mask, labels = _batch(model)
    real_query = mask.bool()[:, None, :, None]
    bad_layers: list[int] = []

    def probe(module, probs):
        if not torch.isfinite(probs.detach().float().masked_fill(~real_query, 0)).all():
            bad_layers.append(module.layer_idx)

    model.eval()
    with torch.no_grad(), autocast, probes(model, probe):
        _forward(model, ids, mask, labels)
    return [f"eval, padded: non-finite attention rows in layers {sorted(set(bad_layers))}"] if bad_layers else []


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
    model = _attached(method, kind)
    calls: list = []
    _recording_attention(method, calls)
    try:
        for mode in ("train", "eval"):
            model.train(mode == "train")
            for padded in (True, False):
                ids, mask, labels = _batch(model, padded=padded)
                failure = None
                try:
                    with torch.no_grad():
                        _forward(model, ids, mask, labels)
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
    model = _attached(method, kind)
    model.eval()
    for padded in (True, False):
        ids, mask, labels = _batch(model, padded=padded)
        valid = mask.bool()
        with torch.no_grad():
            first, _ = _forward(model, ids, mask, labels, seed=0)
            second, _ = _forward(model, ids, mask, labels, seed=1)
        diff = max(_max_diff(first.hidden_states[-1][valid], second.hidden_states[-1][valid]),
                   _max_diff(first.logits, second.logits))
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
