"""The method check: what every attention method must satisfy, runnable by a method's author.

`check_method(name_or_class, **hparams)` runs, on tiny random-init BERT, RoBERTa and ModernBERT models (the last with
a global and a local, sliding-window layer) with padded batches whose
rows hold 12, 9, 6, 1 and 0 real tokens (the last row's attention mask is all 0), every rule below twice: at the
configuration under test and at high rates (each probability field p, p_* raised to 0.9, or the highest of 0.7 and
0.45 the method accepts), where whole rows lose all their keys, so that a verdict does not depend on the rate the
method happens to be checked at. Rules that sample in training look at several random seeds.

- hparams     the method's own validation refuses impossible values of its rates (declared in `stochastic`, else
              `p`, `p_*`: -0.1, 1.5 and NaN raise HyperParameterError) while the hyper-parameters under test are
              accepted; an undeclared method has no field whose name reads as a rate or a noise beyond p, p_*;
- shape       `attention()` returns `(output, probabilities)` with the output in transformers' (B, L, H, d) layout,
              each element in its place (read from where noise on one head's values and on one position's queries
              moves the output). When it fails, the rules below are not run for that model;
- values      every value channel of every head reaches that head's output (also without an identity setting);
- params      every tensor a training step's gradient reaches is held by an optimizer;
- trained     every parameter `prepare()` adds receives a gradient, or is declared frozen (`frozen_parameters`);
- identity    at the method's `identity` setting it equals transformers' SDPA attention (outputs and gradients,
              train and eval mode, on the rows with a real token) on a model whose scores have a pre-trained model's
              spread (up to 30, MiniLM's), in fp32 and under bf16 and fp16 autocast, each within its precision's
              tolerance; skipped when the method declares none;
- finite      outputs, loss and gradients are finite under fp32 and under bf16 autocast, with and without padding,
              in training over several seeds; a failure names the rows that cause it, or the dropping when only
              training is not finite;
- padding     padded positions are never attended, in eval mode and in training over several seeds: changing what
              sits at the padded positions changes no real position's output, and the probabilities a method hands
              to `suite.attend` are 0 on padded keys; a failure names the likeliest cause;
- eval        evaluation is deterministic (two eval passes under different seeds agree) and does not depend on any
              stochastic parameter (eval outputs unchanged with each at 0 and at a high value);
- draws       with a stochastic parameter above 0, two training passes in a row differ (no mask kept across steps);
              with none, they agree (a method that draws says what it draws);
- expect      training rows sum, on average over draws, to what evaluation's sum to on the same inputs, unless the
              method declares `keeps_expectation = False`;
- gradient    in training and float64, autograd's derivative along a random direction of the attention parameters,
              and of the query and key projections alone, equals a central finite difference under the same draws
              (relative 1e-5 beyond rounding);
- device      a model the method is attached to, then moved to PyTorch's `meta` device (a stand-in for a GPU), runs
              in eval and train mode: no tensor kept as a plain attribute or made on the CPU;
- prepare     parameters and buffers that `prepare()` adds on a model on the `meta` device sit there too;
- fp16        under fp16 autocast, on the model with a pre-trained score spread, everything stays finite wherever it
              is finite in fp32 (skipped where `supports_fp16 = False`);
- hooks       two training steps through the hooks as the runner calls them: `training_step` returns the detached
              loss, `epoch_record()` and `record()` are JSON, `training_only_parameters()` is a count;
- window      (ModernBERT) the mask a local layer's method receives holds the sliding window, and no real query's
              output changes when only the keys and values beyond its window change, in eval and in training.

Once per model kind (comparing configurations themselves where they need to):
- lands       declared rates land on the probabilities handed to `suite.attend` (zeros evaluation does not have), at
              a share that follows the rate, independent along the axes each declaration `varies`;
- schedule    a declared schedule advances over a run's steps; mode: draws follow module.training, not autograd's
              mode; batch: a sample's eval outputs do not depend on its batch or the padded length; padding in bf16
              and fp16; long: 512 tokens; scaling: the `scaling` argument is used; edges: float hyper-parameters
              validate() accepts at 0, 0.5, 0.99, 1, 1.01, 2 run finite.

The padding, eval and value rules compare finite values only: NaN and inf are the finite rule's finding. The rules
live in `suite.api.check_layout` (shape, values), `check_contract` (params, trained, eval, device, prepare, hooks),
`check_padding`, `check_sampling` (draws, expect, gradient), `check_spread` (identity, fp16), `check_window`,
`check_meaning` (lands, schedule, mode) and `check_invariance` (batch, half-precision padding, long, scaling, edges);
the report types, the checked batch and the high rates in `suite.api.check_common`.

`python -m suite check METHOD [...]` is the same from the command line; `check_rules(name, rules, **hparams)` runs
the named rules alone (with hparams and shape). The tiny-model builders (`tiny_model`,
`tiny_config`, `padded_batch`, `tiny_tokenizer`, from `suite.api.tiny_models`) are the ones the test suite uses too.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Callable

import torch

from suite.api.attention import METHODS, AttentionMethod, HyperParameterError, probes, register_method
from suite.api.check_common import (  # noqa: F401  (probability_fields: public through suite.testing)
    ROWS,
    SEEDS,
    CheckReport,
    CheckResult,
    attached,
    checked_batch,
    forward,
    gradients,
    high_rate_hparams,
    probability_fields,
    rates_above_zero,
    rows,
    training_seeds,
    undeclared_stochastic,
)
from suite.api.check_contract import (
    check_deterministic,
    check_hooks,
    check_moved_model,
    check_parameters,
    check_prepare_device,
    check_rate_free_eval,
    check_trained,
)
from suite.api.check_invariance import check_batch, check_edges, check_half_padding, check_long, check_scaling
from suite.api.check_layout import check_shape, check_values
from suite.api.check_meaning import check_lands, check_mode, check_schedule
from suite.api.check_padding import check_padding
from suite.api.check_sampling import check_draws, check_expectation, check_gradient
from suite.api.check_spread import check_fp16, check_identity
from suite.api.check_window import check_window
from suite.api.tiny_models import (  # noqa: F401  (public through suite.testing)
    WORDS,
    padded_batch,
    seed_cpu,
    tiny_config,
    tiny_model,
    tiny_tokenizer,
)

MODEL_KINDS = ("bert", "roberta", "modernbert")
WINDOWED_KINDS = ("modernbert",)  # kinds with local layers, where the window rule runs
INVALID_PROBABILITIES = (-0.1, 1.5, math.nan)
# training passes per batch, each a forward and backward (one where nothing is drawn; the high rates add their own):
# in fp32, where a rare draw (every key of a row dropped) is looked for; in bf16, where a draw that is finite in fp32
# and not in bf16 is an overflow or an underflow, which does not wait for a rare draw
FINITE_SEEDS = {"fp32": SEEDS[:4], "bf16": SEEDS[:2]}
HIGH_RATES_LABEL = ", at high rates"  # appended to the setting of every result at the high rates
# the hint of a training-only non-finite value: dropping is what training adds
DROPPED_ROWS = ("where the method drops, a row whose keys are all dropped leaves nothing to normalise over (0/0, "
                "e.g. a renormalisation p / p.sum() over the kept keys); keep at least one key per row "
                "(suite.drop_scores keeps the diagonal; dropattention_col keeps a row's keys when all are dropped)")


# ---------------------------------------------------------------------------------------------------------
# The finite rule (the other rules live in the modules named above)
# ---------------------------------------------------------------------------------------------------------

def check_finite(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """Finite outputs, loss and gradients in fp32 and under bf16 autocast, padded and unpadded, train and eval."""
    model = attached(method, kind)
    results = []
    for precision, seeds in FINITE_SEEDS.items():
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                    else contextlib.nullcontext())
        bad = _non_finite(model, autocast, training_seeds(method, seeds)) + _non_finite_rows(model, autocast)
        results.append(CheckResult("finite", f"{kind}, {precision}", not bad,
                                   "; ".join(bad) if bad else "outputs, attention rows, loss and gradients finite "
                                   "(rows of 0 and 1 real tokens included)"))
    return results


def _non_finite(model, autocast, seeds) -> list[str]:
    found: dict[str, list[str]] = {}  # what was found: where (one line for train and eval when they agree)
    for padded in (True, False):
        batch = checked_batch(model, padded=padded)
        in_eval = _non_finite_pass(model, autocast, "eval", batch)
        for mode in ("train", "eval"):
            # the rare draw is looked for on the padded batch, whose first row is unpadded too; the unpadded batch is
            # there for the path a model takes without a mask
            what, seed = (in_eval, 0) if mode == "eval" else _first_non_finite(model, autocast, batch,
                                                                               seeds if padded else seeds[:1])
            if not what:
                continue
            if mode == "train" and not in_eval:
                text = f"non-finite {', '.join(what)} in training only (seed {seed}; evaluation is finite): " + (
                    DROPPED_ROWS)
            else:
                located = _locate(model, autocast, mode, batch, seed) if padded else []
                text = "; ".join(located) if located else f"non-finite {', '.join(what)}"
            found.setdefault(text, []).append(f"{mode}, {'padded' if padded else 'unpadded'}")
    return [f"{' and '.join(where)}: {text}" for text, where in found.items()]


def _first_non_finite(model, autocast, batch: tuple, seeds) -> tuple[list[str], int]:
    """What is not finite in the first training pass over `seeds` that has something, and its seed."""
    for seed in seeds:
        what = _non_finite_pass(model, autocast, "train", batch, seed)
        if what:
            return what, seed
    return [], 0


def _non_finite_pass(model, autocast, mode: str, batch: tuple, seed: int = 0) -> list[str]:
    """What is NaN or inf in one forward and backward: outputs (every row's logits, real tokens' final states), the
    loss, gradients."""
    ids, mask, labels = batch
    model.train(mode == "train")
    model.zero_grad()
    with autocast:
        out, loss = forward(model, ids, mask, labels, seed=seed)
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


def _locate(model, autocast, mode: str, batch: tuple, seed: int) -> list[str]:
    """Which rows of the padded batch make it non-finite, each group of rows run alone."""
    found = []
    for name, which in ROWS.items():
        what = _non_finite_pass(model, autocast, mode, rows(batch, which), seed)
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


def check_hparams(cls: type[AttentionMethod], hparams: dict[str, Any]) -> list[CheckResult]:
    """The hyper-parameters under test are accepted; impossible probabilities raise HyperParameterError."""
    results = []
    try:
        cls(cls.Config(**hparams))
        results.append(CheckResult("hparams", "accepted", True, f"{hparams or 'defaults'} accepted"))
    except Exception as exc:  # noqa: BLE001  any failure here is the finding
        results.append(CheckResult("hparams", "accepted", False, f"{type(exc).__name__}: {exc}"))
    undeclared = undeclared_stochastic(cls)
    if undeclared:
        results.append(CheckResult("hparams", "stochastic", False, f"Config field{'s' if len(undeclared) > 1 else ''} "
                                   f"{', '.join(undeclared)} read{'' if len(undeclared) > 1 else 's'} as a rate or a "
                                   "noise's size, and the method declares no stochastic parameters, so no rule varies "
                                   f"{'them' if len(undeclared) > 1 else 'it'} (the naming rule covers p, p_* only): "
                                   f"declare stochastic = (suite.Stochastic({undeclared[0]!r}, ...),), or () when "
                                   "nothing is drawn"))
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
    """Runs one check (unless check_rules left it out); an exception inside the method becomes a failed result
    instead of ending the check."""
    only = _ONLY.get()
    if only is not None and check not in only:
        return
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


# every rule's name, as CheckResult.check gives it
RULES = ("hparams", "shape", "values", "params", "trained", "identity", "finite", "padding", "eval", "draws", "expect",
         "gradient", "device", "prepare", "fp16", "hooks", "window", "lands", "schedule", "mode", "batch", "long",
         "scaling", "edges")
# the rules check_rules runs (with hparams and shape, which gate the others); None: every rule
_ONLY: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("suite_check_only", default=None)


def check_rules(name_or_class: str | type[AttentionMethod], rules, **hparams: Any) -> CheckReport:
    """`check_method` on the named rules alone (and hparams and shape, which gate the others), on every model and at
    both configurations: what a test of one rule, or a method's author after a fix, runs."""
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        raise ValueError(f"no such rule: {', '.join(unknown)} (the rules: {', '.join(RULES)})")
    token = _ONLY.set(frozenset(rules) | {"shape"})
    try:
        return check_method(name_or_class, **hparams)
    finally:
        _ONLY.reset(token)


