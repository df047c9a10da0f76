"""The tokenised-data cache is data, not code: nothing in it runs, and an entry that cannot be trusted (a pickle, a
truncated or edited file, wrong shapes, another key's entry) is named in a warning and rebuilt; the key follows the
data files' content and the suite's version."""
from __future__ import annotations

import os
import pickle
import shutil
import warnings

import numpy as np
import pytest

from suite.api.tasks import get_task
from suite.run import cache as reuse
from suite.run.data import Encoded
from suite.run.settings import TrainSettings

VALUE = (Encoded([{"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0]}, {"input_ids": [101, 102],
                                                                            "token_type_ids": [0, 0]}], [1, 0], [4, 9]),
         {"": Encoded([{"input_ids": [101, 5, 6, 102]}], [0.25], None)},
         Encoded([], [], []))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(reuse.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _compute(calls: list):
    def compute():
        calls.append(1)
        return VALUE
    return compute


def _rewrite(path, edit) -> None:
    """Load an entry's arrays, let `edit` change them, and save them back (the checksum as it was)."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    edit(arrays)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def test_an_entry_round_trips_as_data(cache):
    calls = []
    assert reuse.cached("k", _compute(calls)) == VALUE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reuse.cached("k", _compute(calls)) == VALUE
    assert len(calls) == 1
    with np.load(cache / "k.npz", allow_pickle=False) as data:  # no object arrays: nothing to unpickle
        assert all(data[k].dtype != object for k in data.files)


class Planted:
    def __reduce__(self):
        return (os.mkdir, (os.environ[reuse.CACHE_ENV] + "/../pwned",))


def _pickle(path):
    path.write_bytes(pickle.dumps({"x": Planted()}))


def _object_array(path):
    np.savez(path.open("wb"), manifest=np.array([Planted()], dtype=object))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def _flip_labels(path):  # an edit that keeps the file well formed: only the checksum shows it
    _rewrite(path, lambda a: a.update({"e0/labels": 1 - a["e0/labels"]}))


def _wrong_shape(path):  # drops a row's tokens and fixes the checksum: the offsets no longer fit
    def edit(a):
        import json

        a["e0/input_ids"] = a["e0/input_ids"][:-1]
        a["e0/token_type_ids"] = a["e0/token_type_ids"][:-1]
        manifest = json.loads(a["manifest"].tobytes())
        manifest["checksum"] = reuse._checksum({k: v for k, v in a.items() if k != "manifest"}, manifest["tree"])
        a["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    _rewrite(path, edit)


def _split_repointed(path):  # the dev split pointed at the training split's arrays, the checksum left as it was
    def edit(a):
        import json

        manifest = json.loads(a["manifest"].tobytes())
        manifest["tree"]["tuple"][1]["dict"][""] = manifest["tree"]["tuple"][0]
        a["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    _rewrite(path, edit)


def _fifo(path):  # reading it would wait for a writer forever
    path.unlink()
    os.mkfifo(path)


def _compressed(path):  # a small file that expands to far more than its size when read
    path.unlink()
    with open(path, "wb") as fh:
        np.savez_compressed(fh, manifest=np.zeros(50_000_000, dtype=np.uint8))


def _writable_by_others(path):
    path.chmod(0o666)


def _other_key(path):
    reuse.write_entry(path.open("wb"), "another", VALUE)


def _not_a_zip(path):
    path.write_text("hello")


UNTRUSTED = {"pickle": _pickle, "pickled object array": _object_array, "truncated": _truncate,
             "labels edited": _flip_labels, "wrongly shaped": _wrong_shape, "another key's entry": _other_key,
             "not a zip": _not_a_zip, "a split pointed at another's arrays": _split_repointed, "a FIFO": _fifo,
             "compressed": _compressed, "writable by others": _writable_by_others}


@pytest.mark.parametrize("spoil", list(UNTRUSTED.values()), ids=list(UNTRUSTED))
def test_an_untrusted_entry_is_named_and_rebuilt_and_never_runs(spoil, cache, tmp_path):
    calls = []
    reuse.cached("k", _compute(calls))
    path = cache / "k.npz"
    spoil(path)
    with pytest.warns(UserWarning, match=f"entry {path} cannot be trusted"):
        assert reuse.cached("k", _compute(calls)) == VALUE
    assert len(calls) == 2 and not (tmp_path / "pwned").exists()
    assert reuse.read_entry(path, "k") == VALUE  # rebuilt
    assert path.is_file() and not path.stat().st_mode & 0o022


def test_a_value_of_another_shape_is_named_and_rebuilt(cache):
    """A well-formed entry whose value is not what the caller stores (a manifest of the wrong shape, checksum and
    all) is an untrusted entry, never a TypeError further on."""
    reuse.write_entry((cache.mkdir(parents=True) or cache / "k.npz").open("wb"), "k", (1, 2))
    calls = []
    with pytest.warns(UserWarning, match="cannot be trusted.*not shaped as the data"):
        assert reuse.cached("k", _compute(calls), fits=lambda v: isinstance(v, tuple) and len(v) == 3) == VALUE
    assert calls == [1]


def test_the_key_follows_content_and_suite_version(tmp_path, tiny_bert_dir, glue_dir, monkeypatch):
    from transformers import AutoTokenizer

    data = tmp_path / "glue"
    shutil.copytree(glue_dir, data)
    tokenizer, spec, t = AutoTokenizer.from_pretrained(tiny_bert_dir), get_task("rte"), TrainSettings()
    key = reuse.tokenized_key(spec, tokenizer, data, t)
    dev = data / "RTE" / "dev.tsv"
    stat = dev.stat()
    text = dev.read_text()
    flipped = text.replace("\tnot_entailment\n", "\tNOT_ENTAILMENT\n")  # same size
    assert flipped != text and len(flipped) == len(text)
    dev.write_text(flipped)
    os.utime(dev, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and modification time as before
    assert reuse.tokenized_key(spec, tokenizer, data, t) != key
    dev.write_text(text)
    os.utime(dev, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert reuse.tokenized_key(spec, tokenizer, data, t) == key
    monkeypatch.setattr(reuse, "__version__", "99.0")
    assert reuse.tokenized_key(spec, tokenizer, data, t) != key


def test_a_fixed_data_seed_and_a_run_seed_of_the_same_value_do_not_share_dev_rows(cache, tiny_bert_dir, glue_dir):
    """train.data_seed=5 draws the dev subset with seed 5; an unset data seed at run seed 5 draws it with 0. Their
    disk entries shared a key (the draw seed is 5 in both), so the second run could be handed the first one's dev
    rows."""
    from transformers import AutoTokenizer

    from suite.run.runner import TokenizedCache
    from suite.run.settings import RunConfig

    tokenizer, spec = AutoTokenizer.from_pretrained(tiny_bert_dir), get_task("rte")
    fixed = RunConfig(tiny_bert_dir, "rte", "vanilla", {}, 5, TrainSettings(data_seed=5, max_eval_samples=4))
    follows = RunConfig(tiny_bert_dir, "rte", "vanilla", {}, 5, TrainSettings(data_seed=None, max_eval_samples=4))
    fixed_devs = TokenizedCache().get(fixed, spec, tokenizer, glue_dir).devs
    cached = TokenizedCache().get(follows, spec, tokenizer, glue_dir).devs
    with reuse_off():
        fresh = TokenizedCache().get(follows, spec, tokenizer, glue_dir).devs
    assert cached[""].index == fresh[""].index != fixed_devs[""].index


class reuse_off:
    """The disk cache switched off for a block."""

    def __enter__(self):
        self.before = os.environ.get(reuse.CACHE_ENV)
        os.environ[reuse.CACHE_ENV] = "off"

    def __exit__(self, *exc):
        os.environ[reuse.CACHE_ENV] = self.before


def test_a_compressed_entry_is_refused_before_anything_expands(cache):
    """np.savez stores its arrays uncompressed: a compressed member can only be planted, and could expand to
    gigabytes, so it is refused from the archive's table of contents, before any member is read."""
    cache.mkdir(parents=True)
    with open(cache / "k.npz", "wb") as fh:
        np.savez_compressed(fh, manifest=np.zeros(50_000_000, dtype=np.uint8))
    with pytest.raises(reuse.BadEntry, match="compressed"):
        reuse.read_entry(cache / "k.npz", "k")
