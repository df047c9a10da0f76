"""What the report knows, computed once before any section is written: the report's options, and per model the
records each table uses, their cells, the benchmark averages, the baselines, the collapse floors, the cost columns,
every comparison with the reference method and the data-efficiency tests.

The facts are frozen: each section of the report is a function of these facts and the options, and no section
depends on another having run before it.

Baselines: scores of predictors that learn nothing (majority class / constant mean, chance), per task of a
leaderboard. New records carry them (`record.baselines`, computed by the runner from the dev labels it evaluated
on). For older records they are computed here from the same dev labels: the task's dev split read from the data
folder (`--data-dir` or $SUITE_DATA_DIR) and subset exactly as the runner subsets it (`max_eval_samples`,
`data_seed`).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np
import pandas as pd

from suite.report.comparisons import Comparison, compare_model, curve_tests, floors
from suite.report.costs import BenchCosts, CostColumns, cost_columns, read_bench
from suite.report.load import Col, Loaded, Setting
from suite.report.preregistration import Preregistration
from suite.report.selection import (
    Selection,
    curve_methods,
    curve_runs,
    leaderboard_selection,
    size_curves,
    varying_keys,
)
from suite.report.vocabulary import (
    DASH,
    FIGURES,
    SCALE,
    fmt,
    higher_is_better,
    is_regression,
    task_benchmark,
    task_in_average,
    task_spec,
    unique,
)
from suite.run.record_parts import RecordedBaseline
from suite.stats import collapse
from suite.stats.constant import VsConstant, vs_constant
from suite.stats.report_options import ReportOptions

__all__ = ["Average", "Baseline", "Cell", "ModelFacts", "Options", "ReportFacts", "report_facts"]

@dataclasses.dataclass(frozen=True)
class Options(ReportOptions):
    """The report's options as its sections read them, settled by `build_report` from the `ReportOptions` it was
    given: `out` the report's folder, `costs` the bench file found (None: none), the reference tasks by their
    registered names."""
    out: Path = dataclasses.field(kw_only=True)  # figures in out/figures
    # what git says about `preregistered` against the records (None: none declared, or not checked)
    preregistration: Preregistration | None = dataclasses.field(default=None, kw_only=True)

    @classmethod
    def settled(cls, asked: ReportOptions, out: Path, costs: str | None, reference_tasks: tuple[str, ...]) -> Options:
        values = {f.name: getattr(asked, f.name) for f in dataclasses.fields(ReportOptions)}
        data_dir = str(asked.data_dir) if asked.data_dir else None
        return cls(**{**values, "out": out, "costs": costs, "reference_tasks": reference_tasks,
                      "primary": tuple(asked.primary), "data_dir": data_dir})

    @property
    def figure_dir(self) -> Path:
        return self.out / FIGURES

    def figure(self, name: str) -> Path:
        """Where the figure `name` goes (its folder made when figures are drawn)."""
        if self.figures:
            self.figure_dir.mkdir(parents=True, exist_ok=True)
        return self.figure_dir / name


@dataclasses.dataclass(frozen=True)
class Cell:
    values: np.ndarray            # finite per-seed values, display scale, sorted
    failed: int = 0               # runs whose status is not ok
    no_score: int = 0             # ok runs without a finite value (e.g. a correlation of constant predictions)
    seeds: np.ndarray | None = None   # the seed of each value (same order), for pairing by seed

    @classmethod
    def of(cls, sub: pd.DataFrame, column: str = Col.SCORE, scale: float = SCALE) -> "Cell":
        ok = sub[sub[Col.STATUS] == "ok"]
        vals = ok[column].astype(float).to_numpy() * scale
        seeds = pd.to_numeric(ok[Col.SEED], errors="coerce").to_numpy(dtype=float) if Col.SEED in ok else None
        finite = np.isfinite(vals)
        order = np.argsort(vals[finite], kind="mergesort")
        return cls(vals[finite][order], int((sub[Col.STATUS] != "ok").sum()), int(len(vals) - finite.sum()),
                   seeds[finite][order] if seeds is not None else None)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.n else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.values, ddof=1)) if self.n > 1 else math.nan

    @property
    def empty(self) -> bool:
        return self.n == 0 and self.failed == 0 and self.no_score == 0

    def by_seed(self) -> dict[float, float]:
        return {} if self.seeds is None else dict(zip(self.seeds.tolist(), self.values.tolist()))

    def text(self, bold: bool = False, with_n: bool = True, mark: str = "", floor: float = math.nan,
             higher: bool = True) -> str:
        """mean ± std (n); where runs both collapsed (not above `floor`) and did not, the median and how many
        collapsed instead: a mean of two modes describes neither."""
        if self.empty:
            return DASH
        parts = []
        if self.n:
            body = f"{fmt(self.mean)} ± {fmt(self.std)}"
            if collapse.bimodal(self.values, floor, higher):
                down, _ = collapse.rate(self.values, floor, higher)
                body = f"median {fmt(float(np.median(self.values)))}, {down} of {self.n} collapsed"
            body = f"**{body}**" if bold else body
            parts.append(body + mark + (f" ({self.n})" if with_n else ""))
        if self.failed:
            parts.append(f"failed ({self.failed})")
        if self.no_score:
            parts.append(f"no score ({self.no_score})")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Average:
    """One benchmark's average column: the tasks it averages and each method's (mean, number of tasks)."""
    benchmark: str
    tasks: list[str]
    left_out: list[str]
    values: dict[str, tuple[float, int]]

    @property
    def header(self) -> str:
        return f"{self.benchmark} avg"

    def full(self, methods) -> list[str]:
        """Methods with results on every averaged task (only their averages are comparable)."""
        return [m for m in methods if self.values[m][1] == len(self.tasks) and self.tasks]


def _averages(sel, cells: dict) -> list[Average]:
    out = []
    for bench in dict.fromkeys(task_benchmark(t) for t in sel.tasks if task_benchmark(t)):
        members = [t for t in sel.tasks if task_benchmark(t) == bench]
        tasks = [t for t in members if task_in_average(t)]
        values = {}
        for m in sel.methods:
            means = [cells[m, t].mean for t in tasks if cells[m, t].n]
            values[m] = (float(np.mean(means)) if means else math.nan, len(means))
        out.append(Average(bench, tasks, [t for t in members if t not in tasks], values))
    return out


@dataclasses.dataclass(frozen=True)
class Baseline:
    """x100 scores of the constant predictor (majority or constant mean) and of chance; NaN when unavailable."""
    constant_kind: str
    constant: float
    chance: float
    source: str            # "records", "data" or the reason none could be computed

    @property
    def available(self) -> bool:
        return math.isfinite(self.constant)


def _from_records(board_task: pd.DataFrame) -> Baseline | None:
    for found in board_task[Col.BASELINE]:
        if isinstance(found, RecordedBaseline):
            return Baseline(found.constant_kind, found.constant * SCALE, found.chance * SCALE, "records")
    return None


def _dev_labels(spec, train: dict[str, Any], data_dir) -> dict[str, np.ndarray]:
    """The dev labels a run with training settings `train` was evaluated on, per eval-split suffix."""
    from suite.run.data import read_local_split, resolve_data_dir, seeded_subset

    local = resolve_data_dir(data_dir)
    if local is None:
        raise FileNotFoundError("no data folder (give --data-dir or set $SUITE_DATA_DIR)")
    out = {}
    for suffix, split in spec.eval_splits.items():
        labels = read_local_split(spec, split, local)["label"]
        keep = seeded_subset(len(labels), train.get("max_eval_samples"), int(train.get("data_seed") or 0))
        out[suffix] = np.asarray([labels[i] for i in keep])
    return out


def _from_data(task: str, train: Setting, data_dir) -> Baseline:
    from suite.run.baselines import baseline_scores

    spec = task_spec(task)
    if spec is None:
        return Baseline("majority", math.nan, math.nan, "unknown task")
    kind = "constant_mean" if spec.is_regression else "majority"
    try:
        scores = baseline_scores(spec, _dev_labels(spec, dict(train.values), data_dir))
    except Exception as exc:  # noqa: BLE001  missing data folder or files: the report says so and goes on
        return Baseline(kind, math.nan, math.nan, f"unavailable: {str(exc).splitlines()[0][:160]}")
    return Baseline(kind, scores[kind]["score"] * SCALE, scores["chance"]["score"] * SCALE, "data")


def _task_baselines(board: pd.DataFrame, tasks: list[str], train_by_task: Mapping[str, Setting], data_dir,
                   cache: dict) -> dict[str, Baseline]:
    """{task: Baseline} for the leaderboard's records of each task (`cache` avoids re-reading the data)."""
    out = {}
    for t in tasks:
        found = _from_records(board[board[Col.TASK] == t])
        if found is None:
            key = (t, train_by_task[t].key, str(data_dir))
            if key not in cache:
                cache[key] = _from_data(t, train_by_task[t], data_dir)
            found = cache[key]
        out[t] = found
    return out


