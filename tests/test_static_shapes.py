"""Static shapes and host synchronisation: bucketed padding (`train.pad_to`), the few batch shapes an epoch sees, the
attention mask built without a host read, and the loop profile (`bench --loop`) that counts both."""
from __future__ import annotations

import dataclasses
import itertools
import json
import random

import pytest
import torch

from suite.run.batching import BATCHINGS, BUCKETS, bucket_widths, padded_widths, resolve_pad_to
from suite.run.settings import RunConfig, TrainSettings


def padded_tokens(lengths, widths) -> int:
    return sum(next(w for w in widths if w >= n) - n for n in lengths)


@pytest.mark.parametrize("seed", range(12))
def test_bucket_widths_are_the_fewest_padded_tokens(seed):
    """The dynamic programme against every choice of at most `count` candidate widths (brute force)."""
    rng = random.Random(seed)
    lengths = [rng.randint(3, 64) for _ in range(rng.randint(1, 60))]  # truncated to max_length (the cap)
    count, cap = rng.randint(1, 4), 64
    chosen = bucket_widths(lengths, count, cap)
    cands = sorted({min(-(-n // 8) * 8, cap) for n in lengths})
    assert len(chosen) <= count and max(chosen) == max(cands) and set(chosen) <= set(cands)
    best = min(padded_tokens(lengths, c + (max(cands),))
               for k in range(count) for c in itertools.combinations(cands[:-1], k))
    assert padded_tokens(lengths, chosen) == best


def test_an_epoch_sees_at_most_eight_batch_shapes():
    """Buckets bound the shapes (the widths, plus the one shorter last batch); padding to the longest row does not."""
    rng = random.Random(0)
    lengths = [min(128, int(rng.lognormvariate(3.0, 0.6)) + 3) for _ in range(2000)]
    for pad_to, bound in (("buckets", BUCKETS + 1), ("longest", None)):
        widths = padded_widths(lengths, pad_to, 128)
        for epoch in range(3):
            batches = BATCHINGS["length"].order(lengths, 32, torch.Generator().manual_seed(epoch))
            shapes = {(len(b), widths.width(b, lengths)) for b in batches}
            assert all(widths.width(b, lengths) >= max(lengths[i] for i in b) for b in batches)
            if bound:
                assert len(shapes) <= bound
            else:
                assert len(shapes) > BUCKETS + 1  # this data has many widths: the bound is the buckets' doing


def test_pad_to_auto_is_buckets_on_gpus_and_when_compiled_and_longest_on_cpus():
    assert resolve_pad_to("auto", "cuda", False) == "buckets"
    assert resolve_pad_to("auto", "cpu", True) == "buckets"
    assert resolve_pad_to("auto", "cpu", False) == "longest"
    assert resolve_pad_to("longest", "cuda", False) == "longest"


def test_records_padded_to_the_longest_row_keep_their_hash():
    """Records from before buckets lack `pad_to`; they padded to the longest row, which stays out of the hash."""
    from suite.run.device import resolve_jobs_precision

    job = RunConfig("minilm", "sst2", "vanilla", {"p": 0.1}, 1, TrainSettings(precision="fp32"))
    old = job.to_dict()
    del old["train"]["pad_to"]
    (cpu,) = resolve_jobs_precision([job], "cpu")
    assert cpu.train.pad_to == "longest" and cpu.hash == RunConfig.from_dict(old).hash
    buckets = dataclasses.replace(job, train=dataclasses.replace(job.train, pad_to="buckets"))
    assert buckets.hash != cpu.hash


def test_a_training_step_reads_nothing_back_to_the_host(tiny_bert_dir):
    """transformers' mask shortcut (`padding_mask.all()`) is a GPU sync in every forward; the suite's mask skips it."""
    from transformers import BertForSequenceClassification

    import suite
    from suite.profiling.counters import counting
    from suite.run.training import build_context

    model = BertForSequenceClassification.from_pretrained(tiny_bert_dir)
    method = suite.METHODS.get("vanilla")()
    method.attach(model)
    model.train()
    ctx = build_context(model, method, TrainSettings(), 4, torch.device("cpu"), None)  # the runner's fused AdamW
    for mask_row in (torch.ones(4, 12), torch.tensor([1] * 8 + [0] * 4).repeat(4, 1)):  # no padding, and padding
        batch = {"input_ids": torch.randint(5, model.config.vocab_size, (4, 12)), "attention_mask": mask_row.long(),
                 "labels": torch.randint(0, 2, (4,))}
        ctx.step += 1
        with counting() as counted:
            method.training_step(ctx, batch, None)
        assert counted.syncs == 0, dict(counted.sync_kinds)
        assert counted.ops > 100  # the counter sees the step's operators


def test_evaluation_is_padding_invariant_and_copies_once_per_split(tiny_bert_dir):
    from transformers import AutoTokenizer, BertForSequenceClassification

    from suite.api.tasks import get_task
    from suite.profiling.counters import counting
    from suite.run.data import encode
    from suite.run.training import evaluate

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    rng = random.Random(0)
    from conftest import WORDS

    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20))) for _ in range(40)]
    enc = encode(get_task("sst2"), {"sentence": sentences, "label": [i % 2 for i in range(40)]}, tok, 64)
    model = BertForSequenceClassification.from_pretrained(tiny_bert_dir)
    import suite

    suite.METHODS.get("vanilla")().attach(model)
    spec, dev = get_task("sst2"), torch.device("cpu")
    longest = evaluate(model, enc, spec, 8, tok.pad_token_id, dev, None,
                       widths=padded_widths(enc.lengths(), "longest", 64))
    with counting() as counted:
        buckets = evaluate(model, enc, spec, 8, tok.pad_token_id, dev, None,
                           widths=padded_widths(enc.lengths(), "buckets", 64))
    torch.testing.assert_close(torch.from_numpy(buckets.logits), torch.from_numpy(longest.logits), atol=1e-5,
                               rtol=1e-5)
    assert buckets.metrics == longest.metrics
    assert counted.syncs <= 3, dict(counted.sync_kinds)  # logits to the host once, loss once: not once per batch


def test_bench_loop_counts_syncs_shapes_and_operators(tiny_bert_dir, tmp_path):
    from conftest import write_glue

    from suite.commands import main

    data = write_glue(tmp_path / "glue", n_train=60, n_dev=20)
    out = tmp_path / "loop.json"
    code = main(["bench", "--loop", "--tasks", "sst2", "--methods", "vanilla", "--model", tiny_bert_dir,
                 "--steps", "6", "--batch-size", "8", "--data-dir", str(data), "--pad-to", "buckets",
                 "--device", "cpu", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["vanilla"]
    for r in rows:
        assert r["steps"] == 6 and r["shapes_per_epoch"] <= BUCKETS + 1 and r["ops_per_step"] > 100
        # one loss read at the epoch's end (every 25 batches otherwise) and the epoch's two CPU index draws
        assert r["host_sync_kinds"] == {"item/float/bool": 1, "tolist": 2}
        assert r["steps_per_s"] > 0 and r["tokens_per_s"] > 0 and r["mfu"] is None  # no peak for a CPU
