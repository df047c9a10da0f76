"""Attention statistics on hand-made maps with known values, and end to end on a tiny BERT."""
import dataclasses
import math
from pathlib import Path

import pytest
import torch

import suite
from suite.api.attention import attention_modules
from suite.api.tasks import get_task
from suite.run import attention_stats as stats
from suite.run.data import Encoded
from suite.run.settings import TrainSettings

LN2 = math.log(2)


def map_statistics(probs, valid, input_ids=None, classes=None) -> dict[str, float]:
    """The statistics of one map (one layer, one batch), as the runner's accumulator turns its sums into means."""
    return {k: stats._ratio(*v) for k, v in stats.map_sums(probs, valid, input_ids, classes).items()}


def smoothed_one_hot_entropy(t: int) -> float:
    hi = (1 - stats.SMOOTHING) + stats.SMOOTHING / t
    lo = stats.SMOOTHING / t
    return -(hi * math.log(hi) + (t - 1) * lo * math.log(lo))


def all_valid(b, length):
    return torch.ones(b, length, dtype=torch.bool)


def test_uniform_map():
    probs = torch.full((2, 3, 5, 5), 1 / 5)
    s = map_statistics(probs, all_valid(2, 5))
    assert s["sparsity"] == 0
    assert s["null_rows"] == 0
    assert s["attended_keys"] == 5
    assert s["entropy"] == pytest.approx(math.log(5), abs=1e-6)  # smoothing leaves a uniform row uniform
    assert s["head_diversity"] == pytest.approx(0, abs=1e-6)


def test_one_hot_map():
    probs = torch.eye(4, dtype=torch.float64).expand(1, 2, 4, 4)  # float64 maps are reduced in float64
    s = map_statistics(probs, all_valid(1, 4))
    assert s["sparsity"] == pytest.approx(3 / 4)
    assert s["attended_keys"] == 1
    assert s["null_rows"] == 0
    assert s["entropy"] == pytest.approx(smoothed_one_hot_entropy(4), rel=1e-5)
    assert s["head_diversity"] == pytest.approx(0, abs=1e-6)  # both heads attend to self


def test_null_rows_and_unnormalised_rows():
    """ReLA-like rows: unnormalised mass is read as a distribution, all-zero rows are counted and left out."""
    probs = torch.zeros(1, 1, 4, 4)
    probs[0, 0, 0] = torch.tensor([2.0, 2.0, 2.0, 2.0])  # uniform after L1 normalisation
    probs[0, 0, 1] = torch.tensor([0.0, 3.0, 0.0, 0.0])  # one-hot after normalisation
    # rows 2 and 3 are null
    s = map_statistics(probs, all_valid(1, 4))
    assert s["null_rows"] == pytest.approx(0.5)
    assert s["sparsity"] == pytest.approx(11 / 16)
    assert s["attended_keys"] == pytest.approx((4 + 1 + 0 + 0) / 4)
    assert s["entropy"] == pytest.approx((math.log(4) + smoothed_one_hot_entropy(4)) / 2, rel=1e-5)


def test_every_row_null_gives_nan_not_an_error():
    s = map_statistics(torch.zeros(1, 2, 3, 3), all_valid(1, 3))
    assert s["null_rows"] == 1 and s["sparsity"] == 1 and s["attended_keys"] == 0
    assert math.isnan(s["entropy"]) and math.isnan(s["head_diversity"])


def test_padding_is_ignored():
    """Row 1 has 3 real tokens of 5: padded keys and queries carry garbage (even NaN) that must not count."""
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    probs = torch.full((2, 2, 5, 5), 1 / 5)
    probs[1] = 1 / 3
    probs[1, :, :, 3:] = 0.77   # weight on padded keys
    probs[1, :, 3:, :] = float("nan")  # padded queries
    s = map_statistics(probs, valid)
    rows = 2 * 5 + 2 * 3
    assert s["sparsity"] == 0
    assert s["attended_keys"] == pytest.approx((2 * 5 * 5 + 2 * 3 * 3) / rows)
    assert s["entropy"] == pytest.approx((2 * 5 * math.log(5) + 2 * 3 * math.log(3)) / rows, rel=1e-6)
    assert s["head_diversity"] == pytest.approx(0, abs=1e-6)