def _vs_constant(task: str, runs: pd.DataFrame, base: Baseline, alpha: float) -> VsConstant | None:
    """`runs`: one cell's records (any status). None without a finished run or a baseline."""
    ok = runs[runs[Col.STATUS] == "ok"]
    if not len(ok) or not base.available:
        return None
    paths = list(ok[Col.PREDICTIONS]) if Col.PREDICTIONS in ok else [None] * len(ok)
    return vs_constant(task, ok[Col.SCORE].astype(float).to_numpy() * SCALE, paths, base.constant, alpha,
                       higher_is_better(task), is_regression(task))


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    model: str
    sel: Selection
    records: pd.DataFrame                         # every record of the model
    board: pd.DataFrame                           # the records the leaderboard uses
    cells: Mapping[tuple[str, str], Cell]         # (method, task) -> the leaderboard cell
    averages: tuple[Average, ...]                 # benchmark averages of the leaderboard
    baselines: Mapping[str, Baseline]             # leaderboard task -> majority / constant / chance
    floors: Mapping[str, float]                   # leaderboard task -> collapse floor (x100; NaN: no baseline)
    comparisons: Mapping[tuple[str, str], Comparison]  # (method, task or average) -> vs the reference; {} without it
    reference_board: pd.DataFrame                 # the records of the reference tasks (none: empty)
    reference_baselines: Mapping[str, Baseline]
    shown: frozenset[str]                         # hashes of the records a table shows (leaderboard, references,
                                                  # ablations, curves); the rest is listed as outside the leaderboard
    ablation: pd.DataFrame                        # the records the ablation tables draw from: all but the curves'
    curves: Mapping[str, pd.DataFrame]            # task -> its data-efficiency curve's ok records (none: empty)
    curve_methods: Mapping[str, list[str]]        # task -> the methods its curve shows
    curve_tests: Mapping[tuple[str, str, int], tuple[float, float]]  # (task, method, size) -> (difference, adj. p)
    above: Mapping[tuple[str, str], VsConstant]   # (method, leaderboard or reference task) -> vs the constant
                                                  # predictor (absent: no finished run or no baseline)
    costs: CostColumns                            # the leaderboard's cost columns

    def label(self, method: str) -> str:
        return self.sel.label(method)


