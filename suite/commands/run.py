"""`python -m suite run`: the study (a file, or none) and the flags that override it -> its stages, planned and
checked before anything trains (suite.grid.stages) -> the runs -> the status table and the leaderboard."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from suite.api.errors import (
    EXIT_FAILED_RUNS,
    EXIT_INTERRUPTED,
    EXIT_NOT_STARTED,
    EXIT_TERMINATED,
    BadInput,
    Terminated,
)
from suite.api.tasks import TASKS
from suite.commands.run_options import add_run_options, run_overrides, train_keys_help
from suite.grid.summary import compact_leaderboard, grid_records
from suite.run.stopping import drain_signal, stop_signals

if TYPE_CHECKING:  # the method registry imports torch and transformers: `run --help` does without them
    from pathlib import Path

    from suite.grid.resolve import GridPlan
    from suite.grid.stages import StudyStages

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


def main(args) -> int:
    with drain_signal():  # SIGUSR1 while planning too: the grid then starts no run (docs/running-grids.md)
        return _main(args)


def _main(args) -> int:
    from suite.grid.stages import plan_stages
    from suite.grid.store import Store
    from suite.grid.study import Study, load_study

    if args.dry_run:  # it only plans: facts of the methods and the CPU may come from what is known without torch
        from suite.api import startup_cache

        startup_cache.plan_only()
    study = load_study(args.study) if args.study else Study()
    stages = plan_stages(study, run_overrides(args))
    show_plugin_errors()
    store = Store(stages.request.out)
    if args.dry_run:
        check_plan(stages, dry_run=True)  # what the real run refuses, so does the dry run (docs/reliability.md)
        print_dry_run(stages, store)
        return 0
    if getattr(args, "replay", False) and not args.until_decided:
        raise BadInput("--replay re-decides the looks of --until-decided from the records: give both")
    if getattr(args, "stop_by", None) is not None and stages.request.executor != "local":
        raise BadInput(f"--stop-by holds runs back before they start, which --executor {stages.request.executor} "
                       "cannot: it hands every run to the cluster at once; use --executor local, or leave "
                       "--stop-by out")
    preflight(stages, store)
    _write_command(store)
    return run_stages(stages, store, args)


def show_plugin_errors() -> None:
    from suite.api.method_facts import method_registry

    for registry in (method_registry(), TASKS):
        for name, error in registry.plugin_errors.items():
            print(f"warning: the {registry.kind} plugin {name!r} failed to load and is left out: {error}",
                  file=sys.stderr)


def print_dry_run(stages: StudyStages, store) -> None:
    """What a real run would warn about, then the jobs of every stage with their records' status."""
    from suite.grid import preflight

    plan, request = stages.plan, stages.request
    preflight.warn_grid(plan.jobs, request.device, request.top.sets, request.top.sweeps)
    print_tuning_dry_run(stages.tuning, plan, store) if stages.tuning else print_jobs(plan, store)
    if request.schedule is not None:
        print(f"--until-decided: looks at {', '.join(map(str, request.schedule.looks))} seeds; the first runs every "
              "job of its seeds, each later one only the undecided primary comparisons' (the list above is the "
              "most that can run)")
    print("\n" + "\n".join(data_and_cost_lines(stages) + left_cost_lines(stages, store)))
    if len(plan.methods) > 1:  # simulating the design takes seconds, more than a dry run should: a command of its own
        print("\neach primary comparison's chance of a decision at these seeds, before anything runs: "
              "`python -m suite plan` with the same options (docs/statistics.md, \"Power before running\")")


