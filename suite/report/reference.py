"""Reference tasks: tasks a study runs for context (e.g. ones the model does not learn at its budget), shown against
their majority-class level in their own table and left out of the leaderboard's comparisons and averages."""
from __future__ import annotations

from suite.report.cells import Cell
from suite.report.facts import ModelFacts
from suite.report.formatting import DASH, fmt, table
from suite.report.leaderboard import NEAR_MAJORITY
from suite.report.registry_info import task_display


def section(rep, facts: ModelFacts) -> None:
    sel = facts.sel
    if not sel.reference_tasks:
        return
    board, tasks, bases = facts.reference_board, sel.reference_tasks, facts.reference_baselines
    methods = [m for m in sel.methods if (board["method"] == m).any()]
    rows = []
    for m in methods:
        row = [rep.method_label(m, sel)]
        for t in tasks:
            cell = Cell.of(board[(board["method"] == m) & (board["task"] == t)])
            near = (m, t) in facts.above and not facts.above[m, t].better
            row.append(cell.text(mark=NEAR_MAJORITY if near else ""))
        rows.append(row)
    rows.append(["*majority class / constant mean (baseline)*",
                 *[fmt(bases[t].constant) if bases[t].available else DASH for t in tasks]])
    rep.add("### Reference tasks", "",
            f"Run for context and left out of the comparisons, differences and averages above: "
            f"{', '.join(task_display(t) for t in tasks)}. Cells as in the leaderboard; {NEAR_MAJORITY}: not "
            f"distinguishable from the majority / constant predictor (the leaderboard's one-sided test, p ≥ "
            f"{rep.alpha:g}).", "", table(rows, ["method", *[task_display(t) for t in tasks]]), "")
