"""Tiny random-init BERT, RoBERTa and ModernBERT models, padded batches and a tokenizer: what the method check runs
on, and what method authors' own tests (and the suite's) can build on. Public through `suite.testing`."""
from __future__ import annotations

from pathlib import Path

import torch

# what the rest of the suite uses; other names are this module's own
__all__ = ["TINY_WINDOW", "WORDS", "padded_batch", "seed_cpu", "tiny_config", "tiny_model", "tiny_tokenizer"]

WORDS = ("the a cat dog sat on mat man woman ran fast slow big small red blue null NA yes no house tree "
         "car bird sees likes \" 'll n't . , ! ?").split()


# ModernBERT's local layers let a key within this distance of its query through: 2 of the checked batch's 12 tokens
TINY_WINDOW = 2


def seed_cpu(seed: int) -> None:
    """Seeds the CPU's generator alone. torch.manual_seed also queues a CUDA seeding while CUDA is uninitialised, with
    a formatted stack trace each time (about 1.4 ms a call on the check's deep stacks, thousands of calls a check);
    the tiny models run on the CPU."""
    torch.default_generator.manual_seed(seed)


def tiny_config(kind: str = "bert", **over):
    """A 2-layer, 4-head, hidden-32 BERT, RoBERTa or ModernBERT config with no hidden or attention dropout; the
    ModernBERT's first layer is global and its second local (a window of TINY_WINDOW keys either side)."""
    from transformers import BertConfig, ModernBertConfig, RobertaConfig

    if kind == "modernbert":
        sizes = dict(vocab_size=len(WORDS) + 10, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=80, global_attn_every_n_layers=2,
                     local_attention=2 * TINY_WINDOW)
        # the special tokens of tiny_tokenizer's vocabulary (a BERT's), which ModernBERT's defaults lie beyond
        return ModernBertConfig(pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
                                **{**sizes, **over})
    common = dict(vocab_size=len(WORDS) + 10, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=80, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    common.update(over)
    if kind == "roberta":
        return RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)
    return BertConfig(pad_token_id=0, **common)


def tiny_model(kind: str = "bert", num_labels: int = 2, seed: int = 0, **over):
    """A random-init sequence classifier built from `tiny_config` (SDPA attention)."""
    from transformers import AutoModelForSequenceClassification

    seed_cpu(seed)
    return AutoModelForSequenceClassification.from_config(tiny_config(kind, num_labels=num_labels, **over))


def padded_batch(batch: int = 3, length: int = 12, vocab: int = 30, seed: int = 0, pad_id: int = 0):
    """input_ids and an attention mask with different amounts of padding per row (the first row unpadded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(1, batch):
        mask[i, max(2, length - 3 * i):] = 0
    ids[mask == 0] = pad_id
    return ids, mask


def tiny_tokenizer(folder: str | Path):
    """A WordPiece tokenizer over `WORDS` plus BERT's special tokens, saved into `folder` and returned."""
    from transformers import BertTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(w.lower() for w in WORDS))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 takes the vocabulary as `vocab=` (a `vocab_file=` keyword is ignored: every word -> [UNK])
    tok = BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=True)
    tok.save_pretrained(folder)
    return tok
