"""What the report knows about one model, computed once before any section is written.

`model_facts` selects the records (leaderboard and reference tasks), computes the cells, the benchmark averages, the
baselines and every comparison with the reference method, and the hashes of the records some table shows. The result
is frozen: each section of the report is a function of these facts and the report's options, and no section depends
on another having run before it.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Mapping

import pandas as pd

from suite.report.above_constant import VsConstant, vs_constant
from suite.report.baseline_scores import Baseline, task_baselines
from suite.report.cells import Average, Cell, averages
from suite.report.comparisons import Comparison, compare_model
from suite.report.data_efficiency import curve_runs, size_curves
from suite.report.selection import Selection, varying_keys


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    model: str
    sel: Selection
    records: pd.DataFrame                         # every record of the model
    board: pd.DataFrame                           # the records the leaderboard uses
    cells: Mapping[tuple[str, str], Cell]         # (method, task) -> the leaderboard cell
    averages: tuple[Average, ...]                 # benchmark averages of the leaderboard
    baselines: Mapping[str, Baseline]             # leaderboard task -> majority / constant / chance
    comparisons: Mapping[tuple[str, str], Comparison]  # (method, task or average) -> vs the reference; {} without it
    reference_board: pd.DataFrame                 # the records of the reference tasks (none: empty)
    reference_baselines: Mapping[str, Baseline]
    shown: frozenset[str]                         # hashes of the records a table shows (leaderboard, references,
                                                  # ablations, curves); the rest is listed as outside the leaderboard
    ablation: pd.DataFrame                        # the records the ablation tables draw from: all but the curves'
    curves: Mapping[str, pd.DataFrame]            # task -> its data-efficiency curve's ok records (none: empty)
    above: Mapping[tuple[str, str], VsConstant]   # (method, leaderboard or reference task) -> vs the constant
                                                  # predictor (absent: no finished run or no baseline)


def model_facts(records: pd.DataFrame, sel: Selection, options, baseline_cache: dict,
                sequential: Mapping = MappingProxyType({})) -> ModelFacts:
    """The facts of one model's records under the report's `options` (reference method, alpha, correction, ASO,
    data folder for baselines); `baseline_cache` only avoids reading a dev set twice; `sequential`: the verdicts of
    a study run with --until-decided (`suite.report.sequential_section.verdicts`), which the comparisons report."""
    board = sel.board(records)
    cells = {(m, t): Cell.of(board[(board["method"] == m) & (board["task"] == t)])
             for m in sel.methods for t in sel.tasks}
    avgs = tuple(averages(sel, cells))
    bases = task_baselines(board, sel.tasks, sel.train_by_task, options.data_dir, baseline_cache)
    comps = (compare_model(options, sel, board, cells, list(avgs), bases, sequential)
             if options.baseline in sel.methods else {})
    reference_board = sel.board(records, sel.reference_tasks) if sel.reference_tasks else board.iloc[:0]
    reference_bases = (task_baselines(reference_board, sel.reference_tasks, sel.train_by_task, options.data_dir,
                                      baseline_cache) if sel.reference_tasks else {})
    above = {}
    for tasks, runs, task_bases in ((sel.tasks, board, bases), (sel.reference_tasks, reference_board, reference_bases)):
        for m in sel.methods:
            for t in tasks:
                found = vs_constant(t, runs[(runs["method"] == m) & (runs["task"] == t)], task_bases[t], options.alpha)
                if found is not None:
                    above[m, t] = found
    curves = size_curves(sel, records)
    in_curves = curve_runs(sel, records, curves)
    ablation = records.drop(index=in_curves)   # a data-efficiency curve's runs are shown by it, not as an ablation
    ablated = [ablation.loc[ablation["method"] == m, "hash"] for m in sel.methods
               if varying_keys(ablation[ablation["method"] == m])]
    shown = frozenset(board["hash"]) | frozenset(reference_board["hash"]) | frozenset(
        h for hashes in ablated for h in hashes) | frozenset(records.loc[in_curves, "hash"])
    return ModelFacts(sel.model, sel, records, board, MappingProxyType(cells), avgs, MappingProxyType(bases),
                      MappingProxyType(comps), reference_board, MappingProxyType(reference_bases), shown, ablation,
                      MappingProxyType(curves), MappingProxyType(above))
