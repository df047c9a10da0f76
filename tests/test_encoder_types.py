"""ModernBERT, DistilBERT and ALBERT, verified as the BERT family was: a tiny random-init copy of each, saved with the
tiny BERT's WordPiece tokenizer, trains through `suite run` with every built-in method that applies to it; a method
that cannot apply is refused before training with its reason; whether a type works is asked of transformers (a tiny
copy dispatches to the attached method or not), and DeBERTa-v2 is refused with why. ModernBERT's sliding-window
layers: the method check's window rule catches a method that attends beyond the window."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_cli

import suite
from suite import testing
from suite.api.errors import EXIT_BAD_INPUT
from suite.api.tiny_models import TINY_WINDOW
from suite.grid.preflight import VERIFIED_MODEL_TYPES
from suite.grid.store import iter_records
from suite.run.models import attention_support

pytestmark = pytest.mark.slow  # the slow tier: `python -m pytest -m slow` (README, Tests)

BUILT_IN = sorted(n for n in suite.METHODS.names() if suite.METHODS.get(n).__module__.startswith("suite.methods"))
# 3 layers: ModernBERT's first is global and the next two local (a window of 2 keys either side); ALBERT's share one
# attention module; 128 positions for the default --max-length
TYPES = {
    "modernbert": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                       max_position_embeddings=128, local_attention=4, pad_token_id=0, cls_token_id=2,
                       sep_token_id=3, bos_token_id=2, eos_token_id=3),
    "distilbert": dict(dim=32, n_layers=3, n_heads=4, hidden_dim=64, max_position_embeddings=128, pad_token_id=0),
    "albert": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                   embedding_size=16, max_position_embeddings=128, pad_token_id=0),
}
# on ALBERT, whose layers share one attention module: what each refused method gives every layer of its own
PER_LAYER = {"attendout": "a drop policy of its own", "dropkey": "a drop rate of its own",
             "scores_dropout_layerwise": "a drop rate of its own", "less_attention": "attention or none by its depth",
             "lightconv": "a kernel width of its own", "dynamicconv": "a kernel width of its own"}
# what no longer applies with 3 layers: LIT's attention-free first layer goes through BERT's `attention.output`
LIT_FORM = {"modernbert": {"less_attention"}, "distilbert": {"less_attention"}, "albert": set()}


@pytest.fixture(scope="module")
def tiny_folders(tiny_bert_dir, tmp_path_factory) -> dict[str, Path]:
    """A saved random-init classifier of each type with the tiny BERT's tokenizer files."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tiny_bert_dir))
    root = tmp_path_factory.mktemp("encoder-types")
    folders = {}
    for model_type, sizes in TYPES.items():
        folder = root / f"tiny-{model_type}"
        torch.manual_seed(0)
        config = AutoConfig.for_model(model_type, vocab_size=vocab, **sizes)
        AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
        for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json"):
            shutil.copy(Path(tiny_bert_dir) / name, folder / name)
        folders[model_type] = folder
    return folders


def applicable(model_type: str) -> list[str]:
    refused = LIT_FORM[model_type] | (set(PER_LAYER) if model_type == "albert" else set())
    return [m for m in BUILT_IN if m not in refused]


@pytest.mark.parametrize("model_type", TYPES)
def test_every_method_that_applies_trains_through_suite_run(model_type, tiny_folders, glue_dir, tmp_path, capsys):
    out = tmp_path / "out"
    methods = applicable(model_type)
    rc = run_cli(tiny_folders[model_type], glue_dir, out, "--methods", ",".join(methods))
    assert rc == 0, capsys.readouterr().err
    records = {rec.config["method"]: rec for _, rec in iter_records(out / "runs")}
    assert sorted(records) == methods
    for method, rec in records.items():
        assert rec.status == "ok" and rec.final.score is not None, (method, rec.error)
        assert rec.history and rec.timing.steps > 0, method
    if model_type == "modernbert":  # the report gives the model its own leaderboard and costs table
        from suite.commands import main

        assert main(["report", str(out), "--out", str(tmp_path / "report"), "--no-figures"]) == 0
        page = (tmp_path / "report" / "leaderboard.md").read_text()
        assert f"## Model `{tiny_folders[model_type]}`" in page and "#### Costs and parameters" in page
        assert all(f"| {m} " in page for m in methods), page


@pytest.mark.parametrize("model_type, method", [("albert", m) for m in sorted(PER_LAYER)]
                         + [("modernbert", "less_attention"), ("distilbert", "less_attention")])
