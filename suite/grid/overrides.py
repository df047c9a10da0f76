"""What a command line says of a study, typed: the values it replaces (dotted keys of the study file such as `train.lr`,
`executor.workers`, `out`), the names it picks from the study's grids, the seeds it replaces, the assignments it adds
and whether seeds come in rounds. A run without a study file is these overrides of the empty study.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from suite.grid.executors.options import EXECUTOR_OPTIONS
from suite.run.data import DATA_DIR_ENV
from suite.run.settings import PRESETS, TRAIN_FIELDS

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_SEEDS", "NAME_KEYS", "Names", "Overrides", "STUDY_DEFAULTS", "STUDY_FLAGS", "STUDY_KEYS",
           "StudyKey"]

Names = Union[list[str], str]  # a YAML list or a comma list


@dataclass(frozen=True)
class StudyKey:
    """A key of a study file that a flag of `run` replaces, declared once: its type in the study file, its value when
    neither the flag nor the study gives one, and its flag (help, the `run --help` group that lists it, metavar).
    `parse` reads a value where the type alone does not (the flag's text and the file's value alike; ValueError when
    bad); `flag_type` reads the flag's text where the file's type is not a reader (a number). A `switch` is a
    true/false key (--flag / --no-flag); a `place` key says where the study runs, not what: the whole study keeps
    it. `details` adds to the help what a registry says when the parser is built; `{default}` in the help is the
    default."""

    type: Any
    default: Any
    help: str
    group: str  # "what", "where" or "outputs"
    metavar: str | None = None
    parse: Callable[[Any], Any] | None = None
    flag_type: Callable[[str], Any] | None = None
    choices: Callable[[], list[str]] | None = None
    details: Callable[[], str] | None = None
    switch: bool = False
    place: bool = False

    def flag_help(self) -> str:
        text = self.help.replace("{default}", str(self.default))
        return f"{text} {self.details()}" if self.details else text


def presets_help() -> str:
    parts = []
    for name in PRESETS.names():
        preset = PRESETS.get(name)
        train = ", ".join(f"{k}={v}" for k, v in preset.train.items()) or "the train.* defaults below"
        parts.append(f"{name}: models {','.join(preset.models)}; {train}")
    return "; ".join(parts)


# the study's keys a flag may replace (the flag: --KEY's last part; --executor for executor.name)
STUDY_KEYS: dict[str, StudyKey] = {
    "preset": StudyKey(str, "quick", "training recipe (default {default}).", "what", choices=PRESETS.names,
                       details=presets_help),
    "data_dir": StudyKey(str, None, f"folder of task data (GLUE TSVs in the classic layout); else ${DATA_DIR_ENV}, "
                                    "else the hub", "what", place=True),
    "out": StudyKey(str, "runs", "output folder; records go to OUT/runs/ (default ./{default})", "what", place=True),
    "device": StudyKey(str, "auto", "auto (CUDA when present; default), cpu, cuda, cuda:1 ...", "where", place=True),
    "executor.name": StudyKey(str, "local", "local (default: sequential; one worker process per GPU when several are "
                                            "visible) or ray", "where", place=True),
    **{f"executor.{name}": StudyKey(option.type, None, option.flag_help, "where", option.metavar, option.parse,
                                    option.type, place=name == "address")  # the cluster: where, as the device
       for name, option in EXECUTOR_OPTIONS.items()},
    "outputs.save_model": StudyKey(bool, None, "keep the fine-tuned weights and tokenizer in OUT/runs/RUN.model/ (off "
                                               "by default)", "outputs", switch=True),
    "outputs.predict_test": StudyKey(bool, None, "write test-set predictions in the GLUE server's format to "
                                                 "OUT/runs/RUN.test/", "outputs", switch=True),
    "outputs.report_to": StudyKey(Names, None, "comma list of tensorboard, mlflow, wandb: log config and tags, the "
                                               "training loss every 25 batches, per-epoch curves and final metrics "
                                               "(local stores under OUT/tracking/; wandb offline; experiment: "
                                               "$MLFLOW_EXPERIMENT_NAME, else the study's name; docs/tracking.md)",
                                  "outputs", "TRACKERS"),
}


def flag_dest(key: str) -> str:
    """The argparse destination of a study key's flag: its last part (executor.name: `executor`)."""
    section, _, last = key.rpartition(".")
    return section if last == "name" else last


# the value of each key when neither the flags nor the study give one
STUDY_DEFAULTS: dict[str, Any] = {key: k.default for key, k in STUDY_KEYS.items()}
# flags that replace a study's value: their destination -> the study's dotted key
STUDY_FLAGS: dict[str, str] = {flag_dest(key): key for key in STUDY_KEYS}
# the keys that say where a study runs, not what: the whole study keeps them (device and executor decide what
# `precision: auto` resolves to, and so the jobs' hashes)
PLACE_KEYS = tuple(key for key, k in STUDY_KEYS.items() if k.place)
NAME_KEYS = ("methods", "tasks", "model")  # a flag picks from what the study gives (seeds: it replaces)
DEFAULT_SEEDS = (1, 2, 3)


@dataclass(frozen=True)
class Overrides:
    """The command line's part of a study. `values`: dotted key -> value, for the keys of STUDY_DEFAULTS and
    `train.KEY`; `picks`: methods, tasks, model -> the comma list a flag gives (with a study file it picks from
    its grids; a study without the key takes it); `seeds` replace what the grids inherit and narrow what a grid
    gives itself; `sets` and `sweeps` come after the study's own (later assignments win)."""

    values: Mapping[str, Any] = field(default_factory=dict)
    picks: Mapping[str, str] = field(default_factory=dict)
    seeds: tuple[int, ...] | None = None
    sets: tuple[str, ...] = ()
    sweeps: tuple[str, ...] = ()
    until_decided: bool = False

    def __post_init__(self):
        unknown = [k for k in self.values if k not in STUDY_DEFAULTS and k.removeprefix("train.") not in TRAIN_FIELDS]
        unknown += [k for k in self.picks if k not in NAME_KEYS]
        if unknown:
            raise ValueError(f"no study key {', '.join(unknown)} to override")

    @property
    def train(self) -> dict[str, Any]:
        """The training settings given (`train.KEY` -> KEY), over the study's train: section."""
        return {k.removeprefix("train."): v for k, v in self.values.items() if k.startswith("train.")}

    @property
    def given(self) -> dict[str, Any]:
        """The grid keys the command line gives, as its flags name them (an empty flag is no flag)."""
        seeds = {"seeds": list(self.seeds)} if self.seeds else {}
        return {**{k: v for k, v in self.picks.items() if k in NAME_KEYS and v}, **seeds}

    def of_whole_study(self, defines) -> Overrides:
        """The overrides of the study's own command: where it runs, and the names in `defines` (flags that give
        the study's top grid what it lacks, and so are part of the study rather than a pick from it)."""
        return Overrides({k: v for k, v in self.values.items() if k in PLACE_KEYS},
                         {k: self.picks[k] for k in defines}, until_decided=self.until_decided)
