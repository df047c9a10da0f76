"""Bugs the method check used to miss (issue 52's planted mistakes, issue 56's leaking DropKey), each a method that
runs and trains, registered and run through the rules that name its cause (and, in the slow tier, through the whole
check): each fails in those rules alone, with a message that says so and does not blame another cause."""
import dataclasses
import re

import pytest
import torch
from conftest import Rate

import suite
from suite.api import check_spread, testing

pytestmark = pytest.mark.usefixtures("one_thread")


def _probs(query, key, scaling, attention_mask):
    return suite.softmax(suite.scores(query, key, scaling, attention_mask))


class ReseededEvalDropout(suite.AttentionMethod):
    """Dropout from a generator of its own, re-seeded at every call "for reproducibility", and left on in eval mode:
    every eval pass draws the same mask, so two eval passes agree."""
    Config = Rate

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        g = torch.Generator(device=p.device).manual_seed(1234)
        keep = torch.rand(p.shape, generator=g, device=p.device) >= self.cfg.p
        return suite.attend(module, p * keep / (1 - self.cfg.p), value)


class DataDropout(suite.AttentionMethod):
    """Dropout written into the probabilities through .data: the forward is right, the gradient is not."""
    Config = Rate

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        if module.training:
            p.data.mul_((torch.rand_like(p) >= self.cfg.p) / (1 - self.cfg.p))
        return suite.attend(module, p, value)


class CpuAttribute(suite.AttentionMethod):
    """Keeps a per-head score offset as a plain attribute made in prepare(): model.to(device) leaves it on the CPU."""
    identity = None

    def prepare(self, model):
        for module in suite.attention_modules(model):
            module.toy_offset = torch.zeros(1, module.num_attention_heads, 1, 1)

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling, attention_mask) + module.toy_offset
        return suite.attend(module, suite.softmax(s), value)


class HandWrittenSoftmax(suite.AttentionMethod):
    """exp / sum in the scores' own dtype: fine in fp32, inf / inf under fp16 at a pre-trained model's scores."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        e = torch.exp(torch.matmul(query, key.transpose(-1, -2)) * scaling)
        if attention_mask is not None:
            e = e * (attention_mask == 0)
        return suite.attend(module, e / e.sum(-1, keepdim=True).clamp_min(1e-30), value)


class CachedMask(suite.AttentionMethod):
    """Draws its dropout mask once per layer and shape, then reuses it at every step."""
    Config = Rate

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.masks = {}

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        if module.training:
            where = (module.layer_idx, tuple(p.shape))
            if where not in self.masks:
                self.masks[where] = (torch.rand(p.shape, device=p.device) >= self.cfg.p) / (1 - self.cfg.p)
            p = p * self.masks[where]
        return suite.attend(module, p, value)


class NoRescale(suite.AttentionMethod):
    """Attention-probability dropout without the 1/(1-p) rescale."""
    Config = Rate

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        if module.training:
            p = p * (torch.rand_like(p) >= self.cfg.p)
        return suite.attend(module, p, value)


class DetachedTemperature(suite.AttentionMethod):
    """A learned per-head temperature used through .detach(): registered, held by the optimizer, never trained."""

    def prepare(self, model):
        for module in suite.attention_modules(model):
            like = next(module.parameters())  # ModernBERT has no `query` projection (a fused Wqkv)
            module.register_parameter("toy_temperature", torch.nn.Parameter(
                torch.ones(module.num_attention_heads, 1, 1, dtype=like.dtype, device=like.device)))

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling, attention_mask) / module.toy_temperature.detach()
        return suite.attend(module, suite.softmax(s), value)


class DoubledScaling(suite.AttentionMethod):
    """Scales the scores twice (d^-1 instead of d^-0.5) and declares softmax attention as its identity."""
    identity = {}

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        return suite.attend(module, _probs(query, key, 2 * scaling, attention_mask), value)


class ColumnDropRenormalised(suite.AttentionMethod):
    """Drops key columns after the softmax and renormalises over the kept ones: 0/0 in a row that keeps no key."""
    Config = dataclasses.make_dataclass("Config", [("p", float, dataclasses.field(default=0.02))])
    keeps_expectation = False

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = _probs(query, key, scaling, attention_mask)
        if module.training:
            p = p * (torch.rand(*p.shape[:2], 1, p.shape[-1], device=p.device) >= self.cfg.p)
            p = p / p.sum(-1, keepdim=True)
        return suite.attend(module, p, value)


class ScrambledQueries(suite.AttentionMethod):
    """Reads the (B, H, L, d) queries through a reshape of their (B, L, H, d) transpose: positions and heads mixed."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        scrambled = query.transpose(1, 2).reshape(query.shape)
        return suite.attend(module, _probs(scrambled, key, scaling, attention_mask), value)


class LeakingDropKey(suite.AttentionMethod):
    """DropKey as "drop keys before the softmax" reads: dropped real keys filled with the mask value, like padding."""
    Config = Rate
    keeps_expectation = False

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling, attention_mask)
        if module.training:
            drop = (torch.rand(s.shape, device=s.device) < self.cfg.p) & suite.valid_keys(attention_mask, s)
            s = s.masked_fill(drop, suite.mask_fill_value(s))
        return suite.attend(module, suite.softmax(s), value)


