"""The report as a document: `build_report` loads the records, computes the facts once, has each section return its
part in order, and writes the markdown, the tables beside it (CSV and LaTeX, comparisons.csv) and the figures.

The tables are exported as CSV (pandas) and LaTeX (tabulate, cells escaped here), and every comparison with its
statistics as numbers (comparisons.csv).
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import pandas as pd
from tabulate import tabulate

from suite.api.errors import ReportError
from suite.report import (
    analysis_sections,
    coverage,
    details,
    figure_sections,
    forms,
    header,
    leaderboard,
    stage_sections,
    tuning_budget,
)
from suite.report.facts import ModelFacts, Options, ReportFacts, report_facts
from suite.report.load import Col, load, tuning_started
from suite.report.markdown import wrap_prose
from suite.report.preregistration import check_preregistration
from suite.report.selection import fold_selected
from suite.report.vocabulary import Part, Table
from suite.stats.families import CORRECTIONS
from suite.stats.report_options import DEFAULT_COSTS, REPORT_FIELDS, ReportOptions, checked_per_task

__all__ = ["build_report"]

# stale figures with these prefixes (of tasks or methods no longer in the records) are removed
FIGURE_PREFIXES = ("curves_", "loss_", "seeds_", "attention_", "drop_rate_", "analysis_", "evp_")
# the exported tables: a section's table kind -> the files' stem
EXPORTS = {"leaderboard": "leaderboard", "differences": "leaderboard_differences",
           "comparisons": "leaderboard_comparisons", "stability": "leaderboard_stability",
           tuning_budget.KIND: "tuning_expected_performance"}
LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                 "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                 "±": r"$\pm$", "×": r"$\times$", "–": "--", "°": r"$^\circ$", "†": r"$^\dagger$",
                 "Δ": r"$\Delta$", "‡": r"$^\ddagger$", "ˢ": r"$^{s}$", "ε": r"$\varepsilon$", "·": r"$\cdot$",
                 "≥": r"$\geq$", "≤": r"$\leq$", "→": r"$\rightarrow$", "α": r"$\alpha$"}

ModelSection = Callable[[ModelFacts, Options], Part]
ReportSection = Callable[[ReportFacts, Options], Part]
# each model's sections, in order (the reference's in-run step times only when the model ran the reference)
MODEL_SECTIONS: tuple[ModelSection, ...] = (
    leaderboard.section, leaderboard.reference_tasks, leaderboard.in_run_costs, coverage.compute_per_cell,
    details.setup, details.per_task, details.ablations, figure_sections.data_efficiency, figure_sections.stability,
    figure_sections.overfitting, figure_sections.attention, analysis_sections.section)
# the report-wide sections after the models', in order: failed and skipped runs, then the stages beside the records
# (the tuning stage's selections and expected validation performance, the looks of run --until-decided)
CLOSING_SECTIONS: tuple[ReportSection, ...] = (
    details.failures, details.skipped_records, stage_sections.tuning, tuning_budget.section,
    stage_sections.sequential)


@dataclasses.dataclass(frozen=True)
class Document:
    """The written report: its markdown, the figures it links, and its tables by (model, kind)."""
    text: str
    figures: tuple[Path, ...]
    tables: Mapping[tuple[str, str], Table]


def document(report: ReportFacts, options: Options) -> Document:
    """Every section's part, in order."""
    whole, tables = Part(), {}
    whole.extend(header.section(report, options))
    for model, facts in report.models.items():
        whole.add(f"## Model `{model}`", "")
        notes = forms.form_notes(facts.records)  # which form of a method ran, under each table that shows it
        for section in MODEL_SECTIONS:
            part = forms.footnoted(section(facts, options), notes)
            whole.extend(part)
            tables.update({(model, kind): table for kind, table in part.tables.items()})
    for closing in CLOSING_SECTIONS:
        part = closing(report, options)
        whole.extend(part)
        tables.update(part.tables)   # a report-wide section's tables are keyed (model, kind)
    text = "\n".join(whole.lines).rstrip("\n") + "\n"
    return Document(re.sub(r"\n{3,}", "\n\n", text), tuple(whole.figures), MappingProxyType(tables))


def _plain(text: str) -> str:
    """A markdown cell as plain text: bold and italics markers removed, escaped pipes restored."""
    return re.sub(r"\*\*(.+?)\*\*", r"\1", re.sub(r"^\*(.+)\*$", r"\1", str(text))).replace("\\|", "|")


