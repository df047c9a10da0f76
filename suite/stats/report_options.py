"""The report's options, each declared once: its type and default (a `ReportOptions` field), its help (the flag of
`python -m suite report`, made from it in `suite.commands.report`), whether a study file's `report:` section gives it
and with which values (its schema, made from it in `suite.grid.study`). `suite.report.build_report` takes a
`ReportOptions`; `run --until-decided` and `suite plan` read the same defaults.

The options live here, below both `suite.grid` (which reads a study's report section) and `suite.report` (which
takes them), since those two never import each other; most of them are the analysis plan: the reference, the level,
the correction, the primary family, the equivalence margin and the collapse floor.
"""
from __future__ import annotations

import dataclasses
import math
import os
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from suite.run.data import DATA_DIR_ENV
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_ALPHA", "DEFAULT_BASELINE", "DEFAULT_COSTS", "REPORT_FIELDS", "Bounds", "ReportOptions",
           "checked_per_task"]

DEFAULT_BASELINE = "vanilla"
DEFAULT_ALPHA = 0.05
DEFAULT_CORRECTION = "holm"
DEFAULT_COSTS = "bench.json"


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The finite numbers an option takes: above `above` (exclusive), below `below` (exclusive), at least
    `at_least`; `what` says it in a message ("a level in (0, 1)")."""

    what: str
    above: float | None = None
    below: float | None = None
    at_least: float | None = None

    def holds(self, value: float) -> bool:
        return math.isfinite(value) and (self.above is None or value > self.above) \
            and (self.below is None or value < self.below) and (self.at_least is None or value >= self.at_least)


def corrections() -> tuple[str, ...]:
    """The multiple-comparison corrections, read when asked (suite.stats.families imports scipy: a study file is
    read without it)."""
    from suite.stats.families import CORRECTIONS

    return tuple(sorted(CORRECTIONS))


def option(default: Any, help: str | None, *, flag: bool = True, study: type | None = None,
           choices: Callable[[], tuple[str, ...]] | None = None, bounds: Bounds | None = None, per_task: bool = False,
           comma_list: bool = False, env: str | None = None) -> Any:
    """A report option, declared once: its default; its flag's `help` (a true/false option's flag switches it away
    from its default: --no-NAME or --NAME), `choices` (read when the parser is built), `bounds` and `comma_list` (a
    comma list on the command line, a YAML list or comma string in a study), the environment variable the flag falls
    back to (`env`); `study`: the type of its value in a study's `report:` section (None: not there), per task
    (`per_task`: one value or task -> value) where the study allows it; `flag=False`: a study key only."""
    return dataclasses.field(default=default, metadata={
        "help": help, "flag": flag, "study": study, "choices": choices, "bounds": bounds, "per_task": per_task,
        "comma_list": comma_list, "env": env})


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """What a report is asked for (`suite.report.build_report(run_dirs, options)`); the field order is the order of
    the flags in `report --help`."""

    baseline: str = option(DEFAULT_BASELINE, f"reference method (default {DEFAULT_BASELINE})", study=str)
    alpha: float = option(DEFAULT_ALPHA, f"significance level after the correction (default {DEFAULT_ALPHA})",
                          study=float, bounds=Bounds("a level in (0, 1)", above=0, below=1))
    correction: str = option(DEFAULT_CORRECTION, "multiple-comparison correction across each model's table: holm "
                                                 "(Holm-Bonferroni, family-wise error; default) or bh "
                                                 "(Benjamini-Hochberg, false discovery rate)",
                             choices=corrections)
    aso: bool = option(True, "skip almost stochastic order (its bootstrap is the slowest statistic)")
    data_dir: str | os.PathLike | None = option(
        None, f"GLUE-format data folder (default ${DATA_DIR_ENV}): dev labels for the baseline rows of records that "
              "do not carry them", env=DATA_DIR_ENV)
    costs: str | os.PathLike | None = option(
        None, f"`python -m suite bench --json` file for the cost columns (default: OUT/{DEFAULT_COSTS}, else "
              f"DIR/{DEFAULT_COSTS}, when it exists)")
    reference_tasks: tuple[str, ...] = option(
        (), "comma list of tasks shown in their own table against their majority class and left out of the "
            "comparisons and averages (e.g. tasks the model does not learn)", study=str, comma_list=True)
    primary: tuple[str, ...] = option(
        (), "comma list of the primary comparisons: methods, tasks or METHOD:TASK; their family-wise error is held "
            "by Holm, every other comparison is exploratory (Benjamini-Hochberg); default: one family under "
            "--correction", study=str, comma_list=True)
    margin: float | Mapping[str, float] | None = option(
        None, "equivalence margin in points of the task's score x100 (default 1; per task in the study file's "
              "report: margin:)", study=float, bounds=Bounds("a finite number > 0", above=0), per_task=True)
    collapse_floor: float | Mapping[str, float] | None = option(
        None, "a run not this many points (x100) above its task's majority-class score counts as collapsed "
              "(default 1)", study=float, bounds=Bounds("a finite number >= 0", at_least=0), per_task=True)
    allow_uncommitted: bool = option(
        False, "report records from uncommitted code or from several commits (refused by default: a published "
               "table comes from one code version); the header marks the mix", study=bool)
    figures: bool = option(True, "tables only: much faster; existing figures are left as they are")
    out: str | os.PathLike | None = option(None, "write the report here instead of DIR", study=str)
    # where the analysis was fixed before the results were seen (a file or a commit): the verdicts are then labelled
    # pre-registered; without it, a re-analysis
    preregistered: str | None = option(None, None, flag=False, study=str)
    # not an option of the command line or the study: plans a `run` line of commands.txt again (its jobs, each with
    # all its settings) for the header's count of planned jobs with records; the command layer gives it
    planner: Callable[[str], list[RunConfig]] | None = None
    # not an option either: given the first record's start, why the analysis applied is not the registered one (the
    # study file then and now, these options and folders against it); the command layer gives it for --study
    registration: Callable[[datetime], Sequence[str]] | None = None

    @classmethod
    def settled(cls, given: Mapping[str, Any], study: Mapping[str, Any] | None = None, **rest: Any) -> ReportOptions:
        """Each option from `given` (the flags), else from `study` (its report: section), else its default; None
        in either means not given. Comma lists become tuples; `rest` gives the fields that are no options."""
        study, values = study or {}, {}
        for name in REPORT_FIELDS:
            value = next((v for v in (given.get(name), study.get(name)) if v is not None), None)
            if value is not None:
                values[name] = tuple(value) if REPORT_FIELDS[name].metadata["comma_list"] else value
        return cls(**values, **rest)


# the declared options by name (every field but the planner)
REPORT_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(ReportOptions)
                                               if "help" in f.metadata}


def per_task_keys() -> list[str]:
    """What a per-task value (a margin, a collapse floor) may be keyed by: a registered task's name, a benchmark
    average's column (`GLUE avg`) or `default`."""
    from suite.api.tasks import TASKS, task_groups

    return [*TASKS.names(), *(f"{group.upper()} avg" for group in sorted(task_groups())), "default"]


def checked_per_task(name: str, value: Any, bounds: Bounds) -> Any:
    """`value` (one number, or task -> number) when every number lies within `bounds` (finite) and every key is one
    `per_task_keys` names; else ValueError in the suite's words, naming the option, the value and the fix."""
    if isinstance(value, Mapping):
        keys = per_task_keys()
        for key in value:
            if key not in keys:
                raise ValueError(f"{name}: {key!r} is no task: key it by a registered task's name, a benchmark "
                                 f"average or default ({', '.join(keys)})")
        return {key: checked_per_task(f"{name}.{key}", v, bounds) for key, v in value.items()}
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not bounds.holds(float(value)):
        raise ValueError(f"{name}: {value!r} is not {bounds.what}: give {bounds.what}, or task -> {bounds.what}")
    return value