# name: (planted method, {rule it must fail: words in its message}, words no message may hold)
PLANTED = {
    "reseeded_eval_dropout": (ReseededEvalDropout, {"eval": "dropout is left on in eval mode",
                                                   "draws": "no new dropout mask is drawn per step"}, ()),
    "data_dropout": (DataDropout, {"gradient": "the backward pass does not differentiate the forward"}, ()),
    "cpu_attribute": (CpuAttribute, {"device": "kept as plain attributes: module.toy_offset (cpu)"}, ()),
    "hand_written_softmax": (HandWrittenSoftmax, {"fp16": "under fp16 autocast"}, ()),
    "cached_mask": (CachedMask, {"draws": "a mask kept across steps"}, ()),
    "no_rescale": (NoRescale, {"expect": "rescales the kept weights by 1/(1-p)"}, ()),
    # on the tiny ModernBERT the gradient rule's direction reaches the temperature too, and names the detach
    "detached_temperature": (DetachedTemperature, {"trained": "toy_temperature", "gradient": "a detach"}, ()),
    "doubled_scaling": (DoubledScaling, {"identity": "differ from SDPA"}, ()),
    "column_drop_renormalised": (ColumnDropRenormalised, {"finite": "a row whose keys are all dropped"},
                                 ("variance",)),
    "scrambled_queries": (ScrambledQueries, {"padding": "the queries are mixed across positions"},
                          ("attends to padding",)),
    # a row whose real keys are all dropped spreads over every key at the mask's value: in ModernBERT's local layer,
    # keys beyond the window too (at high rates)
    "leaking_dropkey": (LeakingDropKey, {"padding": "a row whose real keys are all dropped",
                                         "window": "attends outside the window"}, ()),
}


def _assert_fails_where_planted(case: str, register, every_rule: bool) -> None:
    """Planted method `case` fails the rules it plants (run alone, or in the whole check: then those alone), on every
    model, each message naming its cause and none holding the words that would blame another."""
    cls, failing, never = PLANTED[case]
    name = register(cls, f"planted_{case}")
    report = testing.check_method(name) if every_rule else testing.check_rules(name, failing)
    failures = report.failures()
    assert {r.check for r in failures} == set(failing), str(report)
    assert {r.setting.split(",")[0] for r in failures} == set(testing.MODEL_KINDS), str(report)
    for r in failures:
        assert failing[r.check] in r.detail, str(report)
        assert not any(words in r.detail for words in never), str(report)


@pytest.mark.parametrize("case", PLANTED)
def test_a_planted_bug_fails_the_rules_that_name_its_cause(case, register):
    _assert_fails_where_planted(case, register, every_rule=False)


@pytest.mark.slow  # the whole check on three models, about 15-30 s each: `python -m pytest -m slow`
@pytest.mark.parametrize("case", PLANTED)
def test_a_planted_bug_fails_no_other_rule(case, register):
    _assert_fails_where_planted(case, register, every_rule=True)


def test_the_leaking_dropkey_fails_at_its_own_rate_too(register):
    """At p = 0.1 the padding rule's training draws alone find rows whose real keys were all dropped, not only the
    high rates: the verdict does not hang on the rate checked."""
    cls = suite.METHODS.get(register(LeakingDropKey, "planted_leaking_dropkey_default"))
    for kind in ("bert", "roberta"):
        failures = [r for r in testing.check_padding(cls(Rate(p=0.1)), kind) if r.passed is False]
        assert {r.setting for r in failures} == {f"{kind}, train", f"{kind}, train, probabilities"}, failures
        assert all("a row whose real keys are all dropped" in r.detail for r in failures), failures
        assert "in training only" in failures[0].detail
    assert testing.high_rate_hparams(cls, {"p": 0.1}) == {"p": 0.9}


def test_doubled_scaling_fails_the_identity_rule_by_a_wide_margin(register):
    cls = suite.METHODS.get(register(DoubledScaling, "planted_doubled_scaling_margin"))
    gap = re.compile(r"SDPA's on the same queries, keys and values by ([0-9.e+-]+) of its size")
    for kind in ("bert", "roberta"):
        result = testing.check_identity(cls, kind)
        assert result.passed is False, result
        assert float(gap.search(result.detail).group(1)) > 1e3 * check_spread.TOLERANCE["fp32"]["attention"], result


def test_a_parameter_declared_frozen_needs_no_gradient(register):
    frozen = type("FrozenTemperature", (DetachedTemperature,), {"frozen_parameters": ("toy_temperature",)})
    cls = suite.METHODS.get(register(frozen, "declared_frozen_temperature"))
    result = testing.check_trained(cls(), "bert")
    assert result.passed is None and "frozen" in result.detail, result
    unfrozen = suite.METHODS.get(register(DetachedTemperature, "planted_detached_unfrozen"))
    assert testing.check_trained(unfrozen(), "bert").passed is False
