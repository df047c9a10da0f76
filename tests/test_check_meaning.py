"""Issue 64's mistakes, each a method that runs and trains, registered and run through the rules it plants: each fails
the rule that tests what it gets wrong (where its randomness lands and its unit, batch invariance, padding in half
precision, a 512-token input, the scaling, the edges of a parameter's domain, a schedule, the training flag, the
stochastic parameters it declares or should, the gradient), with a message that names the cause."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import Rate

import suite
from suite.api import check_sampling, testing
from suite.api.stochastic import stochastic_fields
from suite.methods.entmax_attention import entmax_bisect
from suite.methods.structured_dropout import DropHead

pytestmark = pytest.mark.usefixtures("one_thread")


PROBS = (suite.Stochastic("p"),)  # what each planted dropout claims: a rate on the probabilities, per entry


def _probs(query, key, scaling, attention_mask):
    return suite.softmax(suite.scores(query, key, scaling, attention_mask))


class ValuesDropout(suite.AttentionMethod):
    """Dropout on the values instead of the probabilities."""
    Config, stochastic = Rate, PROBS

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        value = F.dropout(value, self.cfg.p, training=module.training)
        return suite.attend(module, _probs(query, key, scaling, attention_mask), value)


class OutputDropout(suite.AttentionMethod):
    """Dropout on the attention output instead of the probabilities."""
    Config, stochastic = Rate, PROBS

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        out, probs = suite.attend(module, _probs(query, key, scaling, attention_mask), value)
        return F.dropout(out, self.cfg.p, training=module.training), probs


class SharedHeadMask(suite.AttentionMethod):
    """One dropout mask for all heads: drawn with shape (B, 1, L, L)."""
    Config, stochastic = Rate, PROBS

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        if module.training:
            b, _, lq, lk = p.shape
            p = p * (torch.rand(b, 1, lq, lk) >= self.cfg.p) / (1 - self.cfg.p)
        return suite.attend(module, p, value)


class PerBatchDropHead(DropHead):
    """DropHead whose heads are drawn once per batch, shared by every sample."""

    def head_factors(self, batch, heads, rate, device):
        return super().head_factors(1, heads, rate, device).expand(batch, heads)


class IgnoredRate(suite.AttentionMethod):
    """Dropout at a rate written into the code (0.1), whatever the Config says."""
    Config, stochastic = Rate, PROBS

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        return suite.attend(module, suite.probs_dropout(_probs(query, key, scaling, attention_mask), 0.1, module),
                            value)


class PaddedTopK(suite.AttentionMethod):
    """Top-k with k taken from the padded key length (a quarter of it)."""
    stochastic = ()

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling, attention_mask)
        k = math.ceil(s.shape[-1] / 4)
        s = s.masked_fill(s < torch.topk(s, k, dim=-1).values[..., -1:], suite.mask_fill_value(s))
        return suite.attend(module, suite.softmax(s), value)


class PaddedLogN(suite.AttentionMethod):
    """Log-n scaling with n the padded key length."""
    stochastic = ()

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        return suite.attend(module, _probs(query, key, scaling * math.log(key.shape[-2]), attention_mask), value)


@dataclasses.dataclass
class Alpha:
    alpha: float = 1.5


class UnguardedAlpha(suite.AttentionMethod):
    """alpha-entmax whose validation only asks alpha > 0: alpha must stay above 1."""
    Config, stochastic = Alpha, ()

    def validate(self):
        super().validate()
        if not self.cfg.alpha > 0:
            raise suite.HyperParameterError("alpha must be > 0")

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling, attention_mask).float()
        probs = entmax_bisect(s, torch.tensor(self.cfg.alpha, dtype=s.dtype), dim=-1)
        return suite.attend(module, probs.to(query.dtype), value)


class HalfFastPath(suite.AttentionMethod):
    """A half-precision fast path (SDPA) that forgets the mask."""
    stochastic = ()

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if query.dtype in (torch.bfloat16, torch.float16):
            return F.scaled_dot_product_attention(query, key, value, scale=scaling).transpose(1, 2), None
        return suite.attend(module, _probs(query, key, scaling, attention_mask), value)


class HalfScaledTwice(suite.AttentionMethod):
    """A path taken in one half precision only that scales the queries before the scores scale them again."""
    identity: dict = {}
    half = torch.bfloat16

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if query.dtype == self.half:
            query = query * scaling
        return suite.attend(module, _probs(query, key, scaling, attention_mask), value)


class StuckSchedule(DropHead):
    """Scheduled DropHead whose rate reads a progress that nothing advances."""

    def rate(self):
        return self.cfg.p


class PositionTable(suite.AttentionMethod):
    """A relative-position bias from a table of 128 entries: a shape error past 128 tokens."""
    stochastic = ()

    def prepare(self, model):
        for module in suite.attention_modules(model):
            like = module.query.weight
            module.register_parameter("toy_bias", torch.nn.Parameter(torch.zeros(128, device=like.device)))

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        length = key.shape[-2]
        position = torch.arange(length, device=key.device)
        offsets = (position[None, :] - position[:, None]).abs()
        s = suite.scores(query, key, scaling, attention_mask) + module.toy_bias[offsets]
        return suite.attend(module, suite.softmax(s), value)


class HeadDim64(suite.AttentionMethod):
    """Scores scaled by a hard-coded 1/sqrt(64)."""
    stochastic = ()

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        return suite.attend(module, _probs(query, key, 1 / 8, attention_mask), value)


@dataclasses.dataclass
class DropRate:
    drop_rate: float = 0.1


class DropRateInEval(suite.AttentionMethod):
    """A rate field named drop_rate, with dropout left on in eval (a generator re-seeded at every call)."""
    Config = DropRate

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        g = torch.Generator().manual_seed(7)
        keep = torch.rand(p.shape, generator=g) >= self.cfg.drop_rate
        return suite.attend(module, p * keep / (1 - self.cfg.drop_rate), value)


class DeclaredDropRateInEval(DropRateInEval):
    stochastic = (suite.Stochastic("drop_rate"),)


@dataclasses.dataclass
class Sigma:
    sigma: float = 0.5


class ScoreNoise(suite.AttentionMethod):
    """Gaussian noise of size sigma on the scores in training (a correct method once it declares sigma)."""
    Config = Sigma

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling, attention_mask)
        if module.training and self.cfg.sigma > 0:
            s = s + self.noise(s) * self.cfg.sigma
        return suite.attend(module, suite.softmax(s), value)

    def noise(self, s):
        return torch.randn_like(s)


class DeclaredScoreNoise(ScoreNoise):
    stochastic = (suite.Stochastic("sigma", kind="scale", lands="elsewhere"),)


class SameNoise(DeclaredScoreNoise):
    """Draws the same noise at every step (a generator re-seeded at every call)."""

    def noise(self, s):
        return torch.randn(s.shape, generator=torch.Generator().manual_seed(3))


class GradEnabledFlag(suite.AttentionMethod):
    """Decides whether to drop from torch.is_grad_enabled() instead of module.training."""
    Config, stochastic = Rate, PROBS

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        if torch.is_grad_enabled():
            p = F.dropout(p, self.cfg.p)
        return suite.attend(module, p, value)


class DataDropout(suite.AttentionMethod):
    """Dropout at the configured rate written into the probabilities through .data."""
    Config, stochastic = dataclasses.make_dataclass("Config", [("p", float, 0.1)]), PROBS

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        if module.training:
            p.data.mul_((torch.rand_like(p) >= self.cfg.p) / (1 - self.cfg.p))
        return suite.attend(module, p, value)


# name: (planted method, {rule it fails: words its message holds}, whether it fails on both model kinds)
PLANTED = {
    "values_dropout": (ValuesDropout, {"lands": "the draws land elsewhere (dropout applied to the values"}, True),
    "output_dropout": (OutputDropout, {"lands": "or to the attention output"}, True),
    "shared_head_mask": (SharedHeadMask, {"lands": "one mask shared by all heads"}, True),
    "per_batch_drophead": (PerBatchDropHead, {"lands": "drawn once per batch"}, True),
    "ignored_rate": (IgnoredRate, {"lands": "the configured rate is ignored"}, True),
    "padded_topk": (PaddedTopK, {"batch": "depends on its batch or on the padded length"}, True),
    "padded_log_n": (PaddedLogN, {"batch": "depends on its batch or on the padded length"}, True),
    "unguarded_alpha": (UnguardedAlpha, {"edges": "is accepted by validate() but gives non-finite"}, False),
    "half_fast_path": (HalfFastPath, {"padding": "a half-precision path that drops"}, True),
    "stuck_schedule": (StuckSchedule, {"schedule": "never advances"}, True),
    "position_table": (PositionTable, {"long": "at 512 tokens raised IndexError"}, False),
    "head_dim_64": (HeadDim64, {"scaling": "1/sqrt(64) is right for a head dim of 64 only"}, True),
    "drop_rate_undeclared": (DropRateInEval, {"hparams": "drop_rate reads as a rate"}, False),
    "drop_rate_in_eval": (DeclaredDropRateInEval, {"eval": "dropout is left on in eval mode"}, True),
    "score_noise_undeclared": (ScoreNoise, {"draws": "the method draws without saying what it draws"}, True),
    "same_noise": (SameNoise, {"draws": "no new dropout mask is drawn per step"}, True),
    "grad_enabled_flag": (GradEnabledFlag, {"mode": "not from torch.is_grad_enabled()"}, True),
}


@pytest.mark.parametrize("case", PLANTED)
def test_a_planted_mistake_fails_the_rule_that_names_its_cause(case, register):
    cls, failing, both_kinds = PLANTED[case]
    report = testing.check_rules(register(cls, f"planted64_{case}"), failing)
    failures = [r for r in report.failures() if r.check in failing and failing[r.check] in r.detail]
    assert failures, str(report)
    if both_kinds:
        # on both BERT and RoBERTa; the tiny ModernBERT too where the mistake reaches it
        assert {"bert", "roberta"} <= {r.setting.split(",")[0] for r in failures}, str(report)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_half_precision_only_deviation_fails_the_identity_rule(precision, register):
    """The identity rule runs in bf16 and fp16 too: a deviation in one of them fails it there, naming the precision,
    while fp32 and the other precision agree with SDPA."""
    half = type(f"HalfScaledTwice_{precision}", (HalfScaledTwice,),
                {"half": {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]})
    cls = suite.METHODS.get(register(half, f"planted64_half_scaled_twice_{precision}"))
    for kind in testing.MODEL_KINDS:
        result = testing.check_identity(cls, kind)
        assert result.passed is False, result
        assert f"under {precision} autocast, where fp32 agrees" in result.detail, result
        assert "attention output differs from SDPA's" in result.detail, result


@pytest.mark.slow  # every rule on three models (about 15 s): `python -m pytest -m slow`
def test_a_declared_noise_method_passes_and_nothing_drawn_is_measured(register):
    """Score noise that declares sigma passes every rule; a method that draws nothing is told so only when two
    training passes agree."""
    report = testing.check_method(register(DeclaredScoreNoise, "correct64_score_noise"))
    assert report.ok, str(report)
    assert any(r.check == "eval" and "sigma=0.0" in r.detail for r in report.results), str(report)
    uniform = testing.check_draws(suite.METHODS.get("uniform")(), "bert", [])
    assert uniform.passed is True and "measured" in uniform.detail, uniform


def test_data_dropout_at_the_configured_rate_fails_the_gradient_rule_at_every_seed(register):
    cls = suite.METHODS.get(register(DataDropout, "planted64_data_dropout"))
    for kind in ("bert", "roberta"):
        for seed in range(3):
            result = check_sampling.check_gradient(cls(), kind, seed)
            assert result.passed is False and "does not differentiate the forward" in result.detail, result


@pytest.mark.parametrize("name", ["topk", "rela", "entmax_alpha", "drophead"])
def test_correct_methods_pass_the_gradient_rule_at_every_seed(name):
    cls = suite.METHODS.get(name)
    for kind in ("bert", "roberta"):
        for seed in range(3):
            result = check_sampling.check_gradient(cls(), kind, seed)
            assert result.passed is True, result


def test_a_declaration_names_real_axes_and_kinds():
    with pytest.raises(TypeError):
        suite.Stochastic("p", varies=("batch",))
    with pytest.raises(TypeError):
        suite.Stochastic("sigma", kind="noise")
    assert stochastic_fields(suite.METHODS.get("drophead"))[0].varies == ("sample", "head")
    assert [s.field for s in stochastic_fields(suite.METHODS.get("attendout"))] == ["p_max", "p_init", "p_defender"]
