"""Loading a pre-trained encoder for a task, with a fresh task head and the run's attention method attached."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from suite.api.attention import METHODS, AttentionMethod
from suite.api.errors import BadInput
from suite.api.tasks import TaskSpec
from suite.run.settings import RunConfig, resolve_model

# what the rest of the suite uses; other names are this module's own
__all__ = ["build_method", "checked_tokenizer", "load_model", "quiet_transformers"]


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' load report (the new classifier head is listed as missing: expected when
    fine-tuning, noise in a grid) for the duration only; the caller's log level is restored."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


# A local model folder needs one of these sets of files for its tokenizer.
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("vocab.txt",), ("vocab.json", "merges.txt"), ("spiece.model",),
                       ("sentencepiece.bpe.model",), ("tokenizer.model",))


def checked_tokenizer(model: str, path: str | Path):
    """The tokenizer of a model (a local folder or a hub id), refused with BadInput when it cannot work: a local
    folder without tokenizer files (transformers would build a vocabulary of special tokens only, and every word
    would become [UNK], which trains and predicts without error on garbage), files that do not load, or a
    vocabulary of special tokens only. Used for training models and for saved models alike."""
    from transformers import AutoTokenizer

    folder = Path(path).expanduser()
    if folder.is_dir() and not any(all((folder / f).is_file() for f in files) for files in TOKENIZER_FILE_SETS):
        wanted = " or ".join("+".join(files) for files in TOKENIZER_FILE_SETS)
        raise BadInput(f"model folder {folder} has no tokenizer files (looked for {wanted}). Save the tokenizer "
                       f"of the model it came from into it: AutoTokenizer.from_pretrained(ORIGINAL)"
                       f".save_pretrained('{folder}').")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001
        raise BadInput(f"cannot load the tokenizer of model {model!r}: {type(exc).__name__}: {str(exc)[:300]}. "
                       "Repair or replace its tokenizer files.") from None
    if len(tokenizer) <= len(tokenizer.all_special_tokens):
        raise BadInput(f"the tokenizer of model {model!r} has only its special tokens "
                       f"({', '.join(tokenizer.all_special_tokens)}): every word would be unknown. Repair or "
                       "replace its tokenizer files.")
    return tokenizer


def build_method(job: RunConfig) -> AttentionMethod:
    cls = METHODS.get(job.method)
    return cls(cls.Config(**job.hparams))


def load_model(job: RunConfig, spec: TaskSpec) -> tuple[torch.nn.Module, AttentionMethod, int]:
    """(model with a fresh task head and the method attached, the method, parameters the method added)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, set_seed

    path = resolve_model(job.model)
    with quiet_transformers():
        model_config = AutoConfig.from_pretrained(
            path, num_labels=spec.num_labels,
            problem_type="regression" if spec.is_regression else "single_label_classification")
        if spec.label_names:
            model_config.id2label = dict(enumerate(spec.label_names))
            model_config.label2id = {n: i for i, n in enumerate(spec.label_names)}
        set_seed(job.seed)  # the classifier head's initialisation depends on the seed
        # a checkpoint that already has a head of another size (e.g. fine-tuned on another task) gets a fresh one
        model = AutoModelForSequenceClassification.from_pretrained(path, config=model_config,
                                                                   ignore_mismatched_sizes=True)
    method = build_method(job)
    before = sum(p.numel() for p in model.parameters())
    method.attach(model)
    return model, method, sum(p.numel() for p in model.parameters()) - before  # saved with the model
