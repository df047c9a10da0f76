"""less_attention's default follows LIT: no attention sublayer at all in the first third of the layers. The suite's
first form (a position-wise sublayer in the first half, `form=linear`) stays an option, and the records that ran it
keep their hashes, while a run at today's default is a configuration of its own."""
import dataclasses
import json
from pathlib import Path

import torch

from suite.api.tiny_models import padded_batch, tiny_model
from suite.methods.less_attention import LessAttention, mixing_free_layers
from suite.run.settings import RunConfig, TrainSettings, with_added_defaults

ROOT = Path(__file__).resolve().parents[1]


def _job(hparams: dict) -> RunConfig:
    return RunConfig("minilm", "sst2", "less_attention", hparams, 1, TrainSettings())


def _logits(hp: dict) -> torch.Tensor:
    model = tiny_model("bert", num_hidden_layers=3).eval()
    LessAttention(LessAttention.Config(**hp)).attach(model)
    ids, mask = padded_batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def test_the_default_is_lits_form_and_share():
    cfg = LessAttention.Config()
    assert (cfg.form, cfg.fraction, cfg.layers) == ("lit", None, -1)
    assert [mixing_free_layers(cfg, n) for n in (12, 6, 3)] == [4, 2, 1]  # LIT: the first 4 of 12 layers
    model = tiny_model("bert", num_hidden_layers=3)
    method = LessAttention()
    method.attach(model)
    assert method.record() == {"attention_free_layers": 1, "form": "lit"}
    default = _logits({})
    torch.testing.assert_close(default, _logits({"form": "lit", "layers": 1}), rtol=0, atol=0)
    assert not torch.allclose(default, _logits({"form": "linear", "layers": 1}))
    assert not torch.allclose(default, _logits({"layers": 0}))


def test_the_older_default_keeps_its_hash_and_todays_has_its_own():
    today = dataclasses.asdict(LessAttention.Config())
    older = today | {"form": "linear"}
    before_forms = {k: v for k, v in today.items() if k not in ("form", "fraction")}  # records made before `form`
    assert _job(older).hash == _job(before_forms).hash
    assert _job(today).hash != _job(older).hash
    hparams, _ = with_added_defaults("less_attention", before_forms, {})
    assert hparams["form"] == "linear"  # such a record reads back as the form it ran, not as today's default
    assert mixing_free_layers(LessAttention.Config(**older), 6) == 3  # the older form frees half, as before


def test_committed_records_ran_the_older_form_and_keep_their_hashes():
    paths = sorted(p for d in ("runs", "tuning/runs") for p in (ROOT / "results" / d).glob("*__less_attention__*.json"))
    assert len(paths) >= 6
    for path in paths:
        rec = json.loads(path.read_text())
        job = RunConfig.from_dict(rec["config"])
        assert job.hash == rec["hash"] and path.name.endswith(f"__{rec['hash']}.json"), path.name
        hparams, _ = with_added_defaults("less_attention", job.hparams, {})
        assert (hparams["form"], hparams["fraction"]) == ("linear", None), path.name
        assert dataclasses.replace(job, hparams=hparams | {"form": "lit"}).hash != rec["hash"], path.name
