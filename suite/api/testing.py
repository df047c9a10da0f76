"""The method check: what every attention method must satisfy, runnable by a method's author.

`check_method(name_or_class, **hparams)` runs, on tiny random-init BERT and RoBERTa models with padded batches whose
rows hold 12, 9, 6, 1 and 0 real tokens (the last row's attention mask is all 0):

- hparams     the method's own validation refuses impossible values of its probability fields (`p`, `p_*`: -0.1,
              1.5 and NaN raise HyperParameterError) while the hyper-parameters under test are accepted;
- shape       `attention()` returns `(output, probabilities)` with the output in transformers' (B, L, H, d) layout,
              each element in its place (read from where noise on one head's values and on one position's queries
              moves the output): a (B, H, L, d) output, or one reshaped from it, would be read silently as wrong
              hidden states. The message says which layout the output is in, and which rows make the model raise;
              when the check fails, the checks below are not run for that model, so the report names the layout,
              not a symptom;
- values      every value channel of every head reaches that head's output (also without an identity setting);
- params      every tensor a training step's gradient reaches is held by an optimizer: none is created after
              `prepare()` (lazily in `attention()`, or in `setup_training()`) or kept outside the model;
- identity    at the method's `identity` setting it equals transformers' SDPA attention (outputs and gradients,
              train and eval mode, on the rows with a real token); skipped when the method declares none;
- finite      outputs, loss and gradients are finite under fp32 and under bf16 autocast, with and without padding;
              a failure names the rows that cause it (a fully padded row, a length-1 row);
- padding     padded positions are never attended: changing what sits at the padded positions changes no real
              position's output, and the probabilities a method hands to `suite.attend` are 0 on padded keys;
- eval        evaluation is deterministic: two eval-mode passes over the same batch, under different random seeds,
              give identical outputs, with and without padding;
- prepare     parameters and buffers that `prepare()` adds sit on the model's device (a model on PyTorch's `meta`
              device stands in for a GPU);
- hooks       two training steps through the hooks as the runner calls them: `training_step` returns the detached
              loss, `epoch_record()` and `record()` are JSON, `training_only_parameters()` is a count.

The padding and eval checks compare finite values only: NaN and inf are the finite check's finding, not a sign of
attending to padding or of sampling in evaluation. The checks on the output layout, value channels, parameters,
evaluation, `prepare` and the hooks live in `suite.api.check_contract`; the report types and the checked batch in
`suite.api.check_common`.

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
from suite.api.check_common import (
    ROWS,
    CheckReport,
    CheckResult,
    attached,
    checked_batch,
    finite_diff,
    forward,
    gradients,
    max_diff,
    rows,
)
from suite.api.check_contract import check_deterministic, check_hooks, check_parameters, check_prepare_device
from suite.api.check_layout import check_shape, check_values
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
    # rows with a real token: SDPA's output on a row with none is a convention of its own, not softmax attention
    ids, mask, labels = rows(checked_batch(ref), [i for name, which in ROWS.items() if name != "a fully padded row"
                                                  for i in which])
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
    """A statistics probe that records, per call of `suite.attend`, the largest finite weight a real query puts on a
    padded key and whether any was not finite."""
    padded_key = (mask == 0)[:, None, None, :]
    real_query = mask.bool()[:, None, :, None]

    def probe(module, probs):
        weight = probs.detach().float().abs().masked_fill(~(padded_key & real_query), 0)
        # NaN or inf is the finite check's finding, not weight on padding: such rows are left out and noted
        found.append((float(weight.nan_to_num(0.0, 0.0, 0.0).max()), not bool(torch.isfinite(weight).all())))

    return probe


def check_padding(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """Padding never attended: output invariance under noise at padded positions, and zero weight on them."""
    model = attached(method, kind)
    ids, mask, labels = checked_batch(model)
    results = []
    for mode in ("train", "eval"):
        model.train(mode == "train")
        with torch.no_grad():
            # the noisy pass starts from a copy of the clean one's state: a method that draws from a generator of its
            # own then draws the same numbers in both
            twin = copy.deepcopy(model)
            clean, _ = forward(model, ids, mask, labels)
            with _noise_on_padding(twin, mask, PERTURBATION):
                noisy, _ = forward(twin, ids, mask, labels)
        results.append(_padding_result(kind, mode, clean, noisy, mask.bool()))
    results.append(_padded_weight_result(model, kind, ids, mask, labels))
    return results


def _padding_result(kind: str, mode: str, clean, noisy, valid: torch.Tensor) -> CheckResult:
    diff, non_finite = finite_diff(clean.hidden_states[-1][valid], noisy.hidden_states[-1][valid])
    setting = f"{kind}, {mode}"
    if diff > TOLERANCE["outputs"]:
        return CheckResult("padding", setting, False, f"real tokens' outputs changed by {diff:.2e} when only padded "
                           "positions' inputs changed: the method attends to padding (is the attention_mask used, "
                           "also when it is None or boolean?)")
    if non_finite:
        return CheckResult("padding", setting, None, "not judged: real tokens' outputs are not finite (see the "
                           "finite check)")
    return CheckResult("padding", setting, True, "real tokens' outputs unchanged when padded positions change")


def _padded_weight_result(model, kind, ids, mask, labels) -> CheckResult:
    found: list[tuple[float, bool]] = []
    model.eval()
    with torch.no_grad(), probes(model, _padded_mass_probe(mask, found)):
        forward(model, ids, mask, labels)
    setting = f"{kind}, probabilities"
    if not found:
        return CheckResult("padding", setting, None, "the method never calls suite.attend: its probabilities "
                           "cannot be inspected (attention statistics and analyses will be empty)")
    worst = max(w for w, _ in found)
    if worst != 0.0:
        return CheckResult("padding", setting, False, f"real queries put weight up to {worst:.3g} on padded keys "
                           "(must be exactly 0)")
    if any(non_finite for _, non_finite in found):
        return CheckResult("padding", setting, None, "finite weights on padded keys are 0; some rows are not finite "
                           "(see the finite check)")
    return CheckResult("padding", setting, True, f"weight on padded keys is 0 in all {len(found)} layers")


def check_finite(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """Finite outputs, loss and gradients in fp32 and under bf16 autocast, padded and unpadded, train and eval."""
    model = attached(method, kind)
    results = []
    for precision in ("fp32", "bf16"):
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                    else contextlib.nullcontext())
        bad = _non_finite(model, autocast) + _non_finite_rows(model, autocast)
        results.append(CheckResult("finite", f"{kind}, {precision}", not bad,
                                   "; ".join(bad) if bad else "outputs, attention rows, loss and gradients finite "
                                   "(rows of 0 and 1 real tokens included)"))
    return results


def _non_finite(model, autocast) -> list[str]:
    found: dict[str, list[str]] = {}  # what was found: where (one line for train and eval when they agree)
    for padded in (True, False):
        batch = checked_batch(model, padded=padded)
        for mode in ("train", "eval"):
            what = _non_finite_pass(model, autocast, mode, batch)
            if not what:
                continue
            located = _locate(model, autocast, mode, batch) if padded else []
            text = "; ".join(located) if located else f"non-finite {', '.join(what)}"
            found.setdefault(text, []).append(f"{mode}, {'padded' if padded else 'unpadded'}")
    return [f"{' and '.join(where)}: {text}" for text, where in found.items()]


def _non_finite_pass(model, autocast, mode: str, batch: tuple) -> list[str]:
    """What is NaN or inf in one forward and backward: outputs (every row's logits, real tokens' final states), the
    loss, gradients."""
    ids, mask, labels = batch
    model.train(mode == "train")
    model.zero_grad()
    with autocast:
        out, loss = forward(model, ids, mask, labels)
    found = []
    if not (torch.isfinite(out.hidden_states[-1][mask.bool()].float()).all() and torch.isfinite(out.logits).all()):
        found.append("outputs")
    loss.backward()
    if not torch.isfinite(loss.float()):
        found.append(f"loss ({float(loss.detach())})")
    grads = [n for n, g in gradients(model).items() if not torch.isfinite(g).all()]
    if grads:
        found.append(f"gradients (in {', '.join(grads[:3])})")
    return found


def _locate(model, autocast, mode: str, batch: tuple) -> list[str]:
    """Which rows of the padded batch make it non-finite, each group of rows run alone."""
    found = []
    for name, which in ROWS.items():
        what = _non_finite_pass(model, autocast, mode, rows(batch, which))
        if what:
            hint = "" if name == "rows with real tokens" else (
                ": no key may be attended there (a softmax over none is 0/0); give such rows finite weights, e.g. "
                "mask with suite.mask_fill_value instead of -inf, and guard sums, norms and statistics over no or "
                "one key" if name == "a fully padded row" else ": one real key (a variance or norm over one key "
                "is 0 or undefined)")
            found.append(f"non-finite {', '.join(what)} on {name}{hint}")
    return found or ["non-finite values only when the rows are batched together (a statistic over the batch?)"]


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
        if results[-1].passed is False:  # every later check would only see the scrambled outputs or the same error
            results.append(CheckResult("others", kind, None, "not run on this model: " + (
                "the model does not run" if "raised" in results[-1].detail else "the output layout is wrong")))
            continue
        _guarded(results, "values", kind, lambda: check_values(cls(cls.Config(**hparams)), kind))
        _guarded(results, "params", kind, lambda: check_parameters(cls(cls.Config(**hparams)), kind))
        if cls.identity is None:
            results.append(CheckResult("identity", kind, None, "no identity setting declared"))
        else:
            _guarded(results, "identity", kind, lambda: check_identity(cls, kind))
        # finite first: the padding and eval checks compare finite values only and leave NaN and inf to it
        _guarded(results, "finite", kind, lambda: check_finite(cls(cls.Config(**hparams)), kind))
        _guarded(results, "padding", kind, lambda: check_padding(cls(cls.Config(**hparams)), kind))
        _guarded(results, "eval", kind, lambda: check_deterministic(cls(cls.Config(**hparams)), kind))
        _guarded(results, "prepare", kind, lambda: check_prepare_device(cls(cls.Config(**hparams)), kind))
        _guarded(results, "hooks", kind, lambda: check_hooks(cls(cls.Config(**hparams)), kind))
