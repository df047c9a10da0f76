"""Tokenised splits reused across processes through the disk cache: same inputs hit, changed inputs miss."""
import shutil

import pytest

from suite.api.tasks import get_task
from suite.run import cache as reuse
from suite.run import runner
from suite.run.settings import RunConfig, TrainSettings


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(reuse.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cached_computes_once_and_can_be_turned_off(cache, monkeypatch):
    calls = []

    def compute():
        calls.append(1)
        return {"x": [1, 2, 3]}

    assert reuse.cached("k", compute) == reuse.cached("k", compute) == {"x": [1, 2, 3]}
    assert len(calls) == 1 and (cache / "k.npz").is_file()
    monkeypatch.setenv(reuse.CACHE_ENV, "off")
    reuse.cached("k", compute)
    assert len(calls) == 2


def test_a_second_process_reads_the_first_ones_tokens(cache, tiny_bert_dir, glue_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    data = tmp_path / "glue"
    shutil.copytree(glue_dir, data)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    job = RunConfig(tiny_bert_dir, "rte", "vanilla", {"p": 0.1}, 1, TrainSettings(max_length=32))
    first = runner.TokenizedCache().get(job, get_task("rte"), tokenizer, data)

    def no_tokenising(*args):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(runner, "_tokenize", no_tokenising)
    again = runner.TokenizedCache().get(job, get_task("rte"), tokenizer, data)  # a fresh cache: another process
    assert [e.features for e in again[1].values()] == [e.features for e in first[1].values()]
    assert again[0].labels == first[0].labels and again[0].index == first[0].index

    key = reuse.tokenized_key(get_task("rte"), tokenizer, data, job.train)
    longer = TrainSettings(max_length=64)
    assert reuse.tokenized_key(get_task("rte"), tokenizer, data, longer) != key
    (data / "RTE" / "train.tsv").write_text((data / "RTE" / "train.tsv").read_text() + "\n")
    assert reuse.tokenized_key(get_task("rte"), tokenizer, data, job.train) != key  # the file changed
    assert reuse.tokenized_key(get_task("rte"), tokenizer, None, job.train) is None  # hub data: not cached here
