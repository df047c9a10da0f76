"""Shared fixtures: tiny random-init BERT/RoBERTa models saved as local folders, and generated GLUE TSVs that carry
every quirk of the real files (no header in CoLA, BOM in MRPC, trailing spaces in SST-2, stray quotes, 'null'/'NA'
words, string labels, a missing final newline)."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch.set_num_threads(min(2, torch.get_num_threads()))

SHARED_GLUE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue"
WORDS = ("the a cat dog sat on mat man woman ran fast slow big small red blue null NA yes no house tree "
         "car bird sees likes \" 'll n't . , ! ?").split()


def tiny_config(kind: str = "bert", **over):
    from transformers import BertConfig, RobertaConfig

    common = dict(vocab_size=len(WORDS) + 10, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=80, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    common.update(over)
    if kind == "roberta":
        return RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)
    return BertConfig(pad_token_id=0, **common)


def tiny_model(kind: str = "bert", num_labels: int = 2, seed: int = 0, **over):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    cfg = tiny_config(kind, num_labels=num_labels, **over)
    return AutoModelForSequenceClassification.from_config(cfg)


def padded_batch(batch: int = 3, length: int = 12, vocab: int = 30, seed: int = 0):
    """input_ids and an attention mask with different amounts of padding per row (one row unpadded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(1, batch):
        mask[i, max(2, length - 3 * i):] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
    """A saved tiny BERT with a WordPiece tokenizer: a complete local model folder for end-to-end runs."""
    from transformers import BertForSequenceClassification, BertTokenizer

    d = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(w.lower() for w in WORDS))
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 takes the vocabulary as `vocab=` (a `vocab_file=` keyword is ignored: every word -> [UNK])
    tok = BertTokenizer(vocab=str(d / "vocab.txt"), do_lower_case=True)
    assert tok.convert_tokens_to_ids("cat") != tok.unk_token_id
    tok.save_pretrained(d)
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_config("bert", vocab_size=len(vocab))).save_pretrained(d)
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
