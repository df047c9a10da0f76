"""`python -m suite report DIR [MORE_RUN_DIRS...]`: the command line of `suite.report.build_report`."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Mapping

from suite.api.errors import EXIT_BAD_INPUT, BadInput, ReportError
from suite.report import ReportOptions, build_report
from suite.run.settings import RunConfig
from suite.stats.report_options import REPORT_FIELDS, Bounds

# the command, and what the rest of the suite uses
__all__ = ["COMMAND", "add_parser", "main", "planned_jobs", "report_request"]

COMMAND = "report"


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, help="leaderboard markdown, tables and figures from run records",
                       description="Reads DIR/runs/*.json (and the run folders after it) and writes "
                                   "DIR/leaderboard.md, its tables as CSV and LaTeX, and DIR/figures/.")
    p.add_argument("dir", nargs="?", help="output folder of `python -m suite run` (holds runs/)")
    p.add_argument("more", nargs="*", help="more run folders whose records join the report")
    p.add_argument("--study", help="a study file: its out: folder and report: options fill what is not given here")
    for name, declared in REPORT_FIELDS.items():
        if declared.metadata["flag"]:
            _add_flag(p, name, declared.default, declared.metadata)


def _add_flag(p: argparse.ArgumentParser, name: str, default, meta) -> None:
    """An option's flag, from its declaration (`suite.stats.report_options`): a true/false option's flag switches it
    away from its default; every flag is None when not given, so that a study fills it, then the default."""
    flag = "--" + name.replace("_", "-")
    if isinstance(default, bool):
        p.add_argument(f"--no-{flag[2:]}" if default else flag, dest=name, default=None,
                       action="store_false" if default else "store_true", help=meta["help"])
        return
    kind = _bounded(meta["bounds"]) if meta["bounds"] else _comma_list if meta["comma_list"] else None
    p.add_argument(flag, type=kind, choices=meta["choices"]() if meta["choices"] else None, help=meta["help"],
                   default=os.environ.get(meta["env"]) if meta["env"] else None)


def _comma_list(text: str) -> list[str]:
    found = [t.strip() for t in text.split(",") if t.strip()]
    if not found:  # `--primary ,` named nothing, and read as no option given
        raise argparse.ArgumentTypeError(f"{text!r} names nothing: give a comma list of names")
    return found


def _bounded(bounds: Bounds):
    """An argparse type: a number within `bounds`; else a usage error."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not bounds.holds(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {bounds.what}")
        return value
    return parse


def report_request(args: argparse.Namespace) -> tuple[list[str], ReportOptions]:
    """The run folders and options of a report: each option from its flag, else from the study's report: section
    (`--study`), else its default; the study's out: folder where DIR is not given."""
    from suite.api.attention import METHODS
    from suite.run.layout import check_folder_name

    flags = {name: getattr(args, name) for name, field in REPORT_FIELDS.items() if field.metadata["flag"]}
    study, folder = {}, args.dir
    if args.study:
        from suite.grid.study import load_study

        loaded = load_study(args.study)
        study, folder = loaded.report_options(), folder or loaded.out
        if not folder:
            raise BadInput(f"{args.study}: no out: folder to report on; give it in the file or as DIR")
    if not folder:
        raise ReportError("give the output folder DIR of `python -m suite run`, or --study FILE")
    options = ReportOptions.settled(flags, study, planner=planned_jobs)
    options = dataclasses.replace(options, baseline=METHODS.canonical(options.baseline))  # unknown: a suggestion
    if options.out is not None:
        check_folder_name("--out", options.out)
    if options.out and os.path.exists(options.out) and not os.path.isdir(options.out):
        raise ReportError(f"--out {options.out} is a file: the report is a folder (leaderboard.md, tables, figures/); "
                          "give a folder")
    folders = [folder, *args.more]
    if args.study:  # a pre-registered study's verdicts: the registered analysis, on the registered records only
        options = dataclasses.replace(options, registration=registration_check(args.study, options, folders))
    return folders, options


