"""`python -m suite report DIR [MORE_RUN_DIRS...]`: the command line and `build_report`, its Python API."""
from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Sequence

from suite.api.errors import EXIT_BAD_INPUT, ReportError
from suite.run.data import DATA_DIR_ENV
from suite.report.document import Options, Report
from suite.report.exports import write_exports
from suite.report.load import load
from suite.report.significance import CORRECTIONS

COMMAND = "report"
DEFAULT_BASELINE = "vanilla"
DEFAULT_ALPHA = 0.05
DEFAULT_COSTS = "bench.json"
# stale figures with these prefixes (of tasks or methods no longer in the records) are removed
FIGURE_PREFIXES = ("curves_", "loss_", "seeds_", "attention_", "drop_rate_", "analysis_")


def date_line() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch and epoch.isdigit()
            else dt.datetime.now(dt.timezone.utc))
    return f"Generated {when:%Y-%m-%d %H:%M} UTC by `python -m suite report`."


def remove_stale_figures(report: Report) -> None:
    """Figures of a task or method no longer in the records would otherwise linger next to the new ones."""
    produced = {p.name for p in report.figures}
    if report.fig_dir.is_dir():
        for stale in sorted([*report.fig_dir.glob("*.png"), *report.fig_dir.glob("*.pdf")]):
            if stale.name.startswith(FIGURE_PREFIXES) and stale.with_suffix(".png").name not in produced:
                stale.unlink()


def build_report(run_dirs: Sequence[str | os.PathLike], out: str | os.PathLike | None = None,
                 baseline: str = DEFAULT_BASELINE, alpha: float = DEFAULT_ALPHA, correction: str = "holm",
                 aso: bool = True, data_dir: str | os.PathLike | None = None,
                 costs: str | os.PathLike | None = None, figures: bool = True,
                 reference_tasks: Sequence[str] = ()) -> Path:
    """Read the records under each run folder and write `out/leaderboard.md` (with CSV and LaTeX tables beside it)
    and `out/figures/*.png|pdf`.

    `out` defaults to the first folder; `costs` to `out/bench.json`, else the first folder's, when that file exists.
    `reference_tasks` are shown in their own table against their majority class and left out of every comparison.
    Returns the path of the markdown file.
    """
    if not run_dirs:
        raise ReportError("give at least one folder of runs")
    if not 0 < alpha < 1:
        raise ReportError(f"--alpha {alpha} is impossible: it must lie in (0, 1)")
    if correction not in CORRECTIONS:
        raise ReportError(f"--correction {correction!r}: valid corrections are {', '.join(CORRECTIONS)}")
    if costs is not None and not Path(costs).is_file():
        raise ReportError(f"--costs {costs}: no such file (write one with `python -m suite bench --json FILE`)")
    reference_tasks = tuple(_task_names(reference_tasks))
    loaded = load(run_dirs)
    out_dir = Path(out) if out is not None else Path(run_dirs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    if costs is None:  # the bench file beside the report, else beside the runs it reports
        costs = next((d / DEFAULT_COSTS for d in (out_dir, Path(run_dirs[0])) if (d / DEFAULT_COSTS).is_file()), None)
    options = Options(baseline, alpha, correction, aso, str(data_dir) if data_dir else None,
                      str(costs) if costs else None, figures, reference_tasks)
    report = Report(loaded, out_dir, options, date_line())
    path = out_dir / "leaderboard.md"
    path.write_text(report.build())
    write_exports(out_dir, report.tables, report.comparisons)
    if figures:
        remove_stale_figures(report)
    return path


def _task_names(names: Sequence[str]) -> list[str]:
    from suite.api.tasks import get_task
    from suite.api.registry import UnknownNameError

    try:
        return [get_task(n).name for n in names]
    except UnknownNameError as exc:
        raise ReportError(f"--reference-tasks: {exc}") from None


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, help="leaderboard markdown, tables and figures from run records",
                       description="Reads DIR/runs/*.json (and the run folders after it) and writes "
                                   "DIR/leaderboard.md, its tables as CSV and LaTeX, and DIR/figures/.")
    p.add_argument("dir", nargs="?", help="output folder of `python -m suite run` (holds runs/)")
    p.add_argument("more", nargs="*", help="more run folders whose records join the report")
    p.add_argument("--study", help="a study file: its out: folder and report: options fill what is not given here")
    p.add_argument("--baseline", help=f"reference method (default {DEFAULT_BASELINE})")
    p.add_argument("--alpha", type=float, help=f"significance level after the correction (default {DEFAULT_ALPHA})")
    p.add_argument("--correction", choices=sorted(CORRECTIONS), default="holm",
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
    p.add_argument("--no-figures", dest="figures", action="store_false",
                   help="tables only: much faster; existing figures are left as they are")
    p.add_argument("--out", help="write the report here instead of DIR")


def resolve_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """A study file's options where the command line left them unset, then the defaults."""
    from suite.api.attention import METHODS

    if getattr(args, "study", None):
        from suite.grid.study import report_arguments

        report_arguments(args)
    if not args.dir:
        raise ReportError("give the output folder DIR of `python -m suite run`, or --study FILE")
    args.baseline = METHODS.canonical(args.baseline or DEFAULT_BASELINE)   # unknown: an error with a suggestion
    args.alpha = DEFAULT_ALPHA if args.alpha is None else args.alpha
    return args


def main(args: argparse.Namespace) -> int:
    try:
        args = resolve_arguments(args)
        path = build_report([args.dir, *args.more], args.out, args.baseline, args.alpha, args.correction,
                            args.aso, args.data_dir, args.costs, args.figures, args.reference_tasks or ())
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(path)
    return 0