def _latex(text: str) -> str:
    """A markdown cell as LaTeX: special characters escaped, bold as \\textbf."""
    parts = re.split(r"\*\*(.+?)\*\*", re.sub(r"^\*(.+)\*$", r"\1", str(text)))
    escaped = ["".join(LATEX_SPECIAL.get(ch, ch) for ch in p) for p in parts]
    return "".join(f"\\textbf{{{p}}}" if i % 2 else p for i, p in enumerate(escaped))


def _frame(tables: Mapping[tuple[str, str], Table], kind: str) -> pd.DataFrame | None:
    parts = []
    for (model, k), t in sorted(tables.items()):
        if k == kind:
            parts.append(pd.DataFrame([[model, *map(_plain, r)] for r in t.rows], columns=["model", *t.headers]))
    return pd.concat(parts, ignore_index=True) if parts else None


def _latex_tables(tables: Mapping[tuple[str, str], Table], kind: str) -> str:
    blocks = []
    for (model, k), t in sorted(tables.items()):
        if k == kind:
            body = tabulate([[_latex(c) for c in r] for r in t.rows], headers=[_latex(h) for h in t.headers],
                            tablefmt="latex_raw", disable_numparse=True)
            blocks.append(f"% model: {model}\n{body}")
    return "\n\n".join(blocks) + "\n"


def write_exports(out: Path, tables: Mapping[tuple[str, str], Table], comparisons: Mapping) -> list[Path]:
    """Write every table kind present as CSV and LaTeX, and comparisons.csv (`comparisons`: model -> its
    comparisons); returns the files written."""
    written = []
    for kind, stem in EXPORTS.items():
        df = _frame(tables, kind)
        if df is None:
            continue
        df.to_csv(out / f"{stem}.csv", index=False, lineterminator="\n")
        (out / f"{stem}.tex").write_text(_latex_tables(tables, kind))
        written += [out / f"{stem}.csv", out / f"{stem}.tex"]
    rows = [{"model": model, **dataclasses.asdict(c)} for model, comps in sorted(comparisons.items())
            for _, c in sorted(comps.items()) if c.n or c.n_paired]  # a cell one of the two never ran: nothing to say
    if rows:
        pd.DataFrame(rows).to_csv(out / "comparisons.csv", index=False, lineterminator="\n", float_format="%.6g")
        written.append(out / "comparisons.csv")
    return written


def _remove_stale_figures(figure_dir: Path, produced: set[str]) -> None:
    """Figures of a task or method no longer in the records would otherwise linger next to the new ones."""
    if figure_dir.is_dir():
        for stale in sorted([*figure_dir.glob("*.png"), *figure_dir.glob("*.pdf")]):
            if stale.name.startswith(FIGURE_PREFIXES) and stale.with_suffix(".png").name not in produced:
                stale.unlink()


