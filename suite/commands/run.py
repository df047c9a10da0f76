"""`python -m suite run`: build the grid from a study file and the flags, check everything before training, run it,
print the table."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from suite.api.errors import EXIT_FAILED_RUNS, EXIT_INTERRUPTED, EXIT_TERMINATED, BadInput, Terminated
from suite.api.tasks import TASKS, get_task
from suite.commands.run_options import add_run_options, train_keys_help
from suite.grid.summary import compact_leaderboard, grid_records
from suite.run.data import load_splits, task_data_dir
from suite.run.stopping import stop_signals

if TYPE_CHECKING:  # the method registry imports torch and transformers: `run --help` does without them
    from suite.grid.resolve import GridPlan

COMMAND = "run"


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, help="fine-tune a grid of models x tasks x methods x seeds x hyper-parameters",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Runs every job of the grid whose record is not already in OUT/runs/.\n"
                                   "The grid comes from --study FILE and/or the flags; --methods and --tasks are\n"
                                   "needed one way or the other. With a study, --methods, --tasks and --model\n"
                                   "pick from its grids, each keeping its own settings (--tasks cola: the study's\n"
                                   "CoLA jobs); --seeds replaces the seeds a grid inherits; other flags replace the\n"
                                   "file's value.",
                       epilog="training settings, with their defaults (--set train.KEY=VALUE, --sweep "
                              "train.KEY=V1,V2,\nor a study's train: section):\n" + train_keys_help())
    add_run_options(p)


def check_inputs(plan: GridPlan) -> None:
    """Read every split now (a missing file or a malformed line stops the grid before training) and find the test
    sets when predictions are asked for (models are checked by `preflight`)."""
    from suite.run.draws import check_holdouts

    for task in plan.tasks:
        spec = get_task(task)
        splits = load_splits(spec, plan.data_dir)
        train = splits[spec.train_split]
        check_holdouts(train["label"], [j.train for j in plan.jobs if j.task == task], not spec.is_regression,
                       spec.display)
        if spec.is_regression:
            _check_scores_vary(spec, splits, [j.train for j in plan.jobs if j.task == task], plan.data_dir)
        if plan.outputs.predict_test:
            from suite.run.test_predictions import available_test_sets

            found, absent = available_test_sets(get_task(task), task_data_dir(get_task(task), plan.data_dir))
            if not found:
                raise BadInput(f"--predict-test: {get_task(task).display} has no test set here "
                               f"({', '.join(absent) or 'none declared'}); drop the task or the option")


def _check_scores_vary(spec, splits: dict, trains, data_dir) -> None:
    """A regression task is scored by correlation, which gold scores that are all equal leave undefined: such a dev
    subset would train every run and then fail (or score nothing); stop before training and name the file."""
    from suite.run.draws import dev_rows

    for suffix, split in spec.eval_splits.items():
        labels = splits[split]["label"]
        for t in {(t.max_eval_samples, t.data_seed): t for t in trains}.values():
            used = {labels[i] for i in dev_rows(len(labels), t)}
            if len(used) < 2:
                where, layout = task_data_dir(spec, data_dir), spec.local.get(split)
                source = where / spec.local_dir / layout.file if where is not None and layout else f"hub split {split}"
                raise BadInput(f"{spec.display}: every gold score of the dev examples used from {source} is "
                               f"{next(iter(used), 'absent')!r}, so the correlation that scores the task is undefined; "
                               "repair the file, or use more dev examples (--max-eval-samples)")


def show_plugin_errors() -> None:
    from suite.api.method_facts import method_registry

    for registry in (method_registry(), TASKS):
        for name, error in registry.plugin_errors.items():
            print(f"warning: the {registry.kind} plugin {name!r} failed to load and is left out: {error}",
                  file=sys.stderr)


def print_dry_run(plan: GridPlan, store) -> None:
    from tabulate import tabulate

    rows = [[store.status(name) or "", j.label, name] for j in plan.jobs for name in [j.filename]]
    print(tabulate(rows, headers=["record", "job", "file"], tablefmt="simple"))
    done = sum(r[0] == "ok" for r in rows)
    print(f"\n{len(rows)} jobs; {done} have ok records (skipped unless --force), {len(rows) - done} would run")


def main(args) -> int:
    from suite.grid import preflight
    from suite.grid.executors import run_grid, status_table
    from suite.grid.resolve import merge_study
    from suite.grid.store import RecordNotSaved, Store
    from suite.grid.tuning import TuningIncomplete

    if args.dry_run:  # it only plans: facts of the methods and the CPU may come from what is known without torch
        from suite.api import startup_cache

        startup_cache.plan_only()
    if args.analyses:  # a shortcut for train.analyses, which leaves the run's hash as it is (settings.NOT_HASHED)
        args.sets = [*args.sets, f"train.analyses={args.analyses}"]
    raw, args = args, merge_study(args)
    args, plan = _planned(args)
    # a run that picks part of a study: its primary family and its tuning selections stay the whole study's
    whole = whole_study(raw, args) if args.until_decided or args.tune is not None else None
    if whole is not None:
        whole_args, whole_plan = _whole_planned(whole, args)
    if args.until_decided:  # no primary comparison, a sweep or a missing reference: exit 2 before any training
        from suite.grid.until_decided import primary_comparisons, same_family

        whole_primary = (_for_whole(lambda: primary_comparisons(whole_plan, whole_args), args)
                         if whole is not None else None)
        try:
            primary = primary_comparisons(plan, args, note=lambda line: print(line, file=sys.stderr))
        except BadInput:
            if whole_primary is None:
                raise
            primary = []  # the pick left no primary comparison: same_family says which of the study's it drops
        if whole_primary is not None:
            same_family(primary, whole_primary, args.cli, args.picked)
    if plan.outputs.report_to:  # trackers group the runs by study and grid
        from suite.run.tracking import with_grid_tags

        plan.jobs = with_grid_tags(plan.jobs, args.study)
    tuning = plan_tuning(args, plan)  # None unless the study has a tune: block
    whole_tuning = _for_whole(lambda: plan_tuning(whole_args, whole_plan), args) if whole is not None else None
    show_plugin_errors()
    store = Store(args.out)
    if args.dry_run:
        preflight.warn_grid(plan.jobs, args.device, args.sets, args.sweeps)  # what a real run would warn about
        print_tuning_dry_run(tuning, plan, store) if tuning else print_dry_run(plan, store)
        if args.until_decided:
            print(f"--until-decided: looks at {', '.join(map(str, args.schedule.looks))} seeds; the first runs every "
                  "job of its seeds, each later one only the undecided primary comparisons' (the list above is the "
                  "most that can run)")
        return 0
    check_inputs(plan)
    preflight.check_grid(plan.jobs, args.device, args.sets, args.sweeps, args.executor)  # models, device, --set
    preflight.check_out(store)
    shape = (f"{len(plan.models)} model(s) x {len(plan.tasks)} task(s) x {len(plan.methods)} method(s) x "
             f"{len(plan.seeds)} seed(s){' x sweeps' if args.sweeps else ''}")
    if args.also:
        shape = f"{1 + len(args.also)} grids of the study over {shape.replace(' x ', ', ')}"
    print(f"{len(plan.jobs)} runs: {shape} -> {store.runs}", file=sys.stderr)
    _write_command(store)
    try:
        with stop_signals():
            if tuning is not None:  # first the tuning stage; the final grid runs the configurations it selects
                plan.jobs = run_tuning(tuning, plan, args, whole_tuning)
            _complete_finished_outputs(plan, store, args)
            def run_round(jobs):
                return run_grid(jobs, store, plan.data_dir, executor=args.executor, force=args.force,
                                quiet=args.quiet, device=args.device, **plan.executor_options)

            if args.until_decided:  # rounds of seeds for the undecided primary comparisons (suite.grid.until_decided)
                from suite.grid.until_decided import closing_lines, run_planned

                sequential = run_planned(plan, store, args, run_round, say=lambda line: print(line, file=sys.stderr))
                result = sequential.result
            else:
                result = run_round(plan.jobs)
    except (KeyboardInterrupt, Terminated) as exc:
        print(f"\n{'terminated' if isinstance(exc, Terminated) else 'interrupted'}: finished records are kept; "
              "the interrupted run was not recorded and will run when the same command is given again",
              file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    except TuningIncomplete as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED_RUNS
    except RecordNotSaved as exc:  # unwritable or full disk after a run finished: stop, keep what was written
        print(f"error: {exc}\nthe grid stopped; records written before are kept; fix the disk and give the same "
              "command again to run the rest", file=sys.stderr)
        return EXIT_FAILED_RUNS
    print(status_table(result))
    print("\n" + compact_leaderboard(grid_records(plan.jobs, store), out=args.out))
    if args.until_decided:
        print("\n" + closing_lines(sequential))
    return 0 if not result.failed else EXIT_FAILED_RUNS


def plan_tuning(args, plan: GridPlan):
    """The study's tuning stage (suite.grid.tuning), or None when it declares none."""
    if args.tune is None:
        return None
    from suite.grid.tuning import plan_tuning as plan_stage

    return plan_stage(args.tune, plan.jobs, plan.seeds, args.out)


