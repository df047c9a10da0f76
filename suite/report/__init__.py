"""`python -m suite report DIR [MORE_RUN_DIRS...]`: run records -> `DIR/leaderboard.md` (with CSV and LaTeX tables
beside it) and `DIR/figures/*.png|pdf`.

Everything here is derived from the records (plus, when given, the dev labels for baselines the records lack and a
bench file for costs), so the same inputs give the same report: rows, columns and legends are sorted, floats have a
fixed format, every bootstrap is seeded, figures carry no software/date metadata, and the only line that changes
between two regenerations is the one starting with `Generated` (set SOURCE_DATE_EPOCH to pin that too).

How records become cells
  * A cell is one (model, task, method, hyper-parameters, training settings): the headline score
    (`record["final"]["score"]`, x100) of its `ok` runs as mean ± sample std (n seeds), plus the count of failed runs.
  * The leaderboard uses, per method, its default hyper-parameters (the method's `Config()`); a method run only with
    other settings shows the most-run one and says so. Per (model, task) it uses one set of training settings for
    every method: the one that the most methods ran (then most ok runs, then the latest finished run).
  * Other settings appear in the ablation tables (one per method whose records differ in a hyper-parameter or a
    training field within a task); runs in neither place are listed at the end. Nothing is silently dropped.

Where things are
  load.py            run folders -> one DataFrame row per valid record (`RunRecord.from_dict`)
  registry_info.py   what the method and task registries say (defaults, display names, benchmark, averages)
  selection.py       which records the leaderboard and the ablation tables use
  cells.py           a table cell (per-seed values) and its text
  significance.py    the paired t-test of the data-efficiency table, almost stochastic order, tests against a
                     constant predictor (the comparisons' statistics are `suite.stats`)
  comparisons.py     every comparison with the reference: evidence over seeds and dev examples, families, verdicts
  baseline_scores.py majority / constant-mean / chance scores (from the records, or from the dev labels)
  costs.py           cost columns from `python -m suite bench --json`; in-run times as context
  figures.py         matplotlib figures (PNG and PDF)
  header.py, leaderboard.py, reference.py, details.py, data_efficiency.py, stability.py, figure_sections.py,
  analysis_sections.py
                     the markdown sections
  exports.py         the tables as CSV and LaTeX, comparisons.csv
  document.py        the `Report`: options, output (lines, figures, tables), each model's facts, section order
  facts.py           what the report knows about one model, computed once before any section (ModelFacts)
  build.py           `build_report` (the command line is `suite.commands.report`)
"""
from __future__ import annotations

from suite.api.errors import ReportError
from suite.report.build import DEFAULT_ALPHA, DEFAULT_BASELINE, build_report
from suite.report.formatting import slug
from suite.report.load import Loaded, load

__all__ = ["DEFAULT_ALPHA", "DEFAULT_BASELINE", "Loaded", "ReportError", "build_report", "load", "slug"]