def check_method(name_or_class: str | type[AttentionMethod], **hparams: Any) -> CheckReport:
    """Run every check on a registered method (its defaults, overridden by `hparams`) and return the report."""
    cls = resolve_method(name_or_class)
    report = CheckReport(cls.name, hparams)
    report.results.extend(check_hparams(cls, hparams))
    if any(r.setting == "accepted" and r.passed is False for r in report.results):
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


@contextlib.contextmanager
def temporary_methods():
    """Registers methods for one `with` block and removes them at its end (a test's toy or planted methods, which
    `check_method` and runs find by name): `with temporary_methods() as add: add(MyMethod, "my_method")`."""
    names: list[str] = []

    def add(cls: type[AttentionMethod], name: str) -> str:
        register_method(name)(cls)
        names.append(name)
        return name

    try:
        yield add
    finally:
        for name in names:
            METHODS.remove(name)


def _model_checks(cls: type[AttentionMethod], hparams: dict[str, Any], report: CheckReport) -> None:
    report.high_rates = high_rate_hparams(cls, hparams)
    variants = [("", hparams)] + ([(HIGH_RATES_LABEL, report.high_rates)] if report.high_rates else [])
    for kind in MODEL_KINDS:
        seed_cpu(0)
        if cls.identity is None:
            _guarded(report.results, "identity", kind, lambda: CheckResult("identity", kind, None,
                                                                            "no identity setting declared"))
        else:
            _guarded(report.results, "identity", kind, lambda: check_identity(cls, kind))
        for label, values in variants:
            first = len(report.results)
            _rules(cls, values, kind, report.results, high=bool(label))
            _leave_to_padding(report.results[first:])
            for r in report.results[first:]:
                r.setting += label
            if not label and not any(r.check == "shape" and r.passed is False for r in report.results[first:]):
                _meaning(cls, hparams, report.high_rates, kind, report.results)
                _leave_batch(report.results[first:])


