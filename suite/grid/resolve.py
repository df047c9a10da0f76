"""What a command asks for, resolved in one place: a study file (with its `also:` grids), the flags and the defaults,
into the grid of jobs that `run` trains, or the options of `report`.

Precedence everywhere: the command line, then the study file, then the preset and the defaults. With a study file,
`--methods`, `--tasks` and `--model` pick from its grids: every grid keeps the names both it and the flag give (a grid
left with none drops out), so `--tasks stsb` runs the study's STS-B jobs with their own grid's settings. `--seeds`
replaces the seeds a grid inherits and narrows those a grid gives itself.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from suite.api.errors import BadInput
from suite.api.method_facts import method_registry
from suite.api.tasks import get_task, select_tasks
from suite.grid.plan import build_grid
from suite.run.data import resolve_data_dir
from suite.run.device import resolve_jobs_precision
from suite.run.settings import PRESETS, canonical_model, preset_train

GRID_KEYS = ("methods", "tasks", "model", "seeds")  # what an also: grid of a study file may give for itself
_GRID_ATTR = {"methods": "methods", "tasks": "tasks", "model": "models"}  # flag -> a grid's attribute in the study
NAME_KEYS = tuple(_GRID_ATTR)  # a flag picks from what the study gives (seeds: it replaces)
EXECUTOR_OPTIONS = ("workers", "max_run_minutes", "address", "gpus_per_run", "cpus_per_run")
RUN_DEFAULTS = {"seeds": [1, 2, 3], "preset": "quick", "out": "runs", "device": "auto", "executor": "local"}


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


def merge_study(args: argparse.Namespace) -> argparse.Namespace:
    """Fill what the command line left unset from the study file (if any), then the defaults."""
    args = argparse.Namespace(**vars(args))
    args.study_train, args.also, args.tune = {}, [], None
    args.until_decided_section = args.study_report = None  # run --until-decided reads both (suite.grid.until_decided)
    for key in GRID_KEYS:  # an empty flag (`--methods ""`) is no flag
        if getattr(args, key) in ("", []):
            setattr(args, key, None)
    args.cli = {k: getattr(args, k) for k in GRID_KEYS if getattr(args, k) is not None}  # the flags as given
    args.picked, args.top_empty = set(), False
    args.defines = set()  # flags that give the file's top grid what it lacks: part of the study, not a pick
    args.cli_sets, args.cli_sweeps = list(args.sets), list(args.sweeps)
    if args.study:
        from suite.grid.study import load_study, names

        study = load_study(args.study)
        from_file = {"methods": names(study.methods), "tasks": names(study.tasks), "model": names(study.models),
                     "seeds": study.seeds, "preset": study.preset, "data_dir": study.data_dir, "out": study.out,
                     "device": study.device, "executor": study.executor.name,
                     **{k: getattr(study.executor, k) for k in EXECUTOR_OPTIONS},
                     "save_model": study.outputs.save_model, "predict_test": study.outputs.predict_test,
                     "report_to": names(study.outputs.report_to)}
        for key, value in from_file.items():
            in_grids = [names(getattr(g, _GRID_ATTR[key])) for g in study.also] if key in NAME_KEYS else []
            if key in ("methods", "tasks") and key in args.cli and value is None:
                args.defines.add(key)
            if key in NAME_KEYS and key in args.cli and any(v is not None for v in in_grids + [value]):
                args.picked.add(key)  # the flag picks from the study (an also: grid it narrows, at least)
                if key == "model" and value is None:  # the top grid's models are then the preset's
                    preset = args.preset or study.preset or RUN_DEFAULTS["preset"]
                    value = ",".join(PRESETS.get(preset).models)
            if getattr(args, key) is None:
                setattr(args, key, value)
            elif key in NAME_KEYS and value is not None:  # the flag picks from the file's top grid
                _check_picked(args.study, key, args.cli[key], [value, *in_grids])
                setattr(args, key, _shared(key, value, args.cli[key]))
                args.top_empty = args.top_empty or not getattr(args, key)
        sets, sweeps = study.assignments()
        args.sets, args.sweeps = sets + args.sets, sweeps + args.sweeps  # later assignments win
        args.study_train, args.also, args.tune = study.train_values(), study.also, study.tune
        args.until_decided_section, args.study_report = study.until_decided, study.report
        if study.tune is not None:  # the tuning split is carved in every run of the study (suite.grid.tuning)
            from suite.grid.tuning import protocol_train

            args.study_train = protocol_train(study.tune, args.study_train)
    for key, value in RUN_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for flag in ("methods", "tasks"):
        if not getattr(args, flag) and not args.top_empty:
            raise BadInput(f"no {flag} given: pass --{flag} (see `python -m suite list`) or a --study file that "
                           f"has a {flag}: entry")
    return args


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


def top_grid_empty(args) -> bool:
    """The flags picked nothing from the study's top grid (its also: grids may still run)."""
    return getattr(args, "top_empty", False)


def train_settings(args, tasks: list[str]) -> dict:
    """Per task: the preset's settings, then the study's train: section, then the flags."""
    flags = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "max_length": args.max_length,
             "max_train_samples": args.max_train_samples, "max_eval_samples": args.max_eval_samples,
             "precision": args.precision, "compile": args.compile, "grad_accumulation": args.grad_accumulation,
             "early_stopping_patience": args.early_stopping}
    overrides = {**args.study_train, **{k: v for k, v in flags.items() if v is not None}}
    trains = {t: dataclasses.replace(preset_train(args.preset, t), **overrides) for t in tasks}
    for t in trains.values():
        t.validate()
    return trains