def _planned(args):
    """(args, their grid plan), the seeds extended to the cap first under --until-decided."""
    from suite.grid.resolve import plan_grid

    if args.until_decided:  # the study's until_decided: schedule; the plan holds every seed up to its cap
        from suite.grid.until_decided import prepare

        args = prepare(args)
    return args, plan_grid(args)


def _for_whole(make, args):
    """`make()`, whose BadInput names the whole study it came from."""
    try:
        return make()
    except BadInput as exc:
        picked = " ".join(f"--{k} {args.cli[k]}" for k in sorted(args.picked))
        raise BadInput(f"{args.study} as a whole (this run, with {picked}, is part of it and is checked against "
                       f"it): {exc}") from None


# the flags that say where a study runs, not what: the whole study keeps them (device and executor decide what
# `precision: auto` resolves to, and so the jobs' hashes)
PLACE_FLAGS = ("data_dir", "out", "device", "executor", "address", "until_decided")


def whole_study(raw: argparse.Namespace, merged: argparse.Namespace) -> argparse.Namespace | None:
    """When the flags picked part of a study (`merged.picked`), the arguments of the study's own command: the file
    alone, with the command's place flags. A picked run is checked against its primary family and writes its
    tuning selections beside the whole study's. None when nothing was picked."""
    if not getattr(merged, "picked", None):
        return None
    from suite.commands import build_parser

    whole = build_parser().parse_args(["run", "--study", str(raw.study)])
    for key in (*PLACE_FLAGS, *getattr(merged, "defines", ())):  # a top grid without methods/tasks takes the flag's
        setattr(whole, key, getattr(raw, key))
    return whole


