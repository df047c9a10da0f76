"""The report's aggregation of the analyses: seeds paired within a cell, tables and figures from per-run parts."""
import math
from pathlib import Path

import pandas as pd
import pytest

from suite.report import analysis_sections as section
from suite.report.selection import Selection


def _run(method, seed, attention, prediction, task="sst2", tau=0.5):
    return {"method": method, "task": task, "hp": "{}", "train": "{}", "seed": seed, "status": "ok",
            "analyses": {"seeds": {"content_attention": attention, "attention": attention, "prediction": prediction},
                         "importance": {"mean": {"tau_cls_gxi": tau, "entropy_gxi": 1.0}},
                         "heads": {"mass_cls": [[0.5, 0.1]], "mass_sep": [[0.2, 0.3]], "mass_punct": [[0.0, 0.1]],
                                   "entropy": [[1.0, 2.0]], "uniform_entropy": 2.0}}}


@pytest.fixture
def board():
    return pd.DataFrame([
        _run("vanilla", 1, [[1, 0], [0.5, 0.5]], [[1, 0], [0.2, 0.8]], tau=0.2),
        _run("vanilla", 2, [[0, 1], [0.5, 0.5]], [[0, 1], [0.2, 0.8]], tau=0.4),
        _run("vanilla", 3, [[1, 0], [0.5, 0.5]], [[1, 0], [0.6, 0.4]], task="rte"),   # alone in its cell
        _run("topk", 1, [[1, 0], [1, 0]], [[1, 0], [1, 0]]),
    ])


def test_seeds_are_paired_within_a_cell_only(board):
    runs = section._part(board, "seeds")
    pairs = section.seed_pairs(runs)
    assert set(pairs) == {"vanilla"}                      # topk has one seed, rte one run: nothing to pair
    assert pairs["vanilla"]["jsd"] == pytest.approx([math.log(2), 0.0])
    assert pairs["vanilla"]["tvd"] == pytest.approx([1.0, 0.0])


def test_importance_table_means_over_runs(board):
    sel = Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, {})
    text = section.importance_table(sel, section._part(board, "importance"), str)
    vanilla = next(line for line in text.splitlines() if line.startswith("| vanilla"))
    assert "0.367" in vanilla                              # (0.2 + 0.4 + 0.5) / 3
    assert vanilla.rstrip(" |").endswith("3")


class _Rep:
    def __init__(self, out: Path, draw: bool = True):
        self.lines, self.figures, self.out, self.draw = [], [], out, draw

    def add(self, *lines):
        self.lines.extend(lines)

    def figure(self, name):
        return self.out / name

    def link(self, path, alt):
        self.figures.append(path)

    def method_label(self, m, sel):
        return m


def test_section_writes_tables_and_figures(board, tmp_path):
    rep = _Rep(tmp_path)
    sel = Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, {})
    section.section(rep, sel, board, "m", "m")
    text = "\n".join(rep.lines)
    assert "Interpretability analyses" in text and "JSD of attention" in text
    assert sorted(p.name for p in rep.figures) == ["analysis_heads_m.png", "analysis_seeds_m.png"]
    assert all(p.is_file() for p in rep.figures)
    heads = section.mean_heads(section._part(board, "heads"), "vanilla")
    assert heads["entropy"].tolist() == [[1.0, 2.0]]


def test_no_analyses_no_section(tmp_path):
    rep = _Rep(tmp_path)
    board = pd.DataFrame([{"method": "vanilla", "status": "ok", "analyses": None}])
    section.section(rep, Selection("m", [], ["vanilla"], {}, {}, {}), board, "m", "m")
    assert rep.lines == []


def test_tables_only_report_draws_no_analysis_figure(board, tmp_path):
    """--no-figures: the tables are written, no figure is drawn or linked."""
    rep = _Rep(tmp_path, draw=False)
    section.section(rep, Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, {}), board, "m", "m")
    assert "JSD of attention" in "\n".join(rep.lines)
    assert rep.figures == [] and not list(tmp_path.iterdir())


def test_records_older_than_the_content_measure_show_the_boundary_measure_by_name(board, tmp_path):
    """Records written before the content-token measure keep only the [CLS] row with boundary tokens: the report shows
    that measure, named as such, instead of an empty column."""
    for part in board["analyses"]:
        del part["seeds"]["content_attention"]
    rep = _Rep(tmp_path)
    sel = Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, {})
    section.section(rep, sel, board, "m", "m")
    text = "\n".join(rep.lines)
    assert "JSD of [CLS] attention with boundary tokens" in text and "predate the content-token measure" in text
    row = next(line for line in text.splitlines() if line.startswith("| vanilla"))
    assert row.split("|")[2].strip() != "–"  # the pair of vanilla seeds on SST-2 has a divergence
