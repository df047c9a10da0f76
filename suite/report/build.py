"""`build_report`: the report's Python API (its command line is `suite.commands.report`)."""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Mapping, Sequence

from suite.api.errors import ReportError
from suite.report import sequential_section, tuning_section
from suite.report.document import Options, Report
from suite.report.exports import write_exports
from suite.report.header import code_version_problem
from suite.report.load import load
from suite.report.significance import CORRECTIONS
from suite.report.tuned import fold_selected

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
                 reference_tasks: Sequence[str] = (), primary: Sequence[str] = (),
                 margin: float | Mapping[str, float] | None = None,
                 collapse_floor: float | Mapping[str, float] | None = None,
                 allow_uncommitted: bool = False) -> Path:
    """Read the records under each run folder and write `out/leaderboard.md` (with CSV and LaTeX tables beside it)
    and `out/figures/*.png|pdf`.

    `out` defaults to the first folder; `costs` to `out/bench.json`, else the first folder's, when that file exists.
    `reference_tasks` are shown in their own table against their majority class and left out of every comparison.
    `primary` (methods, tasks or METHOD:TASK) are the primary comparisons (Holm; the rest Benjamini-Hochberg),
    `margin` the equivalence margin and `collapse_floor` the points above the constant predictor below which a run
    collapsed (each one number or task -> number). Records from uncommitted code or from several commits are refused
    unless `allow_uncommitted`. Returns the path of the markdown file.
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
    loaded.frame = fold_selected(loaded.frame, run_dirs)  # a tuned study: each cell's selected runs, one row
    problem = code_version_problem(loaded.frame) if len(loaded.frame) else None
    if problem and not allow_uncommitted:
        raise ReportError(f"the records come from {problem}. A published table should come from one committed "
                          "code version: rerun the runs from a clean checkout, or pass --allow-uncommitted "
                          "(study file: report: allow_uncommitted: true) to report them anyway, marked as mixed")
    out_dir = Path(out) if out is not None else Path(run_dirs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    if costs is None:  # the bench file beside the report, else beside the runs it reports
        costs = next((d / DEFAULT_COSTS for d in (out_dir, Path(run_dirs[0])) if (d / DEFAULT_COSTS).is_file()), None)
    options = Options(baseline, alpha, correction, aso, str(data_dir) if data_dir else None,
                      str(costs) if costs else None, figures, reference_tasks, tuple(primary), margin,
                      collapse_floor, allow_uncommitted)
    report = Report(loaded, out_dir, options, date_line(), sequential_section.verdicts(run_dirs))
    path = out_dir / "leaderboard.md"
    path.write_text(report.build() + tuning_section.markdown(run_dirs)  # the tuning stage's selection, if any
                    + sequential_section.markdown(run_dirs))  # run --until-decided: looks and stopping reasons
    write_exports(out_dir, report.tables, {model: dict(f.comparisons) for model, f in report.facts.items()
                                           if baseline in f.sel.methods})
    if figures:
        remove_stale_figures(report)
    return path


def _task_names(names: Sequence[str]) -> list[str]:
    from suite.api.registry import UnknownNameError
    from suite.api.tasks import get_task

    try:
        return [get_task(n).name for n in names]
    except UnknownNameError as exc:
        raise ReportError(f"--reference-tasks: {exc}") from None
