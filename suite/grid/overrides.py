"""What a command line says of a study, typed: the values it replaces (dotted keys of the study file such as `train.lr`,
`executor.workers`, `out`), the names it picks from the study's grids, the seeds it replaces, the assignments it adds
and whether seeds come in rounds. A run without a study file is these overrides of the empty study.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from suite.grid.executors.options import EXECUTOR_OPTIONS
from suite.run.settings import TRAIN_FIELDS

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_SEEDS", "NAME_KEYS", "Overrides", "STUDY_DEFAULTS"]

# the study's keys a flag may replace, with the value when neither the flags nor the study give one
STUDY_DEFAULTS: dict[str, Any] = {"preset": "quick", "data_dir": None, "out": "runs", "device": "auto",
                                  "executor.name": "local", **{f"executor.{name}": None for name in EXECUTOR_OPTIONS},
                                  "outputs.save_model": None, "outputs.predict_test": None,
                                  "outputs.report_to": None}
# the keys that say where a study runs, not what: the whole study keeps them (device and executor decide what
# `precision: auto` resolves to, and so the jobs' hashes)
PLACE_KEYS = ("data_dir", "out", "device", "executor.name", "executor.address")
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
