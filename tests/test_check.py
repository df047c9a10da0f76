"""The method check (suite.testing, `python -m suite check`): it passes a correct method and fails each kind of broken
one with a message that says what is wrong, also for a method that comes from another package's entry point."""
import argparse
import dataclasses
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import suite
from suite.api import testing
from suite.commands import check
from suite.methods.dropout import ScoresDropout

PLUGINS = Path(__file__).parent / "plugins"
pytestmark = pytest.mark.usefixtures("one_thread")


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    check.add_parser(parser.add_subparsers(dest="command"))
    return check.main(parser.parse_args([check.COMMAND, *argv]))


def _plugin_distribution(root: Path) -> Path:
    """An installed-looking distribution (dist-info with an entry point) whose method lives in tests/plugins."""
    info = root / "leaky_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: leaky-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[suite.methods]\nleaky_attention = leaky_attention\n")
    return root


@pytest.fixture
def leaky_plugin(tmp_path, monkeypatch):
    root = _plugin_distribution(tmp_path)
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.syspath_prepend(str(root))
    assert any(ep.name == "leaky_attention" for ep in importlib.metadata.entry_points(group="suite.methods"))
    suite.METHODS.load(reload_plugins=True)
    yield "leaky_attention"
    suite.METHODS.remove("leaky_attention")  # other tests select `all`
    sys.modules.pop("leaky_attention", None)


@pytest.mark.slow  # the slow tier: `python -m pytest -m slow`
def test_scores_dropout_passes_every_check(capsys):
    assert _cli("scores_dropout") == 0
    out = capsys.readouterr().out
    assert "scores_dropout: passed" in out and "FAIL" not in out
    for name in ("identity", "padding", "finite", "hparams", "shape", "values", "params", "eval", "prepare", "hooks",
                 "window"):
        assert f" {name} " in out


def test_plugin_method_that_ignores_padding_fails(leaky_plugin, capsys):
    assert leaky_plugin in suite.METHODS.names()
    assert _cli(leaky_plugin) == check.EXIT_FAILED
    out = capsys.readouterr().out
    assert "leaky_attention: FAILED" in out
    assert "the method attends to padding" in out
    assert "weight up to" in out and "on padded keys" in out
    assert "failed: leaky_attention" in out


@pytest.mark.slow  # the slow tier: `python -m pytest -m slow`
def test_plugin_check_from_the_command_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_plugin_distribution(tmp_path)), str(PLUGINS),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "suite", "check", "leaky_attention", "--quiet"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == check.EXIT_FAILED, proc.stderr
    assert "attends to padding" in proc.stdout


def test_unknown_method_is_bad_input(capsys):
    assert _cli("no_such_method") == check.EXIT_BAD_INPUT
    assert "scores_dropout" in capsys.readouterr().err  # the valid names are listed


def test_set_reaches_the_checked_method(capsys):
    assert check._hparams(["scores_dropout", "topk"], ["topk.k=3"]) == {"scores_dropout": {}, "topk": {"k": 3}}
    assert _cli("scores_dropout", "--set", "vanilla.p=0.3") == check.EXIT_BAD_INPUT
    assert _cli("scores_dropout", "--set", "scores_dropout.p=1.5") == check.EXIT_FAILED
    assert "p=1.5 is impossible" in capsys.readouterr().out


class AcceptsAnything(ScoresDropout):
    def validate(self):
        pass


class WrongIdentity(ScoresDropout):
    identity = {"p": 0.5}  # scores dropout at p=0.5 is not softmax attention in training


class NaNAttention(ScoresDropout):
    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        out, probs = super().attention(module, query, key, value, attention_mask, scaling, **kwargs)
        return out / 0.0 * 0.0, probs


def test_hparams_check_catches_missing_validation():
    results = testing.check_hparams(AcceptsAnything, {})
    refused = {r.setting: r for r in results}
    assert refused["p=1.5"].passed is False and "accepted an impossible value" in refused["p=1.5"].detail
    assert testing.check_hparams(ScoresDropout, {"p": 2.0})[0].passed is False  # the value under test itself


def test_identity_check_catches_a_wrong_identity():
    result = testing.check_identity(WrongIdentity, "bert")
    assert result.passed is False and "train mode" in result.detail
    assert testing.check_identity(ScoresDropout, "roberta").passed is True


def test_finite_check_catches_nan():
    results = testing.check_finite(NaNAttention(), "bert")
    assert [r.passed for r in results] == [False, False]
    assert "non-finite outputs" in results[0].detail