def data_and_cost_lines(stages: StudyStages, pilot: Path | None = None) -> list[str]:
    """Where the data comes from, and what every planned job (tuning runs included) costs per device kind, priced at
    the measured step times (`suite.run.progress.grid_cost_lines`) and, given a `pilot` folder with records, at its
    runs' whole-run times (`pilot_cost_lines`)."""
    import json
    from pathlib import Path

    from suite.api.tasks import get_task
    from suite.run.progress import MEASURED_STEPS, grid_cost_lines, pilot_cost_lines, planned_steps

    plan = stages.plan
    jobs = [*(stages.tuning.jobs if stages.tuning is not None else []), *plan.jobs]
    hub = sorted({get_task(j.task).hub[0] for j in jobs if j.data_source == "hub" and get_task(j.task).hub})
    own = sorted({f"{j.task} from {get_task(j.task).data_dir}" for j in jobs if get_task(j.task).data_dir})
    source = (f"data: TSV files under {plan.data_dir}" if plan.data_dir is not None
              else f"data: the Hugging Face hub ({', '.join(hub)}), downloaded on first use (no --data-dir given; "
                   "give --data-dir DIR to read local GLUE TSV files)" if hub else "data: each task's own folder")
    benches, unreadable = {}, []
    for path in filter(lambda p: Path(p).is_file(), MEASURED_STEPS):
        try:
            benches[path] = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:  # the estimate goes on without it, saying so
            unreadable.append(f"warning: {path}: not a bench result written by `python -m suite bench --json` "
                              f"({exc}); left out of the cost estimate")
    steps = planned_steps(jobs, plan.data_dir)
    timed = _pilot_step_seconds(pilot) if pilot is not None else None
    return [source + (f"; {', '.join(own)} (their own folders)" if own else ""), *unreadable,
            *grid_cost_lines(jobs, steps, benches),
            *(pilot_cost_lines(jobs, steps, *timed, str(pilot)) if timed else [])]


def left_cost_lines(stages: StudyStages, store) -> list[str]:
    """A grid under way: the jobs a real run would still train (an ok or kept record skips them), priced at this
    output folder's own runs (`pilot_cost_lines`), so a resumed campaign says what it has left; "nothing" once every
    job has a record; no line when none has. Under --until-decided, a later look's final job counts while a
    comparison of its cell is open."""
    from suite.run.progress import pilot_cost_lines, planned_steps

    tuning, final = stages.tuning, stages.plan.jobs
    if tuning is not None:   # a cell's selected rate where its tuning is complete, else the grid's own settings
        from suite.grid.tuning import selected_where_known

        final = selected_where_known(final, tuning)
    if stages.request.schedule is not None:   # the loop's statistics (scipy): only a dry run of it imports them
        from suite.grid.until_decided import still_to_run

        final = still_to_run(stages.plan, final, store)
    left = [j for j in final if store.skip_reason(j.filename) is None]
    left_tuning = [j for j in tuning.jobs if tuning.store.skip_reason(j.filename) is None] if tuning is not None else []
    total = len(final) + (len(tuning.jobs) if tuning is not None else 0)
    timed = _pilot_step_seconds(store.root)
    if not timed or len(left) + len(left_tuning) == total:
        return []
    if not (left or left_tuning):   # finished: say so, beside the estimate of the whole planned budget above
        stopped = " or is a later seed of a comparison the looks stopped" if stages.request.schedule else ""
        return [f"left: nothing: every job has an ok (or kept) record{stopped}; a real run trains nothing"]
    jobs = [*left_tuning, *left]
    steps = planned_steps(jobs, stages.plan.data_dir)
    until = " (at most: open comparisons may stop at their next look)" if stages.request.schedule else ""
    stage = f"{len(left_tuning)} tuning and {len(left)} final job(s)" if tuning is not None else f"{len(left)} job(s)"
    return [f"left: {stage} without an ok record{until}, priced at this output folder's own runs:",
            *pilot_cost_lines(jobs, steps, *timed, str(store.root), whose="this folder's")]


def _pilot_step_seconds(folder: Path) -> tuple[dict, set] | None:
    """{(device kind, model, task, method, cost settings): [wall_s / steps of each ok record]} of a folder's runs and
    tuning runs (`suite.grid.store.run_paces`), and the torch threads they ran with; None without such records."""
    from suite.grid.store import run_paces
    from suite.run.progress import cost_settings

    out, threads = {}, set()
    for pace in run_paces(folder):
        kind, job = ("GPU" if pace.device == "cuda" else "CPU"), pace.job
        out.setdefault((kind, job.model, job.task, job.method, cost_settings(job.train)), []).append(pace.step_s)
        if kind == "CPU":
            threads.add(pace.threads)
    return (out, threads) if out else None


def record_column(store, job) -> str:
    """What the real run finds at a job's record, by its own rule (`Store.skip_reason`): ok, failed, kept, or
    nothing; a kept record is named on stderr as the real run names it."""
    skip = store.skip_reason(job.filename)
    if skip is not None and skip.kept:
        print(f"warning: {job.label}: {skip.why}", file=sys.stderr)
        return "kept"
    return store.status(job.filename) or ""