def test_a_method_that_cannot_apply_is_refused_with_its_reason(model_type, method, tiny_folders, glue_dir, tmp_path,
                                                               capsys, monkeypatch):
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: pytest.fail(f"{job.label} trained"))
    rc = run_cli(tiny_folders[model_type], glue_dir, tmp_path / "out", "--methods", method)
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT and "Traceback" not in err, err
    assert f"cannot run on model type {model_type!r}" in err, err
    if model_type == "albert":
        assert "3 layers share 1 attention module" in err and PER_LAYER[method] in err, err
    else:
        assert "form='linear' runs on every type" in err, err


def test_albert_takes_a_layer_free_setting_of_a_per_layer_method(tiny_folders, glue_dir, tmp_path, capsys):
    """DropKey at one rate for every layer gives no layer anything of its own: it runs on shared layers."""
    rc = run_cli(tiny_folders["albert"], glue_dir, tmp_path / "out", "--methods", "dropkey",
                 "--set", "dropkey.p_last=0.1")
    assert rc == 0, capsys.readouterr().err


def test_the_type_check_asks_transformers():
    """Every type the refusal may list dispatches every self-attention call to the method with the installed
    transformers; DeBERTa-v2's disentangled attention and a decoder are refused with why."""
    for model_type in VERIFIED_MODEL_TYPES:
        assert attention_support(model_type) is None, model_type
    assert "disentangled attention" in attention_support("deberta-v2")
    assert "causal" in attention_support("gpt2")


def test_deberta_v2_is_refused_with_its_reason(tiny_bert_dir, glue_dir, tmp_path, capsys):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    folder = tmp_path / "tiny-deberta-v2"
    config = AutoConfig.for_model("deberta-v2", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=64)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json"):
        shutil.copy(Path(tiny_bert_dir) / name, folder / name)
    assert run_cli(folder, glue_dir, tmp_path / "out") == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "type 'deberta-v2': its disentangled attention" in err and "modernbert, distilbert, albert" in err, err


class WindowBlind(suite.AttentionMethod):
    """Masks only the padded keys (read from the mask's columns): a local layer's window is ignored."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        padded = (attention_mask != 0).all(dim=-2, keepdim=True)
        s = suite.scores(query, key, scaling).masked_fill(padded, suite.mask_fill_value(query))
        return suite.attend(module, suite.softmax(s), value)


def test_a_method_that_ignores_the_window_fails_the_window_rule_only(register):
    report = testing.check_method(register(WindowBlind, "planted_window_blind"))
    failures = report.failures()
    assert {(r.check, r.setting) for r in failures} == {("window", "modernbert, eval"),
                                                         ("window", "modernbert, train")}, str(report)
    assert all("attends outside the window" in r.detail for r in failures), str(report)


def test_the_mask_each_method_receives_holds_the_window():
    """The sliding-window mask reaches the method in ModernBERT's local layers, not in its global one."""
    masks = {}

    class Seen(suite.METHODS.get("vanilla")):
        def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
            masks[module.layer_idx] = attention_mask
            return super().attention(module, query, key, value, attention_mask, scaling, **kwargs)

    model = testing.tiny_model("modernbert")
    Seen().attach(model)
    model(input_ids=torch.arange(3, 15)[None], attention_mask=torch.ones(1, 12, dtype=torch.long))
    distance = (torch.arange(12)[None, :] - torch.arange(12)[:, None]).abs()
    assert bool((masks[0] == 0).all())  # global
    assert torch.equal(masks[1][0, 0] == 0, distance <= TINY_WINDOW)  # local


def test_uniform_spreads_over_the_window_without_the_sequence_ends():
    """In a local layer, uniform gives 1/n to the keys of the query's window, less [CLS] and the final [SEP] (the
    sequence's ends), never the window's own ends."""
    model = testing.tiny_model("modernbert")
    suite.METHODS.get("uniform")().attach(model)
    seen = {}
    model.eval()
    with torch.no_grad(), suite.probes(model, lambda module, probs: seen.setdefault(module.layer_idx, probs)):
        model(input_ids=torch.arange(3, 15)[None], attention_mask=torch.ones(1, 12, dtype=torch.long))
    local = seen[1][0, 0]
    for query, keys in {6: [4, 5, 6, 7, 8], 1: [1, 2, 3], 10: [8, 9, 10]}.items():
        expected = torch.zeros(12)
        expected[keys] = 1 / len(keys)
        assert torch.allclose(local[query], expected), (query, local[query])
