"""The report as a document: its options, where its output goes (lines, figures, tables for export), the facts of
each model (computed once, before any section: `suite.report.facts`), and the order of the sections."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from suite.report import (
    analysis_sections,
    costs,
    data_efficiency,
    details,
    figure_sections,
    header,
    leaderboard,
    reference,
    stability,
)
from suite.report.costs import read_bench
from suite.report.facts import ModelFacts, model_facts
from suite.report.figure_sections import FIGURES
from suite.report.formatting import slug, unique
from suite.report.load import Loaded
from suite.report.registry_info import reconstruction_note
from suite.report.selection import Selection, select, setting_text


@dataclasses.dataclass
class Options:
    baseline: str = "vanilla"          # the reference method
    alpha: float = 0.05
    correction: str = "holm"           # "holm" or "bh"
    aso: bool = True                   # almost stochastic order (the slowest statistic)
    data_dir: str | None = None        # dev labels for the baselines of records that lack them
    costs: str | None = None           # `python -m suite bench --json` file
    figures: bool = True               # False: tables only (much faster; existing figures are left alone)
    reference_tasks: tuple[str, ...] = ()  # shown in their own table, left out of comparisons and averages
    primary: tuple[str, ...] = ()      # primary comparisons (methods, tasks, METHOD:TASK): Holm; the rest BH
    margin: float | dict | None = None  # equivalence margin, points x100 (one number or task -> number)
    collapse_floor: float | dict | None = None  # points above the constant predictor below which a run collapsed
    allow_uncommitted: bool = False    # report records of uncommitted code or of several commits


class Report:
    def __init__(self, loaded: Loaded, out: Path, options: Options, date_line: str,
                 sequential: Mapping = MappingProxyType({})):
        self.df = loaded.frame
        self.sequential = sequential   # the verdicts of a study run with --until-decided
        self.loaded = loaded
        self.out = out
        self.fig_dir = out / FIGURES
        self.baseline, self.alpha, self.correction, self.aso = (options.baseline, options.alpha,
                                                                options.correction, options.aso)
        self.data_dir, self.draw = options.data_dir, options.figures
        self.costs_path = options.costs
        self.reference_tasks = options.reference_tasks
        self.bench = read_bench(options.costs)
        self.date_line = date_line
        self.lines: list[str] = []
        self.figures: list[Path] = []
        self.options = options
        self.facts: dict[str, ModelFacts] = {}  # model -> its facts (filled by `build` before any section)
        self.tables: dict[tuple[str, str], tuple[list[str], list[list[str]]]] = {}   # (model, kind) -> table

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, name: str) -> Path:
        if self.draw:
            self.fig_dir.mkdir(parents=True, exist_ok=True)
        return self.fig_dir / name

    def link(self, path: Path, alt: str) -> None:
        self.figures.append(path)
        self.add(f"![{alt}]({FIGURES}/{path.name})", "")

    def method_label(self, method: str, sel: Selection) -> str:
        label = method + (" †" if reconstruction_note(method) else "")
        if not sel.hp_is_default[method]:
            text = setting_text(json.loads(sel.hp_by_method[method]), method)
            label += f" [{text}]" if text else ""
        return label

    def seeds_per_cell(self) -> str:
        counts = []
        for facts in self.facts.values():
            board = facts.board
            ok = board[(board["status"] == "ok") & board["score"].notna()]
            counts += ok.groupby(["method", "task"]).size().tolist()
        if not counts:
            return "none"
        return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"

    def model_section(self, facts: ModelFacts) -> None:
        sel, board, mslug = facts.sel, facts.board, slug(facts.model)
        self.add(f"## Model `{facts.model}`", "")
        leaderboard.leaderboard(self, facts)
        reference.section(self, facts)
        if self.baseline in sel.methods:
            self.add(*costs.in_run_context(self, sel, board))
        details.setup(self, sel, board)
        details.per_task(self, facts)
        details.ablations(self, sel, facts.ablation)
        data_efficiency.section(self, facts, mslug)
        stability.stability(self, facts, mslug)
        figure_sections.overfitting(self, sel, board, mslug)
        figure_sections.attention(self, sel, board, mslug, facts.model)
        analysis_sections.section(self, sel, board, mslug, facts.model)

    def build(self) -> str:
        cache: dict = {}  # dev sets read for baselines, shared by the models
        for model in unique(self.df["model"]):
            records = self.df[self.df["model"] == model]
            sel = select(self.df, model, self.baseline, self.reference_tasks)
            self.facts[model] = model_facts(records, sel, self.options, cache, self.sequential)
        header.header(self)
        for facts in self.facts.values():
            self.model_section(facts)
        details.failures(self)
        details.skipped_records(self)
        text = "\n".join(self.lines).rstrip("\n") + "\n"
        return re.sub(r"\n{3,}", "\n\n", text)
