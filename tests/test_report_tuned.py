"""A tuned study's report: every cell ran its own selected configuration (learning rate, the method's own rate), and
the leaderboard still has one row per method and one column per task, with the selections in the Tuning section."""
from __future__ import annotations

import json

from test_report import MODEL, make_record, parse_table

from suite.grid.store import Store
from suite.report import build_report

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
    md = build_report([tmp_path], figures=False).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "62.00 ± 2.00 (3)" and board["vanilla"]["SST-2"] == "**81.00 ± 1.00** (3)"
    assert board["scores_dropout"]["RTE"] == "**63.00 ± 2.00** (3)" and board["scores_dropout"]["SST-2"] == (
        "80.00 ± 1.00 (3)")
    assert "## Runs outside the leaderboard settings" not in md and "## Tuning" in md
    assert "Tuned per task and method, each cell's values in the Tuning section below: `train.lr`, " in md


def test_a_run_of_another_configuration_stays_off_the_leaderboard(tmp_path):
    """Not rte/vanilla's selected p, nor (the method's default p) sst2/vanilla's: both stay in the ablation table,
    where the selected runs read "tuned"."""
    store = write_tuned_study(tmp_path)
    store.write(*make_record("rte", "vanilla", 4, {"accuracy": 0.99}, hparams={"p": 0.2},
                             train={"lr": 1e-4, "holdout": 50.0}))
    store.write(*make_record("sst2", "vanilla", 4, {"accuracy": 0.10}, hparams={"p": 0.1},
                             train={"lr": 1e-4, "holdout": 50.0}))
    md = build_report([tmp_path], figures=False).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "62.00 ± 2.00 (3)" and board["vanilla"]["SST-2"] == "**81.00 ± 1.00** (3)"
    assert "no runs with its default" not in md
    ablation = parse_table(md, "#### vanilla")
    assert ablation["tuned"] == {"p": "tuned", "train.lr": "tuned", "SST-2": "81.00 ± 1.00 (3)",
                                 "RTE": "62.00 ± 2.00 (3)", "in leaderboard": "✓"}
    assert ablation["0.2"]["RTE"] == "99.00 ± – (1)" and ablation["0.1"]["SST-2"] == "10.00 ± – (1)"


def test_the_tuning_section_tabulates_each_cells_selection_by_method_and_task(tmp_path):
    write_tuned_study(tmp_path)
    md = build_report([tmp_path], figures=False).read_text()
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
    md = build_report([tmp_path], figures=False).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "62.00 ± 2.00 (3)" and board["scores_dropout"]["SST-2"] == "80.00 ± 1.00 (3)"
    assert "## Runs outside the leaderboard settings" not in md