def test_token_class_masses():
    cls_id, sep_id, dot, comma, word = 101, 102, 7, 8, 50
    ids = torch.tensor([[cls_id, word, dot, comma, sep_id, 0]])
    valid = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    row = torch.tensor([0.5, 0.1, 0.1, 0.05, 0.25, 0.0])
    probs = row.expand(1, 1, 6, 6).clone()
    classes = {"cls": [cls_id], "sep": [sep_id], "punct": [dot, comma]}
    s = map_statistics(probs, valid, ids, classes)
    assert s["mass_cls"] == pytest.approx(0.5)
    assert s["mass_sep"] == pytest.approx(0.25)
    assert s["mass_punct"] == pytest.approx(0.15)


def test_masses_of_unnormalised_rows_are_shares():
    ids = torch.tensor([[101, 5, 102]])
    probs = torch.tensor([4.0, 2.0, 2.0]).expand(1, 1, 3, 3).clone()
    probs[0, 0, 2] = 0  # a null row does not count
    s = map_statistics(probs, all_valid(1, 3), ids, {"cls": [101], "sep": [102], "punct": []})
    assert s["mass_cls"] == pytest.approx(0.5) and s["mass_sep"] == pytest.approx(0.25)
    assert s["mass_punct"] == 0


def test_head_diversity_identical_and_disjoint_heads():
    same = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(1, 2, 4, 4)
    assert map_statistics(same, all_valid(1, 4))["head_diversity"] == pytest.approx(0, abs=1e-6)

    disjoint = torch.zeros(1, 2, 4, 4)
    disjoint[0, 0, :, :2] = 0.5
    disjoint[0, 1, :, 2:] = 0.5
    assert map_statistics(disjoint, all_valid(1, 4))["head_diversity"] == pytest.approx(LN2, rel=1e-6)

    # three heads A, A, B with B disjoint from A: pairs 0, ln2, ln2
    three = torch.cat([disjoint[:, :1], disjoint[:, :1], disjoint[:, 1:]], dim=1)
    assert map_statistics(three, all_valid(1, 4))["head_diversity"] == pytest.approx(2 * LN2 / 3, rel=1e-6)


def test_head_diversity_known_partial_overlap():
    p, r = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.5, 0.5])
    m = (p + r) / 2
    kl = lambda a, b: float((torch.special.xlogy(a, a) - torch.special.xlogy(a, b)).sum())  # noqa: E731
    expected = 0.5 * kl(p, m) + 0.5 * kl(r, m)
    probs = torch.stack([p.expand(3, 3), r.expand(3, 3)])[None]
    assert map_statistics(probs, all_valid(1, 3))["head_diversity"] == pytest.approx(expected, rel=1e-6)


def test_head_diversity_skips_pairs_with_a_null_row():
    disjoint = torch.zeros(1, 3, 2, 2)
    disjoint[0, 0, :, 0] = 1
    disjoint[0, 1, :, 1] = 1
    # head 2 is null everywhere: only the pair (0, 1) counts
    assert map_statistics(disjoint, all_valid(1, 2))["head_diversity"] == pytest.approx(LN2, rel=1e-6)


def test_head_disagreement_by_hand():
    """Correia et al.'s generalised JS, H(mean_h p_h) - mean_h H(p_h), on maps whose value is known in closed form."""
    a, b = torch.tensor([0.5, 0.5, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.5, 0.5])
    # heads A, A, B: mixture (1/3, 1/3, 1/6, 1/6), each head's entropy ln 2 -> ln 3 - (2/3) ln 2
    three = torch.stack([a, a, b]).unsqueeze(1).expand(3, 4, 4)[None]
    got = map_statistics(three, all_valid(1, 4))["head_disagreement"]
    assert got == pytest.approx(math.log(3) - 2 / 3 * LN2, rel=1e-6)
    assert map_statistics(three, all_valid(1, 4))["head_diversity"] == pytest.approx(2 * LN2 / 3, rel=1e-6)
    one_hot = torch.eye(4).unsqueeze(1).expand(4, 4, 4)[None]  # four heads, each on its own key: the maximum ln 4
    assert map_statistics(one_hot, all_valid(1, 4))["head_disagreement"] == pytest.approx(math.log(4), rel=1e-6)
    same = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(1, 3, 4, 4)
    assert map_statistics(same, all_valid(1, 4))["head_disagreement"] == pytest.approx(0, abs=1e-6)


