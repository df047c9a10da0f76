"""What `run` asks for, resolved in one place: a study (a file with its `also:` grids, or the empty study) and the
command line's overrides of it (`suite.grid.overrides`), into the grids of jobs that `run` trains.

Precedence everywhere: the command line, then the study file, then the preset and the defaults. With a study file,
`--methods`, `--tasks` and `--model` pick from its grids: every grid keeps the names both it and the flag give (a grid
left with none drops out), so `--tasks stsb` runs the study's STS-B jobs with their own grid's settings. `--seeds`
replaces the seeds a grid inherits and narrows those a grid gives itself.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from suite.api.errors import BadInput
from suite.api.method_facts import method_registry
from suite.api.tasks import get_task, select_tasks
from suite.grid.executors.options import EXECUTOR_OPTIONS
from suite.grid.overrides import DEFAULT_SEEDS, NAME_KEYS, STUDY_DEFAULTS, Overrides
from suite.grid.plan import build_grid
from suite.grid.study import AlsoGrid, Study, names
from suite.run.data import resolve_data_dir
from suite.run.device import resolve_jobs_precision
from suite.run.settings import PRESETS, canonical_model, preset_train

# what the rest of the suite uses; other names are this module's own
__all__ = ["GridPlan", "RunRequest", "plan_grid", "resolve_study"]

if TYPE_CHECKING:
    from suite.grid.until_decided import Schedule

_GRID_ATTR = {"methods": "methods", "tasks": "tasks", "model": "models"}  # flag -> a grid's attribute in the study


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """One grid to expand: names as comma lists (None: not given; "": the flags picked none), its seeds, the study's
    training settings for it and its assignments in the order they apply (the file's top level, the grid's own, the
    command line's: later ones win)."""

    methods: str | None
    tasks: str | None
    models: str | None
    seeds: tuple[int, ...]
    train: Mapping[str, Any]
    sets: tuple[str, ...]
    sweeps: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """A study with the command line's overrides applied and the defaults filled: what its grids expand from."""

    study: Study
    overrides: Overrides
    top: GridSpec                  # the top level, as the flags leave it (an also: grid inherits what it lacks)
    top_empty: bool                # the flags picked nothing of the top grid (its also: grids may still run)
    values: Mapping[str, Any]      # every key of STUDY_DEFAULTS: the flag's, else the study's, else the default
    picked: frozenset[str]         # name flags that pick from the study's grids
    defines: frozenset[str]        # name flags that give the top grid what it lacks: part of the study, not a pick
    schedule: Schedule | None = None  # --until-decided: the study's rounds of seeds (defaults otherwise)

    @property
    def source(self) -> str | None:
        return self.study.source

    @property
    def seeds(self) -> list[int]:
        """The top level's seeds (extended to the cap under --until-decided): the order rounds add seeds in."""
        return list(self.top.seeds)

    @property
    def out(self) -> str:
        return self.values["out"]

    @property
    def device(self) -> str:
        return self.values["device"]

    @property
    def executor(self) -> str:
        return self.values["executor.name"]

    @property
    def executor_options(self) -> dict[str, Any]:
        return {name: self.values[f"executor.{name}"] for name in EXECUTOR_OPTIONS}

    def picked_flags(self, separator: str = " ") -> str:
        """The flags that picked part of the study, as given (`--tasks stsb --methods vanilla`)."""
        given = self.overrides.given
        return separator.join(f"--{k} {given[k]}" for k in sorted(self.picked))


@dataclasses.dataclass
class GridPlan:
    """Everything the command resolved from the study file and the flags, checked, before anything trains."""

    jobs: list
    models: list[str]
    tasks: list[str]
    methods: list[str]
    seeds: list[int]
    data_dir: Any
    outputs: Any
    executor_options: dict[str, Any]
    request: RunRequest


def resolve_study(study: Study, overrides: Overrides | None = None) -> GridPlan:
    """The grids of jobs `study` runs with the command line's overrides (flags, picks, seeds) applied: names,
    settings, executor and outputs resolved and checked; no data is read, no model is loaded."""
    return plan_grid(settle(study, overrides or Overrides()))


def settle(study: Study, overrides: Overrides) -> RunRequest:
    """Fill what the command line left unset from the study, then the defaults; picks narrow the top grid."""
    given = overrides.given
    values = {key: _first(overrides.values.get(key), _study_value(study, key), default)
              for key, default in STUDY_DEFAULTS.items()}
    top_names, picked, defines = {}, set(), set()
    for key in NAME_KEYS:
        top_names[key], picks, gives = _top_names(study, key, given.get(key), values["preset"])
        picked |= {key} if picks else set()
        defines |= {key} if gives else set()
    top_empty = any(key in given and top_names[key] == "" for key in NAME_KEYS)
    train = study.train_values()
    if study.tune is not None:  # the tuning split is carved in every run of the study (suite.grid.tuning)
        from suite.grid.tuning import protocol_train

        train = protocol_train(study.tune, train)
    for flag in ("methods", "tasks"):
        if not top_names[flag] and not top_empty:
            raise BadInput(f"no {flag} given: pass --{flag} (see `python -m suite list`) or a --study file that "
                           f"has a {flag}: entry")
    seeds, schedule = list(_first(given.get("seeds"), study.seeds, DEFAULT_SEEDS)), None
    if overrides.until_decided:  # the plan holds every seed up to the cap; the first look runs the starting ones
        from suite.grid.until_decided import seed_sequence, study_schedule

        schedule = study_schedule(study.until_decided, study.source)
        seeds = seed_sequence(seeds, schedule.cap)
    sets, sweeps = study.assignments()
    top = GridSpec(top_names["methods"], top_names["tasks"], top_names["model"], tuple(seeds), train,
                   (*sets, *overrides.sets), (*sweeps, *overrides.sweeps))
    return RunRequest(study, overrides, top, top_empty, values, frozenset(picked), frozenset(defines), schedule)


def _first(*values):
    return next((v for v in values if v is not None), None)


def _study_value(study: Study, key: str):
    """The study file's value at a dotted key (`executor.workers`); a list of names as a comma list."""
    value = study
    for part in key.split("."):
        value = getattr(value, part)
    return names(value) if isinstance(value, list) else value


def _top_names(study: Study, key: str, flag: str | None, preset: str) -> tuple[str | None, bool, bool]:
    """(the top grid's names for `key` as the flag leaves them, whether the flag picks from the study's grids,
    whether it gives the top grid names the file lacks)."""
    value = names(getattr(study, _GRID_ATTR[key]))
    if flag is None:
        return value, False, False
    in_grids = [names(getattr(g, _GRID_ATTR[key])) for g in study.also]
    picks = any(v is not None for v in [*in_grids, value])  # it picks from an also: grid it narrows, at least
    defines = key != "model" and value is None
    if picks and key == "model" and value is None:  # the top grid's models are then the preset's
        value = ",".join(PRESETS.get(preset).models)
    if value is None:
        return flag, picks, defines
    _check_picked(study.source, key, flag, [value, *in_grids])
    return _shared(key, value, flag), picks, defines


def _check_picked(study: str, key: str, flag_value: str, given: list[str | None]) -> None:
    """BadInput when a name the flag spells out is in none of the study's grids (with the names it has); a wildcard,
    group or `all` picks what the study has of it."""
    resolve = {"methods": method_registry().select, "tasks": select_tasks, "model": select_models}[key]
    have = list(dict.fromkeys(n for value in given if value for n in resolve(value)))
    explicit = [token.strip() for token in flag_value.split(",") if token.strip()  # models: names only
                and (key == "model" or (token.strip().lower() != "all" and not any(c in token for c in "*?[")))]
    missing = [n for token in explicit if len(found := resolve(token)) == 1 for n in found if n not in have]
    if missing:
        what = "models" if key == "model" else key
        raise BadInput(f"--{key} {flag_value}: {study} runs no {', '.join(missing)} (its {what}: "
                       f"{', '.join(have)}). With a study file, --{key} picks from the file's grids; to run other "
                       f"{what}, add them to the file (an also: grid keeps its own settings)")


def train_settings(grid: GridSpec, preset: str, flags: dict[str, Any], tasks: list[str]) -> dict:
    """Per task: the preset's settings, then the study's train: section, then the flags."""
    overrides = {**grid.train, **flags}
    trains = {t: dataclasses.replace(preset_train(preset, t), **overrides) for t in tasks}
    for t in trains.values():
        t.validate()
    return trains


@dataclasses.dataclass
class _Expanded:
    jobs: list
    models: list[str]
    tasks: list[str]
    methods: list[str]
    seeds: list[int]

    def add(self, part: _Expanded) -> None:
        """A further grid's jobs join these (a job given twice runs once: dropped when the plan is finished)."""
        self.jobs += part.jobs
        self.models, self.tasks, self.methods, self.seeds = (
            list(dict.fromkeys(mine + theirs)) for mine, theirs in ((self.models, part.models),
                                                                   (self.tasks, part.tasks),
                                                                   (self.methods, part.methods),
                                                                   (self.seeds, part.seeds)))


def plan_grid(request: RunRequest) -> GridPlan:
    """Resolve and check names, settings, executor and outputs (no data is read, no model is loaded)."""
    from suite.grid.executors import check_executor
    from suite.run.outputs import RunOutputs
    from suite.run.tracking import check_trackers

    preset = PRESETS.canonical(request.values["preset"])  # unknown: an error naming the valid ones
    check_executor(request.executor, request.executor_options)
    data_dir = resolve_data_dir(request.values["data_dir"])
    outputs = RunOutputs(request.out, bool(request.values["outputs.save_model"]),
                         bool(request.values["outputs.predict_test"]),
                         check_trackers((request.values["outputs.report_to"] or "").split(",")))
    source = "local" if data_dir else "hub"
    flags = request.overrides.train
    expanded = _Expanded([], [], [], [], []) if request.top_empty else _expand(request.top, preset, flags, source)
    for grid in request.study.also:  # a study's further grids: their jobs join the first grid's
        spec = also_grid(request, grid)
        if spec is not None:  # (None: the flags leave this grid nothing to run)
            part = _expand(spec, preset, flags, source)
            part.jobs = _finished(part.jobs, request, outputs)
            expanded.add(part)
    if not expanded.jobs and request.picked:  # (a grid without picking: preflight says what is empty)
        raise BadInput(f"{request.picked_flags(', ')}: no grid of {request.source} runs that combination; "
                       "`--dry-run` without them lists what the study runs")
    jobs = _finished(expanded.jobs, request, outputs)
    return GridPlan(jobs, expanded.models, expanded.tasks, expanded.methods, expanded.seeds, data_dir, outputs,
                    request.executor_options, request)


def _expand(grid: GridSpec, preset: str, flags: dict[str, Any], data_source: str) -> _Expanded:
    """One grid's jobs, its names checked."""
    from suite.api.metrics import check_task_metrics

    methods, tasks = method_registry().select(grid.methods), select_tasks(grid.tasks)
    for task in tasks:
        check_task_metrics(get_task(task))
    models = select_models(grid.models or ",".join(PRESETS.get(preset).models))
    jobs = build_grid(models, tasks, methods, list(grid.seeds), train_settings(grid, preset, flags, tasks),
                      list(grid.sets), list(grid.sweeps), data_source=data_source)
    return _Expanded(jobs, models, tasks, methods, list(dict.fromkeys(grid.seeds)))


def _finished(jobs: list, request: RunRequest, outputs) -> list:
    """The jobs as they will run: precision `auto` resolved here, before hashing (fp32 and bf16: two records), each
    job once, a task with its own data folder reading local files whatever the grid's source, outputs attached."""
    jobs = resolve_jobs_precision(jobs, request.device, request.executor, request.values["executor.address"])
    jobs = list({j.hash: j for j in jobs}.values())
    return [dataclasses.replace(j, data_source="local" if get_task(j.task).data_dir else j.data_source,
                                outputs=outputs if outputs.active else None) for j in jobs]


def also_grid(request: RunRequest, grid: AlsoGrid) -> GridSpec | None:
    """One `also:` grid: its own keys, the rest inherited from the top level (as the flags left it). A flag narrows
    a key the grid gives itself (`--tasks cola` runs the study's CoLA jobs, not the SST-2 grid's jobs moved to CoLA);
    None when the flag and the grid share nothing, or the grid inherits a key the flags emptied at the top level."""
    top, given = request.top, request.overrides.given
    inherited = {"methods": top.methods, "tasks": top.tasks, "model": top.models, "seeds": list(top.seeds)}
    own = {"methods": names(grid.methods), "tasks": names(grid.tasks), "model": names(grid.models),
           "seeds": grid.seeds}
    chosen = {}
    for key, value in own.items():
        if value is None:
            if inherited[key] == "":  # inherited from a top level the flags emptied (picked nothing)
                return None
            chosen[key] = inherited[key]
            continue
        if key in given:
            # names: the flag as given (the top level's may be narrowed); seeds: as --until-decided extended them
            value = _shared(key, value, given[key] if key in NAME_KEYS else inherited[key])
            if not value:
                return None
        chosen[key] = value
    file_sets, file_sweeps = request.study.assignments()
    sets, sweeps = grid.assignments()
    overrides = request.overrides
    return GridSpec(chosen["methods"], chosen["tasks"], chosen["model"], tuple(chosen["seeds"]),
                    {**top.train, **grid.train_values()},
                    (*file_sets, *sets, *overrides.sets), (*file_sweeps, *sweeps, *overrides.sweeps))


def select_models(text: str) -> list[str]:
    """A comma list of models as their canonical names, each once."""
    return list(dict.fromkeys(canonical_model(m) for m in text.split(",") if m.strip()))


def _shared(key: str, grid_value, flag_value):
    """The values of a grid key that the command line's flag also names, in the grid's order."""
    if key == "seeds":
        wanted_seeds = set(flag_value)
        return [s for s in grid_value if s in wanted_seeds]
    resolve = {"methods": method_registry().select, "tasks": select_tasks, "model": select_models}[key]
    wanted = set(resolve(flag_value))
    return ",".join(v for v in resolve(grid_value) if v in wanted)
