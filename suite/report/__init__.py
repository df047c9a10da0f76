"""`python -m suite report DIR [MORE_RUN_DIRS...]`: run records -> `DIR/leaderboard.md` (with CSV and LaTeX tables
beside it) and `DIR/figures/*.png|pdf`.

Everything here is derived from the records (plus, when given, the dev labels for baselines the records lack and a
bench file for costs), so the same inputs give the same report: rows, columns and legends are sorted, floats have a
fixed format, every bootstrap is seeded (`suite.stats.evidence.bootstrap_seed`), figures carry no software/date
metadata, and the only line that changes between two regenerations is the one starting with `Generated` (set
SOURCE_DATE_EPOCH to pin that too).

How records become cells
  * A cell is one (model, task, method, hyper-parameters, training settings): the headline score of the split each
    `ok` run is scored on (`RunRecord.scored`: its held-out test split when it kept one, else dev; x100) as
    mean ± sample std (n seeds), plus the count of failed runs.
  * The leaderboard uses, per method, its default hyper-parameters (the method's `Config()`); a method run only with
    other settings shows the most-run one and says so. Per (model, task) it uses one set of training settings for
    every method: the one that the most methods ran (then most ok runs, then the latest finished run).
  * Other settings appear in the ablation tables (one per method whose records differ in a hyper-parameter or a
    training field within a task); runs in neither place are listed at the end. Nothing is silently dropped.

The walk of a report: load -> facts -> sections -> document
  load.py            run folders, read once -> `Loaded`: one DataFrame row per valid record (`read_record`; the
                     record's parts typed by suite.run.record_parts, `Setting` for grouping, the run's `outcome`),
                     and the state files a tuning stage and `run --until-decided` leave beside the records; the
                     table's columns, named once (`Col`: read by name everywhere, never by their text)
  state_checks.py    those state files held against the records
  stage_sections.py  the sections on them (tuning, the looks of run --until-decided) and the looks' verdicts
  selection.py       which records each table uses; a tuned study's selected runs folded into one cell
  facts.py           the options, and what the report knows of each model, computed once: cells, averages,
                     baselines, collapse floors, costs, comparisons (`ReportFacts`, `ModelFacts`)
  comparisons.py     every comparison with the reference and its verdict (the statistics are `suite.stats`')
  costs.py           cost columns from `python -m suite bench --json`
  header.py, leaderboard.py, differences.py, details.py, figure_sections.py, analysis_sections.py
                     the sections: each a function of (facts, options) that returns its part (lines, figures,
                     tables); a wide table is shown compact, its other columns in a table below it
                     (`Table.columns`), and exported whole
  figures.py         matplotlib figures (PNG and PDF)
  vocabulary.py      fixed text formats, a section's `Part`, and what the method and task registries say
  markdown.py        the markdown's prose wrapped at 120 columns (tables and code as they are)
  document.py        the sections in order, the markdown, the CSV/LaTeX exports, `build_report` (the command line
                     is `suite.commands.report`)
"""
from __future__ import annotations

from suite.api.errors import ReportError
from suite.report.document import build_report
from suite.report.load import load
from suite.report.vocabulary import slug
from suite.stats.report_options import ReportOptions

__all__ = ["ReportError", "ReportOptions", "build_report", "load", "slug"]
