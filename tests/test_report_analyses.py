"""The report's aggregation of the analyses: seeds paired within a cell, tables and figures from per-run parts."""
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from suite.report import analysis_sections as section
from suite.report.facts import Options
from suite.report.load import Setting
from suite.report.selection import Selection
from suite.run.record_parts import Analyses

DEFAULTS = {"vanilla": True, "topk": True}   # each method's row labelled by its name alone


def _run(method, seed, attention, prediction, task="sst2", tau=0.5):
    return {"method": method, "task": task, "hp": Setting.of({}), "train": Setting.of({}), "seed": seed, "status": "ok",
            "analyses": Analyses.from_json({
                "seeds": {"content_attention": attention, "attention": attention, "prediction": prediction},
                "importance": {"mean": {"tau_cls_gxi": tau, "entropy_gxi": 1.0}},
                "heads": {"mass_cls": [[0.5, 0.1]], "mass_sep": [[0.2, 0.3]], "mass_punct": [[0.0, 0.1]],
                          "entropy": [[1.0, 2.0]], "uniform_entropy": 2.0}})}


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
    sel = Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, DEFAULTS)
    text = section.importance_table(sel, section._part(board, "importance"), str)
    vanilla = next(line for line in text.splitlines() if line.startswith("| vanilla"))
    assert "0.367" in vanilla                              # (0.2 + 0.4 + 0.5) / 3
    assert vanilla.rstrip(" |").endswith("3")


def _section(sel: Selection, board: pd.DataFrame, out, figures: bool = True):
    """The section of model "m" with these records as its leaderboard's, written under `out`."""
    return section.section(SimpleNamespace(sel=sel, board=board, model="m"), Options(out=out, figures=figures))


def test_section_writes_tables_and_figures(board, tmp_path):
    sel = Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, DEFAULTS)
    part = _section(sel, board, tmp_path)
    text = "\n".join(part.lines)
    assert "Interpretability analyses" in text and "JSD of attention" in text
    assert sorted(p.name for p in part.figures) == ["analysis_heads_m.png", "analysis_seeds_m.png"]
    assert all(p.is_file() for p in part.figures)
    heads = section.mean_heads(section._part(board, "heads"), "vanilla")
    assert heads["entropy"].tolist() == [[1.0, 2.0]]


def test_no_analyses_no_section(tmp_path):
    board = pd.DataFrame([{"method": "vanilla", "status": "ok", "analyses": None}])
    part = _section(Selection("m", [], ["vanilla"], {}, {}, DEFAULTS), board, tmp_path)
    assert part.lines == []


def test_tables_only_report_draws_no_analysis_figure(board, tmp_path):
    """--no-figures: the tables are written, no figure is drawn or linked."""
    part = _section(Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, DEFAULTS), board, tmp_path,
                    figures=False)
    assert "JSD of attention" in "\n".join(part.lines)
    assert part.figures == [] and not list(tmp_path.iterdir())


def test_records_older_than_the_content_measure_show_the_boundary_measure_by_name(board, tmp_path):
    """Records written before the content-token measure keep only the [CLS] row with boundary tokens: the report shows
    that measure, named as such, instead of an empty column."""
    for analyses in board["analyses"]:
        del analyses.get("seeds")["content_attention"]
    sel = Selection("m", ["sst2", "rte"], ["vanilla", "topk"], {}, {}, DEFAULTS)
    part = _section(sel, board, tmp_path)
    text = "\n".join(part.lines)
    assert "JSD of [CLS] attention with boundary tokens" in text and "predate the content-token measure" in text
    row = next(line for line in text.splitlines() if line.startswith("| vanilla"))
    assert row.split("|")[2].strip() != "–"  # the pair of vanilla seeds on SST-2 has a divergence
