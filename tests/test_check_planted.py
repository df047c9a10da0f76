"""Methods with the bugs method authors make, each registered as a method (the padding one through a real entry
point) and run through the check: each fails, in the check that names its cause (run alone) and, in the slow tier, in
no other (the whole check), with a message that says what is wrong; every built-in method passes (slow tier)."""
import pytest
import torch
from conftest import Rate
from test_check import (  # the planted methods tests/test_check.py already has, and its plugin fixture
    CpuGate,
    DropoutInEval,
    HeadsFirstOutput,
    OutputOnly,
    TensorRecord,
    UndetachedLoss,
    leaky_plugin,  # noqa: F401
)

import suite
from suite.api import testing

pytestmark = pytest.mark.usefixtures("one_thread")


def _attention(module, query, key, value, attention_mask, scaling):
    return suite.attend(module, suite.softmax(suite.scores(query, key, scaling, attention_mask)), value)


class NaNOnPaddedRow(suite.AttentionMethod):
    """Masks padded keys with -inf: a row with no real token is a softmax over nothing, 0/0."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling)
        s = s.masked_fill(~suite.valid_keys(attention_mask, s), float("-inf"))
        return suite.attend(module, torch.softmax(s, dim=-1), value)


class NaNOnLengthOneRow(suite.AttentionMethod):
    """Standardises each row's scores over its real keys with the unbiased variance: 0/0 where there is one key."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling)
        valid = suite.valid_keys(attention_mask, s)
        n = valid.sum(-1, keepdim=True)
        mean = (s * valid).sum(-1, keepdim=True) / n.clamp(min=1)
        var = ((s - mean).square() * valid).sum(-1, keepdim=True) / (n - 1)
        s = (s - mean) / (var + 1e-6).sqrt()
        return suite.attend(module, suite.softmax(s if attention_mask is None else s + attention_mask), value)


class LazyModuleParameter(suite.AttentionMethod):
    """Creates its per-head query scale at the first forward instead of in prepare()."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if not hasattr(module, "toy_scale"):
            module.toy_scale = torch.nn.Parameter(torch.ones(module.num_attention_heads, 1, 1, dtype=query.dtype,
                                                             device=query.device))
        return _attention(module, query * module.toy_scale, key, value, attention_mask, scaling)


class LazyMethodParameter(suite.AttentionMethod):
    """Keeps a learned temperature on the method object, created at the first forward: no optimizer sees it."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if not hasattr(self, "temperature"):
            self.temperature = torch.nn.Parameter(torch.ones(()))
        return _attention(module, query / self.temperature, key, value, attention_mask, scaling)


class HalfValueChannels(suite.AttentionMethod):
    """Zeroes the second half of each head's value channels (a leftover mask); it declares no identity setting."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        keep = torch.arange(value.shape[-1], device=value.device) < value.shape[-1] // 2
        return _attention(module, query, key, value * keep, attention_mask, scaling)


class ReshapedHeads(suite.AttentionMethod):
    """Reshapes the (B, H, L, d) product into (B, L, H, d) instead of transposing it: the right shape, scrambled."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        b, h, length, d = value.shape
        return torch.matmul(p, value).reshape(b, length, h, d), p


class ViewedFlat(suite.AttentionMethod):
    """Views the (B, H, L, d) product as (B, L, H * d): the right number of elements in the wrong layout."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        b, h, length, d = value.shape
        return torch.matmul(p, value).view(b, length, h * d), p


class SampledKey(suite.AttentionMethod):
    """Draws one key per query among the real keys (torch.multinomial): a row with no real key has nothing to draw."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling, attention_mask)
        p = suite.softmax(s)
        real = p.masked_fill(~suite.valid_keys(attention_mask, s).expand_as(p), 0.0)
        torch.multinomial(real.flatten(0, -2), 1)
        return suite.attend(module, p, value)


class LateParameter(suite.AttentionMethod):
    """Registers its per-head gate in setup_training(), after the optimizer was built."""

    def setup_training(self, ctx):
        for module in suite.attention_modules(ctx.model):
            module.register_parameter("toy_gate", torch.nn.Parameter(torch.ones(module.num_attention_heads, 1, 1)))

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        gate = getattr(module, "toy_gate", None)
        return _attention(module, query if gate is None else query * gate, key, value, attention_mask, scaling)