def registration_check(study_file: str, applied: ReportOptions, folders: list[str]):
    """Given the first record's start, why the analysis applied is not the one registered in `study_file`: the file
    changed since its last commit before the first run (suite.grid.registration), the options settled from the
    flags decide verdicts otherwise than that commit's report: section, records come from other folders than its
    out:, or a `run` that wrote them shaped its jobs otherwise than the study (its commands.txt)."""
    from datetime import datetime

    def check(first: datetime) -> list[str]:
        from suite.grid.overrides import STUDY_DEFAULTS
        from suite.grid.registration import registered_study

        registered = registered_study(study_file, first)
        if registered.study is None:
            return registered.problems
        then = ReportOptions.settled({}, registered.study.report_options())
        differ = [f"--{key.replace('_', '-')} {_verdict_setting(key, getattr(applied, key))!r} (registered: "
                  f"{_verdict_setting(key, getattr(then, key))!r})" for key in VERDICT_OPTIONS
                  if _verdict_setting(key, getattr(applied, key)) != _verdict_setting(key, getattr(then, key))]
        out = Path(registered.study.out or STUDY_DEFAULTS["out"]).resolve()
        elsewhere = [f for f in folders if _output_root(f) != out]
        return [*registered.problems,
                *([f"the report decides with {', '.join(differ)}"] if differ else []),
                *([f"it reads records from {', '.join(elsewhere)} besides the registered out: folder "
                   f"{registered.study.out}"] if elsewhere else []),
                *_run_problems(study_file, out), *_state_problems(registered.study, out)]

    return check


def _state_problems(study, out: Path) -> list[str]:
    """Why OUT/until_decided.json is not the registered stopping rule's: the report replays its looks with the file's
    own schedule and seed order, so they must be the study's `until_decided:` (and exist exactly where it has one)."""
    from suite.grid.overrides import DEFAULT_SEEDS
    from suite.grid.until_decided import seed_sequence, study_schedule
    from suite.run.layout import OutputFolder, UntilDecidedFile, read_state

    path, declared = OutputFolder(out).until_decided, study.until_decided is not None
    if not path.is_file():
        if declared and _every_run_until_decided(OutputFolder(out).commands):
            return [f"the study registers a stopping rule (until_decided:) and its runs were made under it (`run "
                    f"--until-decided`), but {path} does not exist: no look has been taken yet (the first comes when "
                    f"every primary comparison has its first {study_schedule(study.until_decided, study.source).start} "
                    "seeds), or the file was removed; either way no verdict here is a registered sequential one"]
        return [f"the study registers a stopping rule (until_decided:) but {path} does not exist: its runs were not "
                "made under it (`run --until-decided`), so their verdicts are not the registered sequential ones"
                ] if declared else []
    if not declared:
        return [f"{path} holds looks under a stopping rule (`run --until-decided`) the study file does not register "
                "(it has no until_decided: section)"]
    try:
        state = read_state(path, UntilDecidedFile)
    except BadInput as exc:
        return [str(exc)]
    schedule = study_schedule(study.until_decided, study.source)
    if dataclasses.asdict(schedule) != state.schedule.model_dump():
        return [f"{path} looked under the schedule {state.schedule.model_dump()}, not the registered "
                f"{dataclasses.asdict(schedule)}"]
    order = seed_sequence(list(study.seeds or DEFAULT_SEEDS), schedule.cap)
    if state.seed_order != order:
        return [f"{path} added seeds in the order {state.seed_order}, not the registered {order}"]
    return []


def _every_run_until_decided(commands: Path) -> bool:
    """Whether OUT/commands.txt names `run` commands and every one of them has --until-decided."""
    try:
        runs = [_run_args(line) for line in commands.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError):
        return False
    return bool(runs) and all(args is not None and args["until_decided"] for args in runs)


def _run_args(line: str) -> dict | None:
    """A commands.txt line's `run` arguments as the parser reads them (less --stop-by); None where it has no `run`
    or this version's parser refuses it."""
    import shlex

    from suite.commands import build_parser

    try:
        words = shlex.split(line)
        argv = _without_deadline(words[words.index("run"):])
        return vars(build_parser(argv).parse_args(argv))
    except (ValueError, SystemExit):
        return None


# what a `run` of a registered study may say besides --study: where and how its runs go, what they leave besides
# records, and how it proceeds (--stop-by, --until-decided); anything else shapes jobs (seeds, methods, settings),
# replaces records (--force) or decides looks with other statistics (--replay)
RUN_FLAGS_ALLOWED = frozenset({"command", "study", "data_dir", "out", "device", "executor", "workers",
                               "max_run_minutes", "address", "gpus_per_run", "cpus_per_run", "save_model",
                               "predict_test", "report_to", "analyses", "until_decided", "stop_by", "quiet",
                               "dry_run"})


