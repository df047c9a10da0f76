"""Shared fixtures: tiny random-init BERT/RoBERTa models saved as local folders, and generated GLUE TSVs that carry
every quirk of the real files (no header in CoLA, BOM in MRPC, trailing spaces in SST-2, stray quotes, 'null'/'NA'
words, string labels, a missing final newline)."""
from __future__ import annotations

import dataclasses
import os
import random
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# the tokenised-data cache of this test session lives in its own folder, never in the user's ~/.cache
os.environ.setdefault("SUITE_CACHE_DIR", tempfile.mkdtemp(prefix="suite-test-cache-"))
torch.set_num_threads(min(2, torch.get_num_threads()))

SHARED_GLUE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue"
# The tiny-model builders are public (suite.testing) so that method authors' checks and these tests share them.
from suite.testing import WORDS, padded_batch, temporary_methods, tiny_config, tiny_model, tiny_tokenizer  # noqa: E402,F401


def pytest_collection_modifyitems(config, items):
    """Tests that start Ray (marked `starts_ray`) run only inside a loopback-only network namespace, since Ray listens
    on every interface it finds: elsewhere they are skipped here and `test_ray_confined.py` runs them in one."""
    import loopback_ns  # this folder is on sys.path under pytest

    ray_items = [item for item in items if item.get_closest_marker("starts_ray")]
    if not ray_items or loopback_ns.confined():
        return
    skip = pytest.mark.skip(reason="starts Ray: runs only in a loopback-only network namespace, where "
                                   "tests/test_ray_confined.py runs every Ray test")
    for item in ray_items:
        item.add_marker(skip)


def needs(*packages: str, extra: str = "tracking"):
    """Skip a test of an optional part when a package it needs is not installed (`pip install -e ".[test]"` leaves
    out the trackers and Ray; CI installs them), naming the package and the extra that brings it."""
    import importlib.util

    absent = [p for p in packages if importlib.util.find_spec(p) is None]
    return pytest.mark.skipif(bool(absent), reason=f"{', '.join(absent)} not installed: pip install -e \".[{extra}]\"")


def set_cpu_bf16(monkeypatch, native: bool) -> None:
    """Make this CPU look as if it had (or lacked) bf16 instructions, which decide what precision `auto` trains in."""
    from suite.run.device import CPU_BF16_CHECKS

    for check in CPU_BF16_CHECKS:
        monkeypatch.setattr(torch.cpu, check, lambda: native, raising=False)  # older torch: absent, read as False


@pytest.fixture(autouse=True)
def cpu_without_native_bf16(monkeypatch):
    """Every test sees a CPU without bf16 instructions, so `auto` means fp32 on every machine that runs the tests
    (run hashes and the precision a test trains in would otherwise differ between an AVX2 and an AMX machine).
    Processes a test starts see the real CPU; the jobs they get are resolved already."""
    set_cpu_bf16(monkeypatch, False)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
    """A saved tiny BERT with a WordPiece tokenizer: a complete local model folder for end-to-end runs."""
    from transformers import BertForSequenceClassification

    d = tmp_path_factory.mktemp("tiny-bert")
    tok = tiny_tokenizer(d)
    assert tok.convert_tokens_to_ids("cat") != tok.unk_token_id
    torch.manual_seed(0)
    # 128 positions: the default --max-length, which the run command checks against the model's positions
    config = tiny_config("bert", vocab_size=len(tok), max_position_embeddings=128)
    BertForSequenceClassification(config).save_pretrained(d)
    return str(d)


def _sentence(rng: random.Random, n: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, n)))