def plan_grid(args) -> GridPlan:
    """Resolve and check names, settings, executor and outputs (no data is read, no model is loaded)."""
    from suite.api.metrics import check_task_metrics
    from suite.grid.executors import check_executor
    from suite.run.outputs import RunOutputs
    from suite.run.tracking import check_trackers

    args.preset = PRESETS.canonical(args.preset)  # unknown: an error naming the valid ones
    executor_options = {k: getattr(args, k) for k in EXECUTOR_OPTIONS}
    check_executor(args.executor, executor_options)
    data_dir = resolve_data_dir(args.data_dir)
    outputs = RunOutputs(args.out, bool(args.save_model), bool(args.predict_test),
                         check_trackers((args.report_to or "").split(",")))
    if top_grid_empty(args):  # the flags picked only from the study's also: grids
        models, tasks, methods, seeds, jobs = [], [], [], [], []
    else:
        methods, tasks = method_registry().select(args.methods), select_tasks(args.tasks)
        for task in tasks:
            check_task_metrics(get_task(task))
        models = select_models(args.model or ",".join(PRESETS.get(args.preset).models))
        jobs = build_grid(models, tasks, methods, args.seeds, train_settings(args, tasks), args.sets, args.sweeps,
                          data_source="local" if data_dir else "hub")
        seeds = list(dict.fromkeys(args.seeds))
    for grid in args.also:  # a study's further grids: their jobs join the first grid's (a job given twice runs once)
        grid_args = also_arguments(args, grid)
        if grid_args is None:  # the flags leave this grid nothing to run
            continue
        part = plan_grid(grid_args)
        jobs += part.jobs
        models, tasks, methods, seeds = (list(dict.fromkeys(a + b)) for a, b in
                                         ((models, part.models), (tasks, part.tasks), (methods, part.methods),
                                          (seeds, part.seeds)))
    if not jobs and getattr(args, "picked", None):  # (a grid without picking: preflight says what is empty)
        picked = ", ".join(f"--{k} {args.cli[k]}" for k in sorted(args.picked))
        raise BadInput(f"{picked}: no grid of {args.study} runs that combination; `--dry-run` without them lists "
                       "what the study runs")
    # precision auto becomes what the runs will train in here, before hashing (fp32 and bf16: two records)
    jobs = resolve_jobs_precision(jobs, args.device, args.executor, args.address)
    jobs = list({j.hash: j for j in jobs}.values())
    # a task with its own data folder reads local files whatever the grid's source; outputs travel with each job
    jobs = [dataclasses.replace(j, data_source="local" if get_task(j.task).data_dir else j.data_source,
                                outputs=outputs if outputs.active else None) for j in jobs]
    return GridPlan(jobs, models, tasks, methods, seeds, data_dir, outputs, executor_options)


def also_arguments(args, grid) -> argparse.Namespace | None:
    """The arguments of one `also:` grid: its own keys, the rest inherited from the top level (as the flags left
    them). A flag narrows a key the grid gives itself (`--tasks cola` runs the study's CoLA jobs, not the SST-2
    grid's jobs moved to CoLA); None when the flag and the grid share nothing, or the grid inherits a key the flags
    emptied at the top level."""
    from suite.grid.study import names

    part = argparse.Namespace(**vars(args))
    part.also, part.top_empty = [], False
    own = {"methods": names(grid.methods), "tasks": names(grid.tasks), "model": names(grid.models),
           "seeds": grid.seeds}
    for key, value in own.items():
        if value is None:
            if getattr(args, key) == "":  # inherited from a top level the flags emptied (picked nothing)
                return None
            continue
        if key in args.cli:
            # names: the flag as given (the top level's may be narrowed); seeds: as --until-decided extended them
            value = _shared(key, value, args.cli[key] if key in NAME_KEYS else getattr(args, key))
            if not value:
                return None
        setattr(part, key, value)
    part.study_train = {**args.study_train, **grid.train_values()}
    sets, sweeps = grid.assignments()
    # the file's top-level assignments, then the grid's, then the command line's: later ones win
    top_sets = args.sets[:len(args.sets) - len(args.cli_sets)]
    top_sweeps = args.sweeps[:len(args.sweeps) - len(args.cli_sweeps)]
    part.sets, part.sweeps = top_sets + sets + args.cli_sets, top_sweeps + sweeps + args.cli_sweeps
    return part


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




def report_arguments(args):
    """`report --study FILE`: the study's output folder and report: section fill what the command line left unset."""
    from suite.grid.study import load_study, names

    study = load_study(args.study)
    args.dir = args.dir or study.out
    if not args.dir:
        raise BadInput(f"{args.study}: no out: folder to report on; give it in the file or as DIR")
    for key in ("baseline", "alpha", "out", "margin", "collapse_floor"):
        if getattr(args, key, None) is None:
            setattr(args, key, getattr(study.report, key))
    for key in ("reference_tasks", "primary"):
        if getattr(args, key, None) is None and getattr(study.report, key) is not None:
            setattr(args, key, names(getattr(study.report, key)).split(","))
    if study.report.allow_uncommitted:
        args.allow_uncommitted = True
    return args
