"""The attention table compares methods on the same tasks and seeds, whatever extra runs one of them has."""
from __future__ import annotations

from test_report import attention_stats, make_record, parse_table

from suite.grid.store import Store
from suite.report import build_report


def write(root, runs):
    store = Store(root)
    for task, method, seed, shift in runs:
        store.write(*make_record(task, method, seed, {"accuracy": 0.6}, attention=attention_stats(shift)))
    return root


def test_attention_means_cover_the_shared_tasks_and_seeds(tmp_path):
    # sparsity per run: 0.15 + shift. On RTE and MRPC seeds 1-3 both methods average (3 x 0.15 + 3 x 1.15) / 6;
    # vanilla's two extra MRPC seeds (as a sequential design gives the reference) and its WNLI runs, which the
    # other method lacks, would pull its pooled mean to 2.09 if they counted.
    runs = [(t, m, s, shift) for m in ("vanilla", "scores_dropout") for t, shift in (("rte", 0.0), ("mrpc", 1.0))
            for s in (1, 2, 3)]
    runs += [("mrpc", "vanilla", s, 5.0) for s in (4, 5)] + [("wnli", "vanilla", s, 3.0) for s in (1, 2, 3)]
    md = build_report([write(tmp_path, runs)], figures=False).read_text()
    att = parse_table(md, "### Attention")
    assert att["vanilla"]["sparsity"] == att["scores_dropout"]["sparsity"] == "0.650"
    assert att["vanilla"]["runs"] == att["scores_dropout"]["runs"] == "6"
    assert "every method shown ran (MRPC: 3 seed(s), RTE: 3 seed(s))" in md


def test_attention_without_shared_runs_says_the_rows_are_not_comparable(tmp_path):
    runs = [("rte", "vanilla", s, 0.0) for s in (1, 2)] + [("mrpc", "scores_dropout", s, 1.0) for s in (1, 2)]
    md = build_report([write(tmp_path, runs)], figures=False).read_text()
    att = parse_table(md, "### Attention")
    assert att["vanilla"]["sparsity"] == "0.150" and att["scores_dropout"]["sparsity"] == "1.150"
    assert "the rows are not comparable" in md
