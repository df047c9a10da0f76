"""Loading a pre-trained encoder for a task, with a fresh task head and the run's attention method attached."""
from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from suite.api.attention import METHODS, AttentionMethod, attention_modules
from suite.api.errors import BadInput, HyperParameterError
from suite.api.tasks import TaskSpec
from suite.run.settings import RunConfig, resolve_model

# what the rest of the suite uses; other names are this module's own
__all__ = ["attention_support", "build_method", "checked_tokenizer", "load_model", "quiet_transformers",
           "refuse_unfit_methods"]


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


# the tiny copy `attention_support` builds of a type: 3 layers, so that ModernBERT has a global and two local ones
TINY_SIZES = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=3, intermediate_size=64)
# what the refusal says of types whose attention is computed in their own code, where the probe only finds no module
OWN_ATTENTION = dict.fromkeys(("deberta", "deberta-v2"), "its disentangled attention (content-to-position and "
                              "position-to-content scores) is computed in its own code, not through transformers' "
                              "attention interface")


@functools.lru_cache(maxsize=None)
def attention_support(model_type: str) -> str | None:
    """None when a tiny random-init copy of `model_type` sends every self-attention call to an attached method with
    the installed transformers; otherwise why not. Asked of transformers itself (once per type and process), not read
    from a list, which would age with transformers' releases."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    vanilla = METHODS.get("vanilla")
    calls = []

    class Counted(vanilla):
        def attention(self, module, *args, **kwargs):
            calls.append(module)
            return super().attention(module, *args, **kwargs)

    try:
        with quiet_transformers(), torch.random.fork_rng(devices=[]):
            config = AutoConfig.for_model(model_type, **TINY_SIZES)
            model = AutoModelForSequenceClassification.from_config(config).eval()
    except Exception as exc:  # noqa: BLE001  a type that cannot be built small cannot be run; its structure may say
        try:
            with quiet_transformers(), torch.device("meta"):
                model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(model_type))
        except Exception:  # noqa: BLE001
            model = None
        if model is None or attention_modules(model):
            return f"a tiny copy of it, to test its attention, could not be built ({_one_line(exc)})"
    if not attention_modules(model):
        if any(getattr(m, "is_causal", None) is True for m in model.modules()):
            return "its attention is causal (a decoder's), and the suite fine-tunes bidirectional encoders"
        return OWN_ATTENTION.get(model_type, "its attention does not go through transformers' attention interface")
    Counted().attach(model)
    ids = torch.tensor([[2, 5, 6, 7], [2, 5, 0, 0]])
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=(ids != 0).long())
    except Exception as exc:  # noqa: BLE001
        return f"a tiny copy of it failed with a method attached ({_one_line(exc)})"
    if len(calls) != config.num_hidden_layers:
        return (f"only {len(calls)} of the {config.num_hidden_layers} self-attention calls of a tiny copy reached "
                "the attached method")
    return None


def refuse_unfit_methods(model: str, jobs: Sequence[RunConfig]) -> None:
    """Attach each distinct method of `jobs` to `model`'s skeleton on the meta device, as a run will: a method that
    cannot apply to this type (e.g. one that treats each depth differently, where layers share one module) is
    refused (BadInput) before training, with its reason."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(resolve_model(model))
    seen = set()
    for job in jobs:
        key = (job.method, json.dumps(job.hparams, sort_keys=True, default=str))
        if key in seen:
            continue
        seen.add(key)
        with quiet_transformers(), torch.device("meta"):
            skeleton = AutoModelForSequenceClassification.from_config(config)
            try:
                build_method(job).attach(skeleton)
            except HyperParameterError as exc:
                raise BadInput(f"{job.label}: {exc}") from None


def _one_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