def test_head_disagreement_matches_scipy_and_skips_null_rows():
    from scipy.stats import entropy

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(1, 4, 5, 5, generator=g, dtype=torch.float64) * 2, -1)
    probs[0, 3, 1] = 0  # head 3 is null for query 1: that query's JS is over heads 0-2
    expected = []
    for i in range(5):
        rows = [probs[0, h, i].numpy() for h in range(4) if probs[0, h, i].sum() > 0]
        expected.append(entropy(sum(rows) / len(rows)) - sum(entropy(r) for r in rows) / len(rows))
    got = map_statistics(probs, all_valid(1, 5))["head_disagreement"]
    assert got == pytest.approx(sum(expected) / 5, rel=1e-9)


def test_bf16_maps_are_read_in_fp32():
    probs = torch.full((1, 2, 8, 8), 1 / 8, dtype=torch.bfloat16)
    s = map_statistics(probs, all_valid(1, 8))
    assert s["entropy"] == pytest.approx(math.log(8), rel=1e-3)


def test_accumulator_weighs_rows_and_averages_layers():
    acc = stats.LayerAccumulator(2)
    acc.add(0, stats.map_sums(torch.full((1, 1, 2, 2), 0.5), all_valid(1, 2)))   # entropy ln 2, 2 rows
    acc.add(0, stats.map_sums(torch.full((1, 1, 4, 4), 0.25), all_valid(1, 4)))  # entropy ln 4, 4 rows
    acc.add(1, stats.map_sums(torch.eye(2)[None, None], all_valid(1, 2)))
    r = acc.result(batches=2)
    assert r["batches"] == 2 and r["layers"] == 2
    assert set(r["per_layer"]) == set(stats.STATS) == set(r["mean"])
    assert r["per_layer"]["entropy"][0] == pytest.approx((2 * LN2 + 4 * math.log(4)) / 6, rel=1e-6)
    assert r["per_layer"]["sparsity"] == pytest.approx([0.0, 0.5])
    assert r["mean"]["sparsity"] == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------------------
# End to end on a tiny BERT
# ---------------------------------------------------------------------------------------------------------

def _tokenizer(tiny_bert_dir):
    # Built from the fixture's vocab.txt: the WordPiece vocabulary is what the token classes are looked up in.
    from transformers import BertTokenizer

    return BertTokenizer(vocab=str(Path(tiny_bert_dir) / "vocab.txt"), do_lower_case=True)


def _tiny(tiny_bert_dir, method: str, **cfg):
    from transformers import AutoModelForSequenceClassification

    tok = _tokenizer(tiny_bert_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir)
    cls = suite.METHODS.get(method)
    cls(dataclasses.replace(cls.Config(), **cfg)).attach(model)
    texts = [("the cat sat on the mat .", "a dog ran fast , yes"), ("red car", "the big house"),
             ("the man sees a bird .", "no"), ("small", "blue tree , the woman likes it .")] * 3
    enc = tok([a for a, _ in texts], [b for _, b in texts])
    features = [{k: enc[k][i] for k in ("input_ids", "token_type_ids")} for i in range(len(texts))]
    return tok, model, Encoded(features, [i % 2 for i in range(len(texts))])


def test_token_classes_of_a_bert_tokenizer(tiny_bert_dir):
    tok = _tokenizer(tiny_bert_dir)
    c = stats.token_classes(tok)
    assert c["cls"] == [tok.cls_token_id] and c["sep"] == [tok.sep_token_id]
    assert sorted(c["punct"]) == sorted(tok.convert_tokens_to_ids([".", ","]))
    assert tok.unk_token_id not in c["punct"]