def print_jobs(plan: GridPlan, store) -> None:
    from tabulate import tabulate

    rows = [[record_column(store, j), j.label, j.filename] for j in plan.jobs]
    print(tabulate(rows, headers=["record", "job", "file"], tablefmt="simple"))
    done, kept = sum(r[0] == "ok" for r in rows), sum(r[0] == "kept" for r in rows)
    print(f"\n{len(rows)} jobs; {done} have ok records (skipped unless --force)"
          + (f", {kept} kept records (skipped even with --force)" if kept else "")
          + f", {len(rows) - done - kept} would run")


def print_tuning_dry_run(tuning, plan: GridPlan, store) -> None:
    """Both stages: the tuning runs, then the final grid (its settings once tuning has selected them)."""
    from tabulate import tabulate

    from suite.grid.tuning import TuningIncomplete, select_configurations, selected_jobs, settings_text

    rows = [[record_column(tuning.store, j), f"{j.label} [{settings_text(c.settings)}]",
             f"tuning/runs/{j.filename}"]
            for cands in tuning.cells.values() for c in cands for j in c.jobs.values()]
    print("stage 1: tuning (scored on the tuning split)\n" + tabulate(rows, headers=["record", "job", "file"]))
    for note in tuning.notes:  # it runs, but its selection is weaker than docs/protocol.md recommends
        print(f"warning: tuning: {note}", file=sys.stderr)
    try:
        final = selected_jobs(plan.jobs, select_configurations(tuning))
        rows = [[record_column(store, j), j.label, j.filename] for j in final]
    except TuningIncomplete:
        final, rows = plan.jobs, [["", j.label, "after tuning"] for j in plan.jobs]
    print("\nstage 2: final grid, after tuning (scored on dev)\n"
          + tabulate(rows, headers=["record", "job", "file"]))
    done = sum(tuning.store.status(j.filename) == "ok" for j in tuning.jobs)
    print(f"\n{len(tuning.jobs)} tuning jobs ({done} with ok records); {len(final)} final jobs "
          f"({sum(r[0] == 'ok' for r in rows)} with ok records)")


def preflight(stages: StudyStages, store) -> None:
    """Everything that can stop the grid before training: data, models, device, settings, the output folder; then
    the line that says what will run."""
    from suite.grid import preflight as checks

    plan, request = stages.plan, stages.request
    checks.check_dependencies()
    check_plan(stages)
    checks.check_grid(plan.jobs, request.device, request.top.sets, request.top.sweeps, request.executor)
    checks.check_out(store, tuning=stages.tuning is not None, until_decided=request.schedule is not None)
    shape = (f"{len(plan.models)} model(s) x {len(plan.tasks)} task(s) x {len(plan.methods)} method(s) x "
             f"{len(plan.seeds)} seed(s){' x sweeps' if request.top.sweeps else ''}")
    if request.study.also:
        shape = f"{1 + len(request.study.also)} grids of the study over {shape.replace(' x ', ', ')}"
    print(f"{len(plan.jobs)} runs: {shape} -> {store.runs}", file=sys.stderr)


def check_plan(stages: StudyStages, dry_run: bool = False) -> None:
    """The checks a dry run and the real run share (neither loads a model nor writes): the output folder's name, the
    executor's options, the record files' names, and the data (every split reads, the tuning and held-out splits can
    be drawn; a dry run leaves data from the hub to the real run, saying so)."""
    from suite.grid import preflight as checks
    from suite.grid.executors.schedule import check_executor
    from suite.run.layout import check_folder_name

    plan, request = stages.plan, stages.request
    check_folder_name("--out", request.out)
    check_executor(request.executor, {k: v for k, v in plan.executor_options.items() if v is not None})
    checks.check_file_names(plan.jobs)
    checks.check_data(plan, local_only=dry_run)