def model_facts(records: pd.DataFrame, sel: Selection, options: Options, bench: BenchCosts | None,
                baseline_cache: dict, sequential: Mapping = MappingProxyType({})) -> ModelFacts:
    """The facts of one model's records under the report's `options`; `baseline_cache` only avoids reading a dev set
    twice; `sequential`: the verdicts of a study run with --until-decided (`suite.report.stage_sections.verdicts`),
    which the comparisons report."""
    board = sel.board(records)
    cells = {(m, t): Cell.of(board[(board[Col.METHOD] == m) & (board[Col.TASK] == t)])
             for m in sel.methods for t in sel.tasks}
    avgs = tuple(_averages(sel, cells))
    bases = _task_baselines(board, sel.tasks, sel.train_by_task, options.data_dir, baseline_cache)
    floor = floors(sel.tasks, bases, options.collapse_floor)
    comps = (compare_model(options, sel, board, cells, list(avgs), floor, sequential)
             if options.baseline in sel.methods else {})
    reference_board = sel.board(records, sel.reference_tasks) if sel.reference_tasks else board.iloc[:0]
    reference_bases = (_task_baselines(reference_board, sel.reference_tasks, sel.train_by_task, options.data_dir,
                                       baseline_cache) if sel.reference_tasks else {})
    above = {}
    for tasks, runs, task_bases in ((sel.tasks, board, bases), (sel.reference_tasks, reference_board, reference_bases)):
        for m in sel.methods:
            for t in tasks:
                found = _vs_constant(t, runs[(runs[Col.METHOD] == m) & (runs[Col.TASK] == t)], task_bases[t],
                                     options.alpha)
                if found is not None:
                    above[m, t] = found
    curves = size_curves(sel, records)
    shown_by_curve = {task: curve_methods(sel, sub) for task, sub in curves.items()}
    tests = curve_tests(curves, shown_by_curve, options.baseline, options.correction) if curves else {}
    in_curves = curve_runs(sel, records, curves)
    ablation = records.drop(index=in_curves)   # a data-efficiency curve's runs are shown by it, not as an ablation
    ablated = [ablation.loc[ablation[Col.METHOD] == m, Col.HASH] for m in sel.methods
               if varying_keys(ablation[ablation[Col.METHOD] == m])]
    shown = frozenset(board[Col.HASH]) | frozenset(reference_board[Col.HASH]) | frozenset(
        h for hashes in ablated for h in hashes) | frozenset(records.loc[in_curves, Col.HASH])
    costs = cost_columns(bench, options.costs, options.baseline, sel.methods, sel.model)
    return ModelFacts(sel.model, sel, records, board, MappingProxyType(cells), avgs, MappingProxyType(bases),
                      MappingProxyType(floor), MappingProxyType(comps), reference_board,
                      MappingProxyType(reference_bases), shown, ablation, MappingProxyType(curves),
                      MappingProxyType(shown_by_curve), MappingProxyType(tests), MappingProxyType(above), costs)


