"""`python -m suite report DIR [MORE_RUN_DIRS...]`: the command line of `suite.report.build_report`."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

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
    options = ReportOptions.settled(flags, study, planner=planned_jobs, study_file=args.study,
                                    replaced=_replaced(flags, study))
    options = dataclasses.replace(options, baseline=METHODS.canonical(options.baseline))  # unknown: a suggestion
    if options.out is not None:
        check_folder_name("--out", options.out)
    if options.out and os.path.exists(options.out) and not os.path.isdir(options.out):
        raise ReportError(f"--out {options.out} is a file: the report is a folder (leaderboard.md, tables, figures/); "
                          "give a folder")
    return [folder, *args.more], options


def _replaced(flags: dict, study: dict) -> tuple[str, ...]:
    """The verdict settings (suite.report.preregistration.REGISTERED_KEYS) that a flag sets otherwise than the study
    (or its default, where the study is silent): a pre-registered analysis is then not the one applied."""
    from suite.report.preregistration import REGISTERED_KEYS

    def same(a, b) -> bool:
        return (tuple(a) if isinstance(a, (list, tuple)) else a) == (tuple(b) if isinstance(b, (list, tuple)) else b)

    def registered(key: str):
        return study[key] if study.get(key) is not None else REPORT_FIELDS[key].default

    return tuple(f"--{key.replace('_', '-')}" for key in REGISTERED_KEYS
                 if flags.get(key) is not None and not same(flags[key], registered(key)))


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