def _run_problems(study_file: str, out: Path) -> list[str]:
    """The `run` lines of OUT/commands.txt that are not `run --study STUDY_FILE` with RUN_FLAGS_ALLOWED only."""
    from suite.run.layout import OutputFolder

    path = OutputFolder(out).commands
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{path} cannot be read ({exc}), so the runs' commands cannot be shown to be the study's"]
    if not lines:
        return [f"{path} names no command, so the runs' commands cannot be shown to be the study's"]
    wrong = []
    for line in lines:
        args = _run_args(line)
        if args is None:
            wrong.append(line)
            continue
        given = [k for k, v in args.items() if k not in RUN_FLAGS_ALLOWED and v not in (None, False, [])]
        same = args["study"] and Path(args["study"]).resolve() == Path(study_file).resolve()
        if given or not same or (args["out"] and Path(args["out"]).resolve() != out):
            wrong.append(line)
    return [f"{len(wrong)} run command(s) in {path} are not `run --study {study_file}` with place, executor, "
            f"output and progress flags only (they can shape other jobs, replace records or decide looks "
            f"otherwise), e.g. {wrong[0]}"] if wrong else []


def _without_deadline(argv: list[str]) -> list[str]:
    """`argv` less its --stop-by value: a deadline decides no job, and one given as a date no longer parses once
    it has passed."""
    out, value_next = [], False
    for word in argv:
        if not value_next and word != "--stop-by" and not word.startswith("--stop-by="):
            out.append(word)
        value_next = word == "--stop-by" and not value_next
    return out


# the report options that decide verdicts, and which records enter (collapse_floor sets a descriptive rate, the
# rest what is written where)
VERDICT_OPTIONS = ("baseline", "alpha", "correction", "primary", "margin", "reference_tasks", "allow_uncommitted")


def _output_root(folder: str) -> Path:
    """An output folder as the report reads it: OUT, also where it is given as OUT/runs."""
    from suite.run.layout import RUNS

    path = Path(folder).resolve()
    return path.parent if path.name == RUNS and not (path / RUNS).is_dir() else path


def _verdict_setting(key: str, value):
    """An option's value in the form that decides: names canonical and unordered, the default margin spelt out."""
    from suite.api.attention import METHODS
    from suite.stats.evidence import DEFAULT_MARGIN

    if key == "baseline":
        return METHODS.canonical(value)
    if key in ("primary", "reference_tasks"):
        return tuple(sorted(str(v).strip().lower() for v in value))
    if key == "margin":
        return DEFAULT_MARGIN if value is None else dict(value) if isinstance(value, Mapping) else float(value)
    return value


def planned_jobs(command: str) -> list[RunConfig]:
    """Every job a `run` command line of commands.txt plans, planned again with all its settings; a tuned study's
    final jobs at the configurations its tuning records select; under --until-decided only the first look's seeds
    (later ones run only while a comparison is undecided). Raises what planning raises (SystemExit from a line the
    parser refuses)."""
    import shlex

    from suite.commands import build_parser
    from suite.commands.run_options import run_overrides
    from suite.grid.stages import plan_stages
    from suite.grid.study import Study, load_study
    from suite.grid.tuning import selected_where_known

    words = shlex.split(command)
    argv = words[words.index("run"):]
    args = build_parser(argv).parse_args(argv)
    if args.dry_run or getattr(args, "replay", False):
        return []
    stages = plan_stages(load_study(args.study) if args.study else Study(), run_overrides(args))
    jobs, schedule = stages.plan.jobs, stages.request.schedule
    if stages.tuning is not None:
        jobs = selected_where_known(jobs, stages.tuning)
    seeds = sorted({j.seed for j in jobs})
    if schedule is not None:
        seeds = seeds[:schedule.looks[0]]
    return [j for j in jobs if j.seed in seeds]


def main(args: argparse.Namespace) -> int:
    run_dirs, options = [args.dir], None
    try:
        run_dirs, options = report_request(args)
        path = build_report(run_dirs, options)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # the report's folder cannot be written (permissions, a full disk)
        where = exc.filename or (options and options.out) or run_dirs[0]
        print(f"error: cannot write the report: {exc.strerror or exc} ({where})", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(path)
    return 0