def _whole_planned(whole, args):
    from suite.grid.resolve import merge_study

    return _for_whole(lambda: _planned(merge_study(whole)), args)


def run_tuning(tuning, plan: GridPlan, args, whole=None) -> list:
    """Run the tuning jobs that have no record, write the selection, and return the final grid's jobs with it.
    `whole`: the tuning plan of the study's own command when the flags picked part of it: the selection file holds
    this run's cells and, beside them, the study's other cells as its records select them (none dropped, none kept
    from an older file)."""
    from suite.grid.executors import run_grid, status_table
    from suite.grid.tuning import select, selected_jobs, with_other_cells, write_selection

    tune = tuning.tune
    print(f"tuning: {len(tuning.jobs)} runs ({tune.budget} configurations per method x {len(tune.seeds)} tuning "
          f"seed(s)) -> {tuning.store.runs}", file=sys.stderr)
    result = run_grid(tuning.jobs, tuning.store, plan.data_dir, executor=args.executor, force=args.force,
                      quiet=args.quiet, device=args.device, **plan.executor_options)
    print(status_table(result), file=sys.stderr)
    own = select(tuning)
    written = write_selection(tuning, with_other_cells(own, select(whole)) if whole is not None else own)
    print(f"tuning: selection written to {written}", file=sys.stderr)
    return selected_jobs(plan.jobs, own)


def print_tuning_dry_run(tuning, plan: GridPlan, store) -> None:
    """Both stages: the tuning runs, then the final grid (its settings once tuning has selected them)."""
    from tabulate import tabulate

    from suite.grid.tuning import TuningIncomplete, select, selected_jobs, settings_text

    rows = [[tuning.store.status(j.filename) or "", f"{j.label} [{settings_text(c.settings)}]",
             f"tuning/runs/{j.filename}"]
            for cands in tuning.cells.values() for c in cands for j in c.jobs.values()]
    print("stage 1: tuning (scored on the tuning split)\n" + tabulate(rows, headers=["record", "job", "file"]))
    try:
        final = selected_jobs(plan.jobs, select(tuning))
        rows = [[store.status(j.filename) or "", j.label, j.filename] for j in final]
    except TuningIncomplete:
        final, rows = plan.jobs, [["", j.label, "after tuning"] for j in plan.jobs]
    print("\nstage 2: final grid, after tuning (scored on dev)\n"
          + tabulate(rows, headers=["record", "job", "file"]))
    done = sum(tuning.store.status(j.filename) == "ok" for j in tuning.jobs)
    print(f"\n{len(tuning.jobs)} tuning jobs ({done} with ok records); {len(final)} final jobs "
          f"({sum(r[0] == 'ok' for r in rows)} with ok records)")


def _complete_finished_outputs(plan: GridPlan, store, args) -> None:
    """Runs skipped because their record exists get the test predictions asked for now from their saved models;
    what cannot be had without retraining is named per run (suite.grid.finished_runs)."""
    from suite.grid.finished_runs import complete_outputs

    for line in complete_outputs(plan.jobs, store, plan.outputs, plan.data_dir, args.device, args.force):
        print(f"note: {line}", file=sys.stderr)


def _write_command(store) -> None:
    """Remember the command that produced the runs (reports print it in their header)."""
    store.root.mkdir(parents=True, exist_ok=True)
    with open(store.root / "commands.txt", "a") as fh:
        fh.write("python -m suite " + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "\n")