def run_stages(stages: StudyStages, store, args) -> int:
    """The tuning stage, then the final grid (in rounds under --until-decided); the status table and leaderboard."""
    from suite.grid.executors import GridResult, HeldBack, StartGate, run_grid, status_table
    from suite.grid.store import RecordNotSaved
    from suite.grid.tuning import TuningIncomplete, run_tuning_stage
    from suite.grid.until_decided import closing_lines, run_planned

    plan, request = stages.plan, stages.request
    local = request.executor == "local"
    gate = StartGate(getattr(args, "stop_by", None)) if local else None  # SIGUSR1 drains a local grid
    if gate is not None and gate.deadline is not None:
        _stderr(gate.line())

    def run_jobs(jobs, into=store):
        if getattr(args, "replay", False):   # decisions from the records there are: nothing trains
            return GridResult()
        return run_grid(jobs, into, plan.data_dir, executor=request.executor, force=args.force, quiet=args.quiet,
                        device=request.device, gate=gate, **plan.executor_options)  # HeldBack when it held runs

    sequential = None
    try:
        with stop_signals(can_drain=local):
            if stages.tuning is not None:  # the final grid runs the configurations tuning selects
                plan.jobs = run_tuning_stage(stages.tuning, plan.jobs, run_jobs, stages.whole_tuning, say=_stderr)
            _complete_finished_outputs(plan, store, args.force)
            if request.schedule is not None:  # rounds of seeds for the undecided primary comparisons
                sequential = run_planned(plan, store, run_jobs, say=_stderr, replay=getattr(args, "replay", False))
            result = sequential.result if sequential is not None else run_jobs(plan.jobs)
    except (KeyboardInterrupt, Terminated) as exc:
        _stderr(f"\n{'terminated' if isinstance(exc, Terminated) else 'interrupted'}: finished records are kept; "
                "the interrupted run was not recorded and will run when the same command is given again")
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    except HeldBack as exc:
        print(status_table(exc.result))
        _stderr(f"\nstopped starting runs: {len(exc.result.held)} run(s) not started ({exc.result.held[0][1]}); "
                "finished records are kept, and the same command runs the rest (failed runs included)"
                + ("; under --until-decided a look is taken only on a complete round" if request.schedule is not None
                   else ""))
        return EXIT_NOT_STARTED
    except TuningIncomplete as exc:
        _stderr(f"error: {exc}")
        return EXIT_FAILED_RUNS
    except RecordNotSaved as exc:  # unwritable or full disk after a run finished: stop, keep what was written
        _stderr(f"error: {exc}\nthe grid stopped; records written before are kept; fix the disk and give the same "
                "command again to run the rest")
        return EXIT_FAILED_RUNS
    print(status_table(result))
    print("\n" + compact_leaderboard(grid_records(plan.jobs, store), out=request.out))
    if sequential is not None:
        print("\n" + closing_lines(sequential))
    return 0 if not result.failed else EXIT_FAILED_RUNS


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _complete_finished_outputs(plan: GridPlan, store, force: bool) -> None:
    """Runs skipped because their record exists get the test predictions asked for now from their saved models;
    what cannot be had without retraining is named per run (suite.grid.finished_runs)."""
    from suite.grid.finished_runs import complete_outputs

    for line in complete_outputs(plan.jobs, store, plan.outputs, plan.data_dir, plan.request.device, force):
        _stderr(f"note: {line}")


def _write_command(store) -> None:
    """Remember the command that produced the runs (reports print it in their header)."""
    from suite.run.layout import OutputFolder

    store.root.mkdir(parents=True, exist_ok=True)
    with open(OutputFolder(store.root).commands, "a", encoding="utf-8") as fh:
        fh.write("python -m suite " + " ".join(map(shell_word, sys.argv[1:])) + "\n")


def shell_word(arg: str) -> str:
    """`arg` quoted for a shell on one line: a control character (a newline) or a byte that is not UTF-8 (a name
    the locale could not decode) is written in bash's $'\\xHH' form, so that a command always takes one line of
    commands.txt and gives back the same bytes."""
    def raw(c: str) -> bool:
        return ord(c) < 32 or ord(c) == 127 or 0xDC80 <= ord(c) <= 0xDCFF  # surrogateescape's bytes
    if not any(raw(c) for c in arg):
        return shlex.quote(arg.encode("utf-8", "backslashreplace").decode())
    escaped = "".join(f"\\x{ord(c) & 0xFF:02x}" if raw(c) else "\\" + c if c in "\\'" else c for c in arg)
    return "$'" + escaped.encode("utf-8", "backslashreplace").decode() + "'"