@dataclasses.dataclass(frozen=True)
class ReportFacts:
    """What the whole report knows: the records as loaded (a tuned study's selected runs folded) and each model's
    facts, in the models' order."""
    loaded: Loaded
    models: Mapping[str, ModelFacts]

    @property
    def frame(self) -> pd.DataFrame:
        return self.loaded.frame

    def seeds_per_cell(self) -> str:
        counts = []
        for facts in self.models.values():
            board = facts.board
            ok = board[(board[Col.STATUS] == "ok") & board[Col.SCORE].notna()]
            counts += ok.groupby([Col.METHOD, Col.TASK]).size().tolist()
        if not counts:
            return "none"
        return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"


def report_facts(loaded: Loaded, options: Options, sequential: Mapping = MappingProxyType({})) -> ReportFacts:
    """The facts of every model in `loaded` (its frame already folded: `suite.report.selection.fold_selected`)."""
    df, bench = loaded.frame, read_bench(options.costs)
    cache: dict = {}  # dev sets read for baselines, shared by the models
    models = {}
    for model in unique(df[Col.MODEL]):
        records = df[df[Col.MODEL] == model]
        sel = leaderboard_selection(df, model, options.baseline, options.reference_tasks)
        models[model] = model_facts(records, sel, options, bench, cache, sequential)
    return ReportFacts(loaded, MappingProxyType(models))