def write_glue(root: Path, n_train: int = 24, n_dev: int = 12, seed: int = 0) -> Path:
    """Generated GLUE folder in the classic layout, with the real files' quirks."""
    rng = random.Random(seed)

    def rows(n, make):
        return [make(i) for i in range(n)]

    def write(path: Path, header, lines, final_newline=True, bom=False):
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join((["\t".join(header)] if header else []) + ["\t".join(map(str, r)) for r in lines])
        path.write_text(("\ufeff" if bom else "") + text + ("\n" if final_newline else ""), encoding="utf-8")

    for split, n in (("train", n_train), ("dev", n_dev)):
        write(root / "CoLA" / f"{split}.tsv", None,
              rows(n, lambda i: ["gj04", i % 2, "*" if i % 2 == 0 else "", _sentence(rng) + ' "dry.']),
              final_newline=(split != "dev"))
        write(root / "SST-2" / f"{split}.tsv", ["sentence", "label"],
              rows(n, lambda i: [_sentence(rng) + " ", i % 2]))
        write(root / "MRPC" / f"{split}.tsv", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
              rows(n, lambda i: [i % 2, 100 + i, 200 + i, '" ' + _sentence(rng), _sentence(rng)]), bom=True)
        write(root / "STS-B" / f"{split}.tsv",
              ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
               "score"],
              rows(n, lambda i: [i, "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none",
                                 _sentence(rng), _sentence(rng), f"{(i * 0.37) % 5:.3f}"]))
        for task, labels in (("RTE", ["entailment", "not_entailment"]), ("QNLI", ["entailment", "not_entailment"]),
                             ("WNLI", [0, 1])):
            cols = ["index", "question", "sentence", "label"] if task == "QNLI" else \
                ["index", "sentence1", "sentence2", "label"]
            write(root / task / f"{split}.tsv", cols,
                  rows(n, lambda i: [i, "\ufeff" + _sentence(rng), _sentence(rng) + " null", labels[i % 2]]))
        write(root / "QQP" / f"{split}.tsv", ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
              rows(n, lambda i: [i, 2 * i, 2 * i + 1, _sentence(rng), _sentence(rng), i % 2]))
    mnli = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
            "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
    labels = ["entailment", "neutral", "contradiction"]
    for name, n in (("train", n_train), ("dev_matched", n_dev), ("dev_mismatched", n_dev)):
        write(root / "MNLI" / f"{name}.tsv", mnli,
              rows(n, lambda i: [i, i, f"{i}e", "fiction", "(", "(", "(", "(", _sentence(rng), _sentence(rng),
                                 labels[i % 3], labels[i % 3]]))
    return root


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory) -> str:
    return str(write_glue(tmp_path_factory.mktemp("glue")))


@pytest.fixture
def shared_glue() -> Path:
    if not (SHARED_GLUE / "RTE" / "train.tsv").is_file():
        pytest.skip(f"real GLUE data not found at {SHARED_GLUE}")
    return SHARED_GLUE


def run_cli(model, glue, out, *extra) -> int:
    """The smallest real command: vanilla, RTE, seed 1, one epoch on `model`, into `out`; `extra` adds flags (a later
    --precision wins). fp32 is stated: a module-scoped fixture runs before `cpu_without_native_bf16` hides this CPU's
    bf16, so with `auto` its runs and a test's runs of one configuration would get other names on a bf16 CPU."""
    from suite import commands

    return commands.main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--model", str(model),
                     "--data-dir", glue, "--epochs", "1", "--batch-size", "8", "--out", str(out), "--quiet",
                     "--precision", "fp32", *extra])


def fake_ok_record(job):
    """A valid ok record made without training, for tests that need records, not numbers."""
    from suite.run.record import RunRecord
    from suite.run.record_parts import Epoch, Metrics

    rec = RunRecord.started_now(job)
    rec.status, rec.wall_s, rec.final = "ok", 0.0, Metrics.from_json({"score": 0.5, "accuracy": 0.5})
    rec.history = (Epoch(epoch=1, dev=rec.final),)
    return rec


@pytest.fixture
def one_thread():
    """One torch thread for the method check's tests (suite.testing.one_thread): tiny models run fastest so."""
    from suite.api import testing

    with testing.one_thread():
        yield


@dataclasses.dataclass
class Rate:
    """A planted method's Config: one rate, p."""
    p: float = 0.1


@pytest.fixture
def register():
    """Registers toy (or planted) methods for one test (check_method attaches by name) and removes them afterwards."""
    with temporary_methods() as add:
        yield add


MEMORY_LIMIT_GIB = 2  # address space a bounded input may take in a bomb test (the bombs took 6-19 GB)


def run_under_memory_limit(argv: list[str], gib: float = MEMORY_LIMIT_GIB, timeout: float = 120, cwd=None):
    """`python -m suite ARGV` in a child process whose address space is capped (RLIMIT_AS) at `gib` GiB: an input that
    would exhaust memory dies there (MemoryError, exit 1) instead of taking the machine; one that is refused exits 2."""
    import subprocess
    import sys

    code = ("import resource, sys\n"
            f"limit = int({gib} * 2**30)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
            "from suite.commands import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)