def _leave_batch(results: list[CheckResult]) -> None:
    """A sample whose output reads padding, or an evaluation that draws, depends on its batch as a consequence: the
    batch rule's finding is then the padding or eval rule's."""
    cause = next((r.check for r in results if r.check in ("padding", "eval") and r.passed is False), None)
    for r in results:
        if cause and r.check == "batch" and r.passed is False:
            r.passed, r.detail = None, f"not judged: see the {cause} check ({r.detail.split(':')[0]})"


def _meaning(cls: type[AttentionMethod], hparams: dict[str, Any], high: dict[str, Any] | None, kind: str,
             results: list[CheckResult]) -> None:
    """The rules that run once per model kind: on what the draws mean (lands, schedule, mode; at both
    configurations where they compare them) and on what evaluation must not depend on (batch, padding in half
    precision, long inputs, scaling, edges)."""
    def new():
        return cls(cls.Config(**hparams))

    _guarded(results, "lands", kind, lambda: check_lands(cls, hparams, high, kind))
    _guarded(results, "schedule", kind, lambda: check_schedule(cls, high or hparams, kind))
    _guarded(results, "mode", kind, lambda: check_mode(new, kind, rates_above_zero(cls, hparams)))
    _guarded(results, "batch", kind, lambda: check_batch(new(), kind))
    _guarded(results, "padding", kind, lambda: check_half_padding(new(), kind))
    _guarded(results, "scaling", kind, lambda: check_scaling(new(), kind))
    if kind == MODEL_KINDS[0]:  # neither depends on the model kind
        _guarded(results, "long", kind, lambda: check_long(cls, hparams, kind))
        _guarded(results, "edges", kind, lambda: check_edges(cls, hparams, kind))