# name: (planted method, the checks it must fail, words every failure's message holds)
PLANTED = {
    "nan_on_padded_row": (NaNOnPaddedRow, {"finite"}, "on a fully padded row"),
    "nan_on_length_one_row": (NaNOnLengthOneRow, {"finite"}, "on a length-1 row"),
    "lazy_module_parameter": (LazyModuleParameter, {"params"}, "the forward pass created parameters"),
    "lazy_method_parameter": (LazyMethodParameter, {"params"}, "no optimizer holds (method.temperature)"),
    "half_value_channels": (HalfValueChannels, {"values"}, "channels [4, 5, 6, 7]"),
    "reshaped_heads": (ReshapedHeads, {"shape"}, "a (B, H, L, d) result reshaped (.view/.reshape)"),
    "viewed_flat": (ViewedFlat, {"shape"}, "a (B, H, L, d) result reshaped (.view/.reshape)"),
    "sampled_key": (SampledKey, {"shape"}, "on a fully padded row (run alone)"),
    "late_parameter": (LateParameter, {"params"}, "setup_training() added parameters"),
    "heads_first": (HeadsFirstOutput, {"shape"}, "needs .transpose(1, 2)"),
    # it also draws in training without declaring what: the draws rule's finding
    "dropout_in_eval": (DropoutInEval, {"eval", "draws"}, {"eval": "the method samples (dropout, random rates) in "
                                                          "evaluation", "draws": "draws without saying what it draws"}),
    "output_only": (OutputOnly, {"shape"}, "it must return (output, probabilities)"),
    "cpu_gate": (CpuGate, {"prepare"}, "toy_gate (cpu)"),
    "tensor_record": (TensorRecord, {"hooks"}, "record() is not JSON"),
    "undetached_loss": (UndetachedLoss, {"hooks"}, "that requires grad"),
}
LOCAL_ROW = "in a local layer a padded query's window may hold no real key"
# what a message says when it blames another cause than the planted one
OTHER_CAUSES = {"padding": "attends to padding", "eval": "samples", "shape": "needs .transpose(1, 2)",
                "values": "value channels", "params": "create them in prepare()"}


def _planted_failures(case: str, register, every_rule: bool) -> list:
    """The failures of planted method `case` in the checks it plants (or in every check), each asserted to name its
    cause on every model and to blame no other."""
    cls, failing, words = PLANTED[case]
    name = register(cls, f"planted_{case}")
    report = testing.check_method(name) if every_rule else testing.check_rules(name, failing)
    failures = report.failures()
    assert {r.check for r in failures} == failing, str(report)
    assert {r.setting.split(",")[0] for r in failures} == set(testing.MODEL_KINDS), str(report)
    for r in failures:
        # ModernBERT's local layer gives padded queries of real rows no key: those rows raise first
        want = words[r.check] if isinstance(words, dict) else words
        assert want in r.detail or r.setting.startswith("modernbert") and LOCAL_ROW in r.detail, str(report)
    blamed = " ".join(r.detail for r in failures)
    for check, cause in OTHER_CAUSES.items():
        if check not in failing:
            assert cause not in blamed, f"{case}: a message blames {cause!r}\n{report}"
    return failures


@pytest.mark.parametrize("case", PLANTED)
def test_a_planted_bug_fails_the_check_that_names_its_cause(case, register):
    _planted_failures(case, register, every_rule=False)


@pytest.mark.slow  # the whole check on three models, about 15 s each: `python -m pytest -m slow`
@pytest.mark.parametrize("case", PLANTED)
def test_a_planted_bug_fails_no_other_check(case, register):
    _planted_failures(case, register, every_rule=True)


def test_a_reshape_is_not_told_to_transpose(register):
    """Only an output that is the transpose of the expected layout is told it needs .transpose(1, 2)."""
    for cls in (ReshapedHeads, ViewedFlat):
        report = testing.check_method(register(cls, f"planted_{cls.__name__.lower()}"))
        assert "needs .transpose(1, 2)" not in str(report) and "heads and positions are mixed up" in str(report)


def test_nan_on_a_padded_row_is_not_blamed_on_padding_or_evaluation(register):
    name = register(NaNOnPaddedRow, "planted_nan_row")
    cls = suite.METHODS.get(name)
    padding = testing.check_padding(cls(), "bert")
    assert [r.passed for r in padding] == [True, True, True, True], padding  # real tokens never see the NaN row
    assert testing.check_deterministic(cls(), "bert").passed is True
    finite = testing.check_finite(cls(), "bert")
    assert all(r.passed is False and "non-finite outputs, loss" in r.detail for r in finite), finite


def test_a_method_that_ignores_the_mask_fails_the_padding_and_window_checks_only(leaky_plugin):  # noqa: F811
    report = testing.check_method(leaky_plugin)
    # the mask it ignores also holds ModernBERT's window: the window rule fails with it, on ModernBERT alone
    assert {r.check for r in report.failures()} == {"padding", "window"}, str(report)
    assert {r.setting.split(",")[0] for r in report.failures() if r.check == "window"} == {"modernbert"}
    assert "the method attends to padding" in str(report) and "on padded keys" in str(report)


