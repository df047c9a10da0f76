"""`python -m suite run`: build the grid from a study file and the flags, check everything before training, run it,
print the table."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import signal
import sys
from typing import Any

from suite.api.attention import METHODS
from suite.run.settings import PRESETS, canonical_model, preset_train
from suite.grid.plan import build_grid
from suite.api.tasks import TASKS, get_task, select_tasks
from suite.run.data import load_splits, resolve_data_dir, task_data_dir
from suite.api.errors import EXIT_FAILED_RUNS, EXIT_INTERRUPTED, EXIT_TERMINATED, BadInput, Terminated
from suite.grid.summary import compact_leaderboard, grid_records
from suite.commands.run_options import RUN_DEFAULTS, add_run_options, train_keys_help

COMMAND = "run"
GRID_KEYS = ("methods", "tasks", "model", "seeds")  # what an also: grid of a study file may give for itself
EXECUTOR_OPTIONS = ("workers", "address", "gpus_per_run", "cpus_per_run")


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, help="fine-tune a grid of models x tasks x methods x seeds x hyper-parameters",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Runs every job of the grid whose record is not already in OUT/runs/.\n"
                                   "The grid comes from --study FILE and/or the flags; --methods and --tasks are\n"
                                   "needed one way or the other. A flag replaces the file's value; in a grid under\n"
                                   "also: that names its own, it keeps only what both name (--tasks cola: the\n"
                                   "study's CoLA jobs).",
                       epilog="training settings, with their defaults (--set train.KEY=VALUE, --sweep "
                              "train.KEY=V1,V2,\nor a study's train: section):\n" + train_keys_help())
    add_run_options(p)


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
    args.study_train, args.also = {}, []
    args.cli = {k for k in GRID_KEYS if getattr(args, k) is not None}  # flags win over every grid of the file
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
            if getattr(args, key) is None:
                setattr(args, key, value)
        sets, sweeps = study.assignments()
        args.sets, args.sweeps = sets + args.sets, sweeps + args.sweeps  # later assignments win
        args.study_train, args.also = study.train_values(), study.also
    for key, value in RUN_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for flag in ("methods", "tasks"):
        if not getattr(args, flag):
            raise BadInput(f"no {flag} given: pass --{flag} (see `python -m suite list`) or a --study file that "
                           f"has a {flag}: entry")
    return args


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
    from suite.grid.executors import check_executor
    from suite.api.metrics import check_task_metrics
    from suite.run.outputs import RunOutputs
    from suite.run.tracking import check_trackers

    if args.preset not in PRESETS:
        raise BadInput(f"preset {args.preset!r} does not exist. Valid presets: {', '.join(sorted(PRESETS))}")
    executor_options = {k: getattr(args, k) for k in EXECUTOR_OPTIONS}
    check_executor(args.executor, executor_options)
    methods, tasks = METHODS.select(args.methods), select_tasks(args.tasks)
    for task in tasks:
        check_task_metrics(get_task(task))
    models = select_models(args.model or ",".join(PRESETS[args.preset]["models"]))
    data_dir = resolve_data_dir(args.data_dir)
    outputs = RunOutputs(args.out, bool(args.save_model), bool(args.predict_test),
                         check_trackers((args.report_to or "").split(",")))
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
    jobs = list({j.hash: j for j in jobs}.values())
    # a task with its own data folder reads local files whatever the grid's source; outputs travel with each job
    jobs = [dataclasses.replace(j, data_source="local" if get_task(j.task).data_dir else j.data_source,
                                outputs=outputs if outputs.active else None) for j in jobs]
    return GridPlan(jobs, models, tasks, methods, seeds, data_dir, outputs, executor_options)


def also_arguments(args, grid) -> argparse.Namespace | None:
    """The arguments of one `also:` grid: its own keys, the rest inherited from the top level. A flag replaces an
    inherited key but only narrows a key the grid gives itself (`--tasks cola` runs the study's CoLA jobs, not the
    SST-2 grid's jobs moved to CoLA); None when the flag and the grid share nothing."""
    from suite.grid.study import names

    part = argparse.Namespace(**vars(args))
    part.also = []
    own = {"methods": names(grid.methods), "tasks": names(grid.tasks), "model": names(grid.models),
           "seeds": grid.seeds}
    for key, value in own.items():
        if value is None:
            continue
        if key in args.cli:
            value = _shared(key, value, getattr(args, key))
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
    resolve = {"methods": METHODS.select, "tasks": select_tasks, "model": select_models}[key]
    wanted = set(resolve(flag_value))
    return ",".join(v for v in resolve(grid_value) if v in wanted)


def check_inputs(plan: GridPlan) -> None:
    """Read every split now (a missing file or a malformed line stops the grid before training) and find the test
    sets when predictions are asked for (models are checked by `preflight`)."""
    for task in plan.tasks:
        load_splits(get_task(task), plan.data_dir)
        if plan.outputs.predict_test:
            from suite.run.test_predictions import available_test_sets

            found, absent = available_test_sets(get_task(task), task_data_dir(get_task(task), plan.data_dir))
            if not found:
                raise BadInput(f"--predict-test: {get_task(task).display} has no test set here "
                               f"({', '.join(absent) or 'none declared'}); drop the task or the option")


def show_plugin_errors() -> None:
    for registry in (METHODS, TASKS):
        for name, error in registry.plugin_errors.items():
            print(f"warning: the {registry.kind} plugin {name!r} failed to load and is left out: {error}",
                  file=sys.stderr)


def print_dry_run(plan: GridPlan, store) -> None:
    from tabulate import tabulate

    rows = [[store.status(j.filename) or "", j.label, j.filename] for j in plan.jobs]
    print(tabulate(rows, headers=["record", "job", "file"], tablefmt="simple"))
    done = sum(r[0] == "ok" for r in rows)
    print(f"\n{len(rows)} jobs; {done} have ok records (skipped unless --force), {len(rows) - done} would run")


def main(args) -> int:
    from suite.grid import preflight
    from suite.grid.executors import run_grid, status_table
    from suite.grid.store import RecordNotSaved, Store

    args = merge_study(args)
    plan = plan_grid(args)
    show_plugin_errors()
    store = Store(args.out)
    if args.dry_run:
        print_dry_run(plan, store)
        return 0
    check_inputs(plan)
    preflight.check_grid(plan.jobs, args.device, args.sets, args.sweeps, args.executor)  # models, device, --set
    preflight.check_out(store)
    shape = (f"{len(plan.models)} model(s) x {len(plan.tasks)} task(s) x {len(plan.methods)} method(s) x "
             f"{len(plan.seeds)} seed(s){' x sweeps' if args.sweeps else ''}")
    if args.also:
        shape = f"{1 + len(args.also)} grids of the study over {shape.replace(' x ', ', ')}"
    print(f"{len(plan.jobs)} runs: {shape} -> {store.runs}", file=sys.stderr)
    _warn_missing_outputs(plan, store, args.force)
    _write_command(store)
    try:
        with _sigterm_as_interrupt():
            result = run_grid(plan.jobs, store, plan.data_dir, executor=args.executor, force=args.force,
                              quiet=args.quiet, device=args.device, **plan.executor_options)
    except (KeyboardInterrupt, Terminated) as exc:
        print(f"\n{'terminated' if isinstance(exc, Terminated) else 'interrupted'}: finished records are kept; "
              "the interrupted run was not recorded and will run when the same command is given again",
              file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    except RecordNotSaved as exc:  # unwritable or full disk after a run finished: stop, keep what was written
        print(f"error: {exc}\nthe grid stopped; records written before are kept; fix the disk and give the same "
              "command again to run the rest", file=sys.stderr)
        return EXIT_FAILED_RUNS
    print(status_table(result))
    print("\n" + compact_leaderboard(grid_records(plan.jobs, store), out=args.out))
    return 0 if not result.failed else EXIT_FAILED_RUNS


def _warn_missing_outputs(plan: GridPlan, store, force: bool) -> None:
    """Runs skipped because their record exists do not produce the model or predictions asked for now: say so."""
    wanted = [k for k, on in (("model", plan.outputs.save_model), ("test_predictions", plan.outputs.predict_test))
              if on]
    if force or not wanted:
        return
    lacking = [j for j in plan.jobs if (rec := store.read(j.filename)) and rec.get("status") == "ok"
               and any(k not in (rec.get("artifacts") or {}) for k in wanted)]
    if lacking:
        print(f"note: {len(lacking)} run(s) already have records without {' or '.join(wanted)}; they are skipped. "
              "--force reruns them", file=sys.stderr)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    def stop(signum, frame):
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_command(store) -> None:
    """Remember the command that produced the runs (reports print it in their header)."""
    store.root.mkdir(parents=True, exist_ok=True)
    with open(store.root / "commands.txt", "a") as fh:
        fh.write("python -m suite " + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "\n")

