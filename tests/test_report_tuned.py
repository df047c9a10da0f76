"""A tuned study's report: every cell ran its own selected configuration (learning rate, the method's own rate), and
the leaderboard still has one row per method and one column per task, with the selections in the Tuning section."""
from __future__ import annotations

import json

from test_report import MODEL, make_record, parse_table

from suite.grid.store import Store
from suite.report import ReportOptions, build_report
from suite.report.markdown import unwrap_prose
from suite.report.vocabulary import slug

# (task, method) -> the selected configuration and the dev accuracy of seeds 1-3
SELECTED = {
    ("rte", "vanilla"): ({"train.lr": 1e-4, "vanilla.p": 0.05}, [0.60, 0.62, 0.64]),
    ("rte", "scores_dropout"): ({"train.lr": 2e-4, "scores_dropout.p": 0.2}, [0.61, 0.63, 0.65]),
    ("sst2", "vanilla"): ({"train.lr": 5e-5, "vanilla.p": 0.2}, [0.80, 0.81, 0.82]),
    ("sst2", "scores_dropout"): ({"train.lr": 1e-4, "scores_dropout.p": 0.05}, [0.79, 0.80, 0.81]),
}


def write_tuned_study(root):
    store = Store(root)
    for (task, method), (settings, scores) in SELECTED.items():
        hp = {k.split(".", 1)[1]: v for k, v in settings.items() if k.startswith(method + ".")}
        for seed, acc in zip((1, 2, 3), scores):
            store.write(*make_record(task, method, seed, {"accuracy": acc}, hparams=hp,
                                     train={"lr": settings["train.lr"], "holdout": 50.0}))
    cells = [{"model": MODEL, "task": t, "method": m, "higher_is_better": True, "selected": s, "reason": "best",
              "configurations": [{"settings": s, "scores": {"101": 0.7}, "mean": 0.7}]}
             for (t, m), (s, _) in SELECTED.items()]
    protocol = {"holdout": 50.0, "holdout_seed": 0, "seeds": [101], "budget": 1, "draw_seed": 0,
                "space": {"vanilla": {"train.lr": [5e-5, 1e-4, 2e-4], "vanilla.p": [0.05, 0.2]}},
                "scored_on": "tuning split"}
    (root / "tuning").mkdir()
    (root / "tuning" / "selection.json").write_text(json.dumps({"protocol": protocol, "cells": cells}))
    return store


def test_each_cell_reports_its_selected_configuration_on_one_leaderboard_row(tmp_path):
    write_tuned_study(tmp_path)
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "62.00 ± 2.00 (3)" and board["vanilla"]["SST-2"] == "**81.00 ± 1.00** (3)"
    assert board["scores_dropout"]["RTE"] == "**63.00 ± 2.00** (3)" and board["scores_dropout"]["SST-2"] == (
        "80.00 ± 1.00 (3)")
    assert "## Runs outside the leaderboard settings" not in md and "## Tuning" in md
    assert "Tuned per task and method, each cell's values in the Tuning section below: `train.lr`, " in (
        unwrap_prose(md))


def test_a_run_of_another_configuration_stays_off_the_leaderboard(tmp_path):
    """Not rte/vanilla's selected p, nor (the method's default p) sst2/vanilla's: both stay in the ablation table,
    where the selected runs read "tuned"."""
    store = write_tuned_study(tmp_path)
    store.write(*make_record("rte", "vanilla", 4, {"accuracy": 0.99}, hparams={"p": 0.2},
                             train={"lr": 1e-4, "holdout": 50.0}))
    store.write(*make_record("sst2", "vanilla", 4, {"accuracy": 0.10}, hparams={"p": 0.1},
                             train={"lr": 1e-4, "holdout": 50.0}))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "62.00 ± 2.00 (3)" and board["vanilla"]["SST-2"] == "**81.00 ± 1.00** (3)"
    assert "no runs with its default" not in md
    ablation = parse_table(md, "#### vanilla")
    assert ablation["tuned"] == {"p": "tuned", "train.lr": "tuned", "SST-2": "81.00 ± 1.00 (3)",
                                 "RTE": "62.00 ± 2.00 (3)", "in leaderboard": "✓"}
    assert ablation["0.2"]["RTE"] == "99.00 ± – (1)" and ablation["0.1"]["SST-2"] == "10.00 ± – (1)"


def test_the_tuning_section_tabulates_each_cells_selection_by_method_and_task(tmp_path):
    write_tuned_study(tmp_path)
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
            for line in md.split("Selected per task", 1)[1].split("### Every configuration")[0].splitlines()
            if line.startswith(f"| {MODEL} ")}
    assert rows == {"vanilla": ["lr=0.0001, p=0.05 (70.00)", "lr=5e-05, p=0.2 (70.00)"],
                    "scores_dropout": ["lr=0.0002, p=0.2 (70.00)", "lr=0.0001, p=0.05 (70.00)"]}


def test_a_quoted_number_in_the_search_space_still_folds(tmp_path):
    """A space written `train.lr: ["1e-4"]` keeps the text in selection.json while the run trained on 0.0001."""
    write_tuned_study(tmp_path)
    path = tmp_path / "tuning" / "selection.json"
    data = json.loads(path.read_text())
    for cell in data["cells"]:
        cell["selected"] = {k: (f"{v:g}" if k == "train.lr" else v) for k, v in cell["selected"].items()}
    path.write_text(json.dumps(data))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "62.00 ± 2.00 (3)" and board["scores_dropout"]["SST-2"] == "80.00 ± 1.00 (3)"
    assert "## Runs outside the leaderboard settings" not in md