def test_statistics_end_to_end_format_and_probes_removed(tiny_bert_dir):
    tok, model, dev = _tiny(tiny_bert_dir, "vanilla")
    model.train()
    train = TrainSettings(stats_batches=2, eval_batch_size=4)
    r = stats.attention_statistics(model, tok, dev, get_task("rte"), train, tok.pad_token_id,
                                   torch.device("cpu"), None)
    assert r["batches"] == 2 and r["layers"] == model.config.num_hidden_layers
    assert set(r["per_layer"]) == set(stats.STATS) == set(r["mean"])
    for k in stats.STATS:
        assert len(r["per_layer"][k]) == r["layers"]
        assert all(math.isfinite(v) for v in r["per_layer"][k]), k
    assert r["mean"]["sparsity"] < 1e-6  # softmax
    assert 0 < r["mean"]["entropy"] and r["mean"]["null_rows"] == 0
    assert 0 < r["mean"]["mass_cls"] < 1 and 0 < r["mean"]["mass_sep"] < 1 and 0 < r["mean"]["mass_punct"] < 1
    assert model.training  # mode restored
    assert not any(hasattr(m, "suite_probe") for m in attention_modules(model))


@pytest.mark.parametrize("boundary_tokens", [False, True])
def test_uniform_method_gives_the_expected_entropy_and_masses(tiny_bert_dir, boundary_tokens):
    """End to end against values computed from the batch lengths alone: uniform attention over the real tokens, the
    first ([CLS]) and last ([SEP]) left out by default (Wiegreffe & Pinter), kept with boundary_tokens=True."""
    tok, model, dev = _tiny(tiny_bert_dir, "uniform", boundary_tokens=boundary_tokens)
    train = TrainSettings(stats_batches=1, eval_batch_size=len(dev))
    r = stats.attention_statistics(model, tok, dev, get_task("rte"), train, tok.pad_token_id,
                                   torch.device("cpu"), None)
    lengths = dev.lengths()
    seps = [f["input_ids"].count(tok.sep_token_id) for f in dev.features]
    if boundary_tokens:  # over n tokens, [CLS] and every [SEP] among them
        entropy = sum(n * math.log(n) for n in lengths) / sum(lengths)
        mass_cls, mass_sep = len(lengths) / sum(lengths), sum(seps) / sum(lengths)
    else:  # over the n - 2 tokens between: no [CLS], the pair's middle [SEP] only; the entropy after the statistics'
        # smoothing (P' = (1 - s) P + s / n), which gives the two left-out tokens a little mass
        def smoothed_entropy(n: int) -> float:
            inner, outer = (1 - stats.SMOOTHING) / (n - 2) + stats.SMOOTHING / n, stats.SMOOTHING / n
            return -((n - 2) * inner * math.log(inner) + 2 * outer * math.log(outer))

        entropy = sum(n * smoothed_entropy(n) for n in lengths) / sum(lengths)
        mass_cls = 0.0
        mass_sep = sum(n * (c - 1) / (n - 2) for n, c in zip(lengths, seps)) / sum(lengths)
    for layer in range(r["layers"]):
        assert r["per_layer"]["entropy"][layer] == pytest.approx(entropy, rel=1e-5)
        assert r["per_layer"]["head_diversity"][layer] == pytest.approx(0, abs=1e-6)
        assert r["per_layer"]["mass_cls"][layer] == pytest.approx(mass_cls, rel=1e-5, abs=1e-7)
        assert r["per_layer"]["mass_sep"][layer] == pytest.approx(mass_sep, rel=1e-5)


def test_probes_are_removed_when_the_forward_fails(tiny_bert_dir):
    tok, model, dev = _tiny(tiny_bert_dir, "vanilla")

    def broken(module, probs):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with stats.probes(model, broken):
            model(**tok(["the cat"], return_tensors="pt"))
    assert not any(hasattr(m, "suite_probe") for m in attention_modules(model))


def test_head_diversity_is_sampled_on_long_rows():
    """Beyond DIVERSITY_QUERIES positions a systematic sample is used: here every 2nd query of 64."""
    length = 2 * stats.DIVERSITY_QUERIES
    probs = torch.zeros(1, 2, length, length)
    probs[0, :, :, 0] = 1          # odd queries: both heads on key 0 (JSD 0)
    probs[0, 1, ::2, 0] = 0
    probs[0, 1, ::2, 1] = 1        # even queries: disjoint heads (JSD ln 2)
    assert map_statistics(probs, all_valid(1, length))["head_diversity"] == pytest.approx(LN2, rel=1e-6)