def test_probability_fields_follow_the_naming_rule():
    @dataclasses.dataclass
    class Config:
        p: float = 0.1
        p_max: float = 0.3
        k: int = 3
        p_count: int = 2  # an int is no probability

    class M(ScoresDropout):
        stochastic = None  # undeclared: the naming rule applies

    M.Config = Config
    assert testing.probability_fields(M) == ["p", "p_max"]
    M.stochastic = (suite.Stochastic("p_max"), suite.Stochastic("p", kind="scale"))  # a declaration replaces it
    assert testing.probability_fields(M) == ["p_max"]


class DropoutInEval(suite.AttentionMethod):
    """Keeps attention dropout on in eval mode (training=True instead of module.training)."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = F.dropout(suite.softmax(suite.scores(query, key, scaling, attention_mask)), 0.1, training=True)
        return suite.attend(module, p, value)


class HeadsFirstOutput(suite.AttentionMethod):
    """Returns the context in the (B, H, L, d) layout instead of (B, L, H, d)."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        p = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        return torch.matmul(p, value), p


class OutputOnly(suite.AttentionMethod):
    """Returns the output alone, without the probabilities."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        return suite.attend(module, suite.softmax(suite.scores(query, key, scaling, attention_mask)), value)[0]


class CpuGate(suite.AttentionMethod):
    """Adds a per-head gate on the CPU whatever the model's device."""

    def prepare(self, model):
        for module in suite.attention_modules(model):
            module.register_parameter("toy_gate", torch.nn.Parameter(torch.ones(module.num_attention_heads)))

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        gated = query * module.toy_gate[:, None, None]
        return suite.attend(module, suite.softmax(suite.scores(gated, key, scaling, attention_mask)), value)


def _failed_checks(out: str) -> set[str]:
    """The checks a printed report marks FAIL."""
    return {line.split()[1] for line in out.splitlines() if line.startswith("  FAIL ")}


def test_dropout_in_eval_mode_fails_the_eval_check(register, capsys):
    name = register(DropoutInEval, "toy_dropout_in_eval")
    assert _cli(name) == check.EXIT_FAILED
    out = capsys.readouterr().out
    assert "0 of 1 methods passed" in out and "two eval-mode passes over the same batch differ" in out
    # padding, finite, ... hold; it also draws in training without declaring what (draws)
    assert _failed_checks(out) == {"eval", "draws"}


def test_wrong_output_layout_is_a_shape_error_that_names_the_shapes(register, capsys):
    name = register(HeadsFirstOutput, "toy_heads_first")
    assert _cli(name) == check.EXIT_FAILED
    out = capsys.readouterr().out
    assert "attends to padding" not in out and _failed_checks(out) == {"shape"}
    assert "(5, 4, 12, 8)" in out and "(B, L, H, d) = (5, 12, 4, 8)" in out  # B=5, H=4, L=12, d=8
    assert "it is in the (B, H, L, d) layout" in out and "needs .transpose(1, 2)" in out
    assert "not run on this model: the output layout is wrong" in out


def test_output_without_probabilities_is_a_shape_error(register):
    report = testing.check_method(register(OutputOnly, "toy_output_only"))
    assert {r.check for r in report.failures()} == {"shape"}
    assert "must return (output, probabilities)" in report.failures()[0].detail


def test_prepare_on_the_wrong_device_fails(register):
    register(CpuGate, "toy_cpu_gate")
    result = testing.check_prepare_device(CpuGate(), "bert")
    assert result.passed is False and "toy_gate (cpu)" in result.detail
    lightconv = suite.METHODS.get("lightconv")
    assert testing.check_prepare_device(lightconv(), "roberta").passed is True
    assert testing.check_prepare_device(ScoresDropout(), "bert").passed is None  # nothing added: nothing to check


def test_deterministic_and_shape_checks_pass_a_correct_method():
    assert testing.check_deterministic(ScoresDropout(), "bert").passed is True
    assert testing.check_shape(ScoresDropout(), "roberta").passed is True


class TensorRecord(ScoresDropout):
    """Returns a tensor in its record: the record could not be written after training."""

    def record(self):
        return {"rate": torch.tensor(0.1)}


class UndetachedLoss(ScoresDropout):
    """Returns the loss with its graph from training_step."""

    def training_step(self, ctx, batch, next_batch):
        loss = ctx.loss(batch)
        ctx.apply(loss)
        return loss


def test_hooks_check_catches_a_record_that_is_not_json_and_an_undetached_loss():
    result = testing.check_hooks(TensorRecord(), "bert")
    assert result.passed is False and "record() is not JSON" in result.detail
    result = testing.check_hooks(UndetachedLoss(), "roberta")
    assert result.passed is False and "requires grad" in result.detail and "loss.detach()" in result.detail
    assert testing.check_hooks(ScoresDropout(), "bert").passed is True