@pytest.mark.slow  # the whole check on three models, about 20 s
def test_a_correct_method_passes_every_check():
    report = testing.check_method("vanilla")
    assert report.ok, str(report)
    assert {r.check for r in report.results if r.passed} >= {"shape", "values", "params", "finite", "padding", "eval"}


BUILT_IN = sorted(n for n in suite.METHODS.names() if suite.METHODS.get(n).__module__.startswith("suite.methods"))


@pytest.mark.slow  # the whole check on three models, 10-30 s each
@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_method_passes_the_check(name):
    report = testing.check_method(name)
    assert report.ok, str(report)


class OneSinkhornStep(suite.AttentionMethod):
    """Normalises the weights over the queries, then over the keys again: a query's scores move every row of its
    head, yet every output sits in its place (a correct method)."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        p = p / p.sum(-2, keepdim=True).clamp_min(1e-6)
        return suite.attend(module, p / p.sum(-1, keepdim=True).clamp_min(1e-6), value)


class OwnGradientLeaf(suite.AttentionMethod):
    """Takes the weights through a detached copy that requires grad (to read a gradient of its own later): a tensor
    made inside one forward, not a parameter (a correct method)."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        leaf = p.detach().requires_grad_()
        return suite.attend(module, leaf + (p - p.detach()), value)


def test_coupled_rows_or_a_gradient_of_its_own_are_no_bug(register):
    sinkhorn = suite.METHODS.get(register(OneSinkhornStep, "correct_sinkhorn_step"))
    assert testing.check_shape(sinkhorn(), "bert").passed is True  # a query's noise reaches other rows
    assert testing.check_values(sinkhorn(), "roberta").passed is True
    own_gradient = suite.METHODS.get(register(OwnGradientLeaf, "correct_own_gradient"))
    result = testing.check_parameters(own_gradient(), "bert")
    assert result.passed is True, result


class ModuleGenerator(suite.AttentionMethod):
    """Dropout on the probabilities drawn from a generator each attention module keeps (made in prepare()): a
    correct method, whose compared passes must each start from the same generator state."""
    Config = Rate

    def prepare(self, model):
        for module in suite.attention_modules(model):
            module.toy_rng = torch.Generator().manual_seed(module.layer_idx)

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        if module.training:
            p = p * (torch.rand(p.shape, generator=module.toy_rng) >= self.cfg.p) / (1 - self.cfg.p)
        return suite.attend(module, p, value)


class LazyGenerator(suite.AttentionMethod):
    """Dropout from a generator of the method's own made at its first training call, not in prepare()."""
    Config = Rate

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        if module.training:
            if getattr(self, "rng", None) is None:
                self.rng = torch.Generator().manual_seed(0)
            p = p * (torch.rand(p.shape, generator=self.rng) >= self.cfg.p) / (1 - self.cfg.p)
        return suite.attend(module, p, value)


class Holder(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        self.rng = torch.Generator().manual_seed(seed)


class ChildModuleGenerator(ModuleGenerator):
    """The generator on a child module of each attention module."""

    def prepare(self, model):
        for module in suite.attention_modules(model):
            module.toy_holder = Holder(module.layer_idx)

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        if module.training:
            p = p * (torch.rand(p.shape, generator=module.toy_holder.rng) >= self.cfg.p) / (1 - self.cfg.p)
        return suite.attend(module, p, value)


class StepCounter(suite.AttentionMethod):
    """Each training call's mask seeded by a call counter, a plain int on the method."""
    Config = Rate

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.calls = 0

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        if module.training:
            self.calls += 1
            rng = torch.Generator().manual_seed(self.calls)
            p = p * (torch.rand(p.shape, generator=rng) >= self.cfg.p) / (1 - self.cfg.p)
        return suite.attend(module, p, value)


@pytest.mark.parametrize("method", [ModuleGenerator, LazyGenerator, ChildModuleGenerator, StepCounter],
                         ids=lambda m: m.__name__)
def test_draw_state_of_its_own_is_no_bug(register, method):
    """The rules that compare two training passes under the same draws run the second on a copy taken before the
    first whenever training draws: state kept between calls (a generator on the modules, one made at the first call,
    one on a child module, a step counter) cannot all be told apart by inspection."""
    name = register(method, f"correct_{method.__name__.lower()}")
    report = testing.check_rules(name, ["padding", "gradient", "fp16"])
    assert report.ok, str(report)