def build_report(run_dirs: Sequence[str | os.PathLike], options: ReportOptions = ReportOptions()) -> Path:
    """Read the records under each run folder and write `out/leaderboard.md` (with CSV and LaTeX tables beside it)
    and `out/figures/*.png|pdf`, as `options` ask (`suite.stats.report_options.ReportOptions`, where each option is
    declared with its help).

    `options.out` defaults to the first folder; `options.costs` to `out/bench.json`, else the first folder's, when
    that file exists. `reference_tasks` are shown in their own table against their majority class and left out of
    every comparison. `primary` (methods, tasks or METHOD:TASK) are the primary comparisons (Holm; the rest
    Benjamini-Hochberg), `margin` the equivalence margin and `collapse_floor` the points above the constant predictor
    below which a run collapsed (each one number or task -> number). Records from uncommitted code or from several
    commits are refused unless `allow_uncommitted`. `preregistered`: where the analysis was fixed before the results
    (a study's `report: preregistered:`), checked against git: verified only where its fixing commit is older than the
    first record's start (`suite.report.preregistration`); without it the verdicts are labelled a re-analysis.
    `planner` plans a `run` line of commands.txt again (its jobs, with all their settings), for the header's count of
    planned jobs with records (`python -m suite report` gives it; None: no count). Returns the path of the markdown
    file.
    """
    out, baseline, alpha, correction, costs = (options.out, options.baseline, options.alpha, options.correction,
                                               options.costs)
    if not run_dirs:
        raise ReportError("give at least one folder of runs")
    if not 0 < alpha < 1:
        raise ReportError(f"--alpha {alpha} is impossible: it must lie in (0, 1)")
    if correction not in CORRECTIONS:
        raise ReportError(f"--correction {correction!r}: valid corrections are {', '.join(CORRECTIONS)}")
    if costs is not None and not Path(costs).is_file():
        raise ReportError(f"--costs {costs}: no such file (write one with `python -m suite bench --json FILE`)")
    reference_tasks = tuple(_task_names(options.reference_tasks))
    for name in ("margin", "collapse_floor"):  # a study's were checked as it was read; a caller's are here
        value = getattr(options, name)
        try:
            if value is not None:
                checked_per_task(name, value, REPORT_FIELDS[name].metadata["bounds"])
        except ValueError as exc:
            raise ReportError(str(exc)) from None
    loaded = load(run_dirs)
    _check_primary(options.primary, loaded.frame, run_dirs)
    # a tuned study: each cell's selected runs, one row
    loaded = dataclasses.replace(loaded, frame=fold_selected(loaded))
    problem = header.code_version_problem(loaded.frame) if len(loaded.frame) else None
    if problem and not options.allow_uncommitted:
        raise ReportError(f"the records come from {problem}. A published table should come from one committed "
                          "code version: rerun the runs from a clean checkout, or pass --allow-uncommitted "
                          "(study file: report: allow_uncommitted: true) to report them anyway, marked as mixed")
    out_dir = Path(out) if out is not None else Path(run_dirs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    if costs is None:  # the bench file beside the report, else beside the runs it reports
        costs = next((d / DEFAULT_COSTS for d in (out_dir, Path(run_dirs[0])) if (d / DEFAULT_COSTS).is_file()), None)
    options = Options.settled(options, out_dir, str(costs) if costs else None, reference_tasks)
    options = _with_preregistration(options, loaded.frame, run_dirs)
    report = report_facts(loaded, options, stage_sections.verdicts(loaded, alpha, options.margin))
    written = document(report, options)
    path = out_dir / "leaderboard.md"
    path.write_text(wrap_prose(written.text))
    write_exports(out_dir, written.tables, {model: dict(f.comparisons) for model, f in report.models.items()
                                            if baseline in f.sel.methods})
    if options.figures:
        _remove_stale_figures(options.figure_dir, {p.name for p in written.figures})
    return path


def _with_preregistration(options: Options, frame: pd.DataFrame, run_dirs: Sequence[str | os.PathLike]) -> Options:
    """The options with what git says of a declared pre-registration: its verdicts are labelled pre-registered only
    where it was fixed before the first run (a tuning stage's included); a failed check is also warned about on
    stderr."""
    if not options.preregistered:
        return options
    started = pd.DataFrame({Col.STARTED: [*frame.get(Col.STARTED, []), *tuning_started(run_dirs)]})
    checked = check_preregistration(options.preregistered, started, registration=options.registration)
    if not checked.verified:
        print(f"warning: {checked.text()}", file=sys.stderr)
    return dataclasses.replace(options, preregistration=checked)


def _check_primary(primary: Sequence[str], frame: pd.DataFrame, run_dirs: Sequence[str | os.PathLike]) -> None:
    """Every primary entry names a method, a task (or benchmark average) or METHOD:TASK of the records reported: one
    that names nothing left every comparison exploratory, which changed the correction. An entry of registered names
    without records (a study under way) is refused too, saying how to look at the records there are."""
    from suite.api.method_facts import METHODS
    from suite.api.tasks import TASKS
    from suite.report.vocabulary import task_benchmark

    def averaged(tasks: set[str]) -> set[str]:
        return tasks | {f"{task_benchmark(t)} avg" for t in tasks if task_benchmark(t)}

    def names(entry: str, methods: set[str], columns: set[str]) -> bool:
        method, colon, column = entry.partition(":")
        return method in methods and column in columns if colon else entry in methods | columns

    methods, columns = set(frame[Col.METHOD]), averaged(set(frame[Col.TASK]))
    for entry in primary:
        if names(entry, methods, columns):
            continue
        known = names(entry, set(METHODS.names()), averaged(set(TASKS.names())))
        folders = " ".join(map(str, run_dirs))
        raise ReportError(f"--primary {entry!r} names no method, task or METHOD:TASK of the records reported "
                          f"(methods: {', '.join(sorted(methods))}; tasks and averages: "
                          f"{', '.join(sorted(columns))}): "
                          + (f"it has no records yet. A study under way can be looked at without its primary family "
                             f"(every comparison exploratory, nothing declared): `python -m suite report {folders}`, "
                             "without --study or --primary; its report proper once every primary comparison has runs"
                             if known else "fix the name (a study file: report: primary:)"))


def _task_names(names: Sequence[str]) -> list[str]:
    from suite.api.registry import UnknownNameError
    from suite.api.tasks import get_task

    try:
        return [get_task(n).name for n in names]
    except UnknownNameError as exc:
        raise ReportError(f"--reference-tasks: {exc}") from None