def _with_configurations(root, seeds=(101,), budget=3):
    """Each cell tried three learning rates (rte/scores_dropout one fewer: a draw that missed 1e-3), the selected
    configuration the best."""
    path = root / "tuning" / "selection.json"
    data = json.loads(path.read_text())
    scores = {"vanilla": [0.70, 0.60, 0.50], "scores_dropout": [0.66, 0.64, 0.20]}
    for cell in data["cells"]:
        method, selected = cell["method"], cell["selected"]
        lrs = [selected["train.lr"], *[lr for lr in (5e-5, 1e-4, 2e-4, 1e-3) if lr != selected["train.lr"]][:2]]
        if (cell["task"], method) == ("rte", "scores_dropout"):
            lrs = [selected["train.lr"], 5e-5, 1e-4]
        cell["configurations"] = [
            {"settings": {**selected, "train.lr": lr}, "scores": {str(s): v for s in seeds}, "mean": v}
            for lr, v in zip(lrs, scores[method])]
    data["protocol"].update(seeds=list(seeds), budget=budget, draw="uniform", space={
        m: {"train.lr": [5e-5, 1e-4, 2e-4, 1e-3]} for m in ("vanilla", "scores_dropout")})
    path.write_text(json.dumps(data))


def test_the_tuning_section_says_each_methods_configurations_and_a_single_seed(tmp_path):
    write_tuned_study(tmp_path)
    _with_configurations(tmp_path)
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    tuning = unwrap_prose(md).split("## Tuning", 1)[1].split("Selected per task")[0]
    assert "The selection rests on 1 tuning seed, fewer than 3" in tuning and "Bouthillier" in tuning
    assert "| vanilla | train.lr: 5e-05, 0.0001, 0.0002, 0.001 | 4 | 3 | 3 of 4 (never 0.001) |" in tuning
    assert "uniform draw, which may leave a learning rate untried" in tuning
    _with_configurations(tmp_path, seeds=(101, 102, 103), budget="all")
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    assert "fewer than 3" not in md and "on its whole grid" in md


def test_expected_validation_performance_per_task_with_its_figure_and_csv(tmp_path):
    from suite.stats.evp import expected_best

    write_tuned_study(tmp_path)
    _with_configurations(tmp_path, seeds=(101, 102, 103))   # the ± only where 3 tuning seeds stand behind it
    md = build_report([tmp_path], ReportOptions(out=tmp_path / "report")).read_text()
    section = md.split("## Expected validation performance", 1)[1]
    rows = parse_table(section, f"### SST-2 (`{MODEL}`)")
    means, stds = expected_best([0.66, 0.64, 0.20])
    assert rows["scores_dropout"] == {"method": "scores_dropout", "N": "3", **{
        f"k = {k + 1}": f"{100 * means[k]:.2f} ± {100 * stds[k]:.2f}" for k in range(3)}}
    assert rows["scores_dropout"]["k = 1"] == "50.00 ± 21.23" and rows["vanilla"]["k = 1"] == "60.00 ± 8.16"
    assert "vanilla leads at every k." in section
    figure = f"figures/evp_{slug(MODEL)}.png"
    assert (tmp_path / "report" / figure).is_file() and figure in section
    csv = (tmp_path / "report" / "tuning_expected_performance.csv").read_text().splitlines()
    assert csv[0] == "model,task,method,N,k = 1,k = 2,k = 3" and len(csv) == 5
    # one tuning seed: the spread of one seed's scores over 3 configurations is no uncertainty, so no ±
    _with_configurations(tmp_path)
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    section = md.split("## Expected validation performance", 1)[1]
    rows = parse_table(section, f"### SST-2 (`{MODEL}`)")
    assert rows["scores_dropout"]["k = 1"] == "50.00" and "No ± is shown" in section


def test_a_leader_that_changes_with_the_budget_is_named(tmp_path):
    """scores_dropout's configurations are steady, vanilla's spread: vanilla leads only when it gets 3 draws."""
    write_tuned_study(tmp_path)
    path = tmp_path / "tuning" / "selection.json"
    data = json.loads(path.read_text())
    for cell in data["cells"]:
        values = [0.9, 0.4, 0.4] if cell["method"] == "vanilla" else [0.7, 0.68, 0.66]
        cell["configurations"] = [{"settings": {**cell["selected"], "train.lr": lr}, "scores": {"101": v}, "mean": v}
                                  for lr, v in zip((cell["selected"]["train.lr"], 1.0, 2.0), values)]
    path.write_text(json.dumps(data))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    section = md.split("## Expected validation performance")[1]
    assert ("Best expected score by k: k = 1–2: scores_dropout; k = 3: vanilla. **The leader changes with the "
            "budget.**") in section


def test_the_selection_file_is_read_once_per_report(tmp_path, monkeypatch):
    """selection.json was read three times per report (the folding of the selected runs, the Tuning section and
    expected validation performance); now once, into `Loaded`, and every section reads that."""
    from pathlib import Path

    write_tuned_study(tmp_path)
    _with_configurations(tmp_path)
    reads, read_text = [], Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or read_text(self, *a, **k))
    md = build_report([tmp_path], ReportOptions(figures=False, aso=False)).read_text()
    assert reads.count("selection.json") == 1
    assert md.index("## Tuning") < md.index("## Expected validation performance")
    assert "### Every configuration tried" in md