def _leave_to_padding(results: list[CheckResult]) -> None:
    """A finite difference cannot follow a padded key's score (score plus the mask's minimum is the minimum in
    floating point) where autograd does: with weight on padded keys, the gradient rule's gap is the padding rule's
    finding."""
    if any(r.check == "padding" and r.passed is False for r in results):
        for r in results:
            if r.check == "gradient" and r.passed is False:
                r.passed, r.detail = None, ("not judged: real queries put weight on padded keys (see the padding "
                                            "check), whose scores a finite difference cannot move")


def _rules(cls: type[AttentionMethod], values: dict[str, Any], kind: str, results: list[CheckResult],
           high: bool = False) -> None:
    """Every rule but hparams and identity, for one configuration on one model kind. At high rates the values, eval,
    params, trained and prepare rules are left out and the device rule runs in training only: evaluation is
    rate-free (the eval rule compares it with the high rates'), and which parameters there are, which of them train
    and where prepare() puts its tensors do not hang on a rate."""
    def new():
        return cls(cls.Config(**values))

    _guarded(results, "shape", kind, lambda: check_shape(new(), kind))
    if results[-1].passed is False:  # every later check would only see the scrambled outputs or the same error
        results.append(CheckResult("others", kind, None, "not run on this model: " + (
            "the model does not run" if "raised" in results[-1].detail else "the output layout is wrong")))
        return
    rates = rates_above_zero(cls, values)
    if not high:
        _guarded(results, "values", kind, lambda: check_values(new(), kind))
    if not high:  # which parameters exist, and which an optimizer holds or a gradient reaches, is no rate's doing
        _guarded(results, "params", kind, lambda: check_parameters(new(), kind))
        _guarded(results, "trained", kind, lambda: check_trained(new(), kind))
    # finite first: the padding and eval checks compare finite values only and leave NaN and inf to it
    _guarded(results, "finite", kind, lambda: check_finite(new(), kind))
    _guarded(results, "padding", kind, lambda: check_padding(new(), kind))
    if not high:  # the rate-free part compares evaluation at this configuration with evaluation at the high rates
        _guarded(results, "eval", kind, lambda: check_deterministic(new(), kind))
        _guarded(results, "eval", kind, lambda: check_rate_free_eval(cls, values, kind))
    _guarded(results, "draws", kind, lambda: check_draws(new(), kind, rates))
    _guarded(results, "expect", kind, lambda: check_expectation(new(), kind, rates))
    _guarded(results, "gradient", kind, lambda: check_gradient(new(), kind))
    # at high rates in training only: evaluation is rate-free (the eval rule), so it ran at the configuration
    _guarded(results, "device", kind, lambda: check_moved_model(new(), kind, ("train",) if high else ("eval", "train")))
    if not high:
        _guarded(results, "prepare", kind, lambda: check_prepare_device(new(), kind))
    _guarded(results, "fp16", kind, lambda: check_fp16(new(), kind))
    _guarded(results, "hooks", kind, lambda: check_hooks(new(), kind))
    if kind in WINDOWED_KINDS:
        _guarded(results, "window", kind, lambda: check_window(new(), kind))
