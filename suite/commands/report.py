"""`python -m suite report DIR [MORE_RUN_DIRS...]`: the command line of `suite.report.build_report`."""
from __future__ import annotations

import argparse
import os
import sys

from suite.api.errors import EXIT_BAD_INPUT, BadInput, ReportError
from suite.report import DEFAULT_ALPHA, DEFAULT_BASELINE, DEFAULT_CORRECTION, DEFAULT_COSTS, build_report
from suite.run.data import DATA_DIR_ENV
from suite.stats.families import CORRECTIONS

# the command, and what the rest of the suite uses
__all__ = ["COMMAND", "add_parser", "main", "planned_cells", "study_arguments"]

COMMAND = "report"


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, help="leaderboard markdown, tables and figures from run records",
                       description="Reads DIR/runs/*.json (and the run folders after it) and writes "
                                   "DIR/leaderboard.md, its tables as CSV and LaTeX, and DIR/figures/.")
    p.add_argument("dir", nargs="?", help="output folder of `python -m suite run` (holds runs/)")
    p.add_argument("more", nargs="*", help="more run folders whose records join the report")
    p.add_argument("--study", help="a study file: its out: folder and report: options fill what is not given here")
    p.add_argument("--baseline", help=f"reference method (default {DEFAULT_BASELINE})")
    p.add_argument("--alpha", type=_bounded(0, 1, "a level in (0, 1)"),
                   help=f"significance level after the correction (default {DEFAULT_ALPHA})")
    p.add_argument("--correction", choices=sorted(CORRECTIONS), default=DEFAULT_CORRECTION,
                   help="multiple-comparison correction across each model's table: holm (Holm-Bonferroni, "
                        "family-wise error; default) or bh (Benjamini-Hochberg, false discovery rate)")
    p.add_argument("--no-aso", dest="aso", action="store_false",
                   help="skip almost stochastic order (its bootstrap is the slowest statistic)")
    p.add_argument("--data-dir", default=os.environ.get(DATA_DIR_ENV),
                   help=f"GLUE-format data folder (default ${DATA_DIR_ENV}): dev labels for the baseline rows of "
                        "records that do not carry them")
    p.add_argument("--costs", help=f"`python -m suite bench --json` file for the cost columns "
                                   f"(default: OUT/{DEFAULT_COSTS}, else DIR/{DEFAULT_COSTS}, when it exists)")
    p.add_argument("--reference-tasks", type=lambda v: [t for t in v.split(",") if t],
                   help="comma list of tasks shown in their own table against their majority class and left out "
                        "of the comparisons and averages (e.g. tasks the model does not learn)")
    p.add_argument("--primary", type=lambda v: [t for t in v.split(",") if t],
                   help="comma list of the primary comparisons: methods, tasks or METHOD:TASK; their family-wise "
                        "error is held by Holm, every other comparison is exploratory (Benjamini-Hochberg); "
                        "default: one family under --correction")
    p.add_argument("--margin", type=_bounded(0, None, "a number > 0"),
                   help="equivalence margin in points of the task's score x100 (default 1; per task in the study "
                        "file's report: margin:)")
    p.add_argument("--collapse-floor", type=_bounded(None, None, "a number >= 0", floor=0),
                   help="a run not this many points (x100) above its task's majority-class score counts as "
                        "collapsed (default 1)")
    p.add_argument("--allow-uncommitted", action="store_true",
                   help="report records from uncommitted code or from several commits (refused by default: a "
                        "published table comes from one code version); the header marks the mix")
    p.add_argument("--no-figures", dest="figures", action="store_false",
                   help="tables only: much faster; existing figures are left as they are")
    p.add_argument("--out", help="write the report here instead of DIR")


def _bounded(low: float | None, high: float | None, what: str, floor: float | None = None):
    """An argparse type: a finite number above `low` (or at least `floor`) and below `high`; else a usage error."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (low is None or value > low) and (high is None or value < high) \
            and (floor is None or value >= floor)
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value
    return parse


def study_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """`report --study FILE`: the study's output folder and report: section fill what the command line left unset."""
    from suite.grid.study import load_study

    study = load_study(args.study)
    args.dir = args.dir or study.out
    if not args.dir:
        raise BadInput(f"{args.study}: no out: folder to report on; give it in the file or as DIR")
    for key, value in study.report_options().items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if study.report.allow_uncommitted:
        args.allow_uncommitted = True
    args.preregistered = study.report.preregistered
    return args


def resolve_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """A study file's options where the command line left them unset, then the defaults."""
    from suite.api.attention import METHODS
    from suite.run.layout import check_folder_name

    if getattr(args, "study", None):
        study_arguments(args)
    if not args.dir:
        raise ReportError("give the output folder DIR of `python -m suite run`, or --study FILE")
    args.baseline = METHODS.canonical(args.baseline or DEFAULT_BASELINE)   # unknown: an error with a suggestion
    args.alpha = DEFAULT_ALPHA if args.alpha is None else args.alpha
    if args.out:
        check_folder_name("--out", args.out)
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ReportError(f"--out {args.out} is a file: the report is a folder (leaderboard.md, tables, figures/); "
                          "give a folder")
    return args


def planned_cells(command: str) -> set[tuple[str, str, str, int]]:
    """(model, task, method, seed) of every job a `run` command line of commands.txt plans, planned again; under
    --until-decided only the first look's seeds (later ones run only while a comparison is undecided). Raises what
    planning raises (SystemExit from a line the parser refuses)."""
    import shlex

    from suite.commands import build_parser
    from suite.commands.run_options import run_overrides
    from suite.grid.stages import plan_stages
    from suite.grid.study import Study, load_study

    words = shlex.split(command)
    argv = words[words.index("run"):]
    args = build_parser(argv).parse_args(argv)
    if args.dry_run or getattr(args, "replay", False):
        return set()
    stages = plan_stages(load_study(args.study) if args.study else Study(), run_overrides(args))
    jobs, schedule = stages.plan.jobs, stages.request.schedule
    seeds = sorted({j.seed for j in jobs})
    if schedule is not None:
        seeds = seeds[:schedule.looks[0]]
    return {(j.model, j.task, j.method, j.seed) for j in jobs if j.seed in seeds}


def main(args: argparse.Namespace) -> int:
    try:
        args = resolve_arguments(args)
        path = build_report([args.dir, *args.more], args.out, args.baseline, args.alpha, args.correction,
                            args.aso, args.data_dir, args.costs, args.figures, args.reference_tasks or (),
                            args.primary or (), args.margin, args.collapse_floor, args.allow_uncommitted,
                            preregistered=getattr(args, "preregistered", None), planner=planned_cells)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # the report's folder cannot be written (permissions, a full disk)
        print(f"error: cannot write the report: {exc.strerror or exc} ({exc.filename or args.out or args.dir})",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    print(path)
    return 0
