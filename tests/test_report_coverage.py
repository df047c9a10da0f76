"""The report says what it lacks and what its runs cost: N of M planned jobs (the run commands of commands.txt
planned again) with the cells that have no record, and run hours per cell on each device."""
from test_report import MODEL, make_record

from suite.commands.report import planned_cells
from suite.grid.store import Store
from suite.report import ReportOptions, build_report

PLANNED = ReportOptions(figures=False, aso=False, allow_uncommitted=True, planner=planned_cells)  # the command's


def _grid(root, records, command):
    store = Store(root)
    for name, rec in records:
        store.write(name, rec)
    (root / "commands.txt").write_text(command + "\n")


def test_an_incomplete_grid_names_its_missing_cells_and_each_cells_hours(tmp_path):
    records = [make_record("rte", "vanilla", s, {"accuracy": 0.6 + s / 100}) for s in (1, 2, 3)]
    records += [make_record("rte", "scores_dropout", s, {"accuracy": 0.6}) for s in (1,)]
    records += [make_record("rte", "scores_dropout", 2, {"accuracy": 0.6}, env={"device": "cuda", "gpu": "H200"})]
    for _, rec in records:
        rec["wall_s"] = 1800.0
    _grid(tmp_path, records, f"python -m suite run --methods vanilla,scores_dropout --tasks rte --seeds 1,2,3,4 "
                             f"--model {MODEL} --out x")
    md = build_report([tmp_path], PLANNED).read_text()
    line = next(x for x in md.splitlines() if x.startswith("- **Jobs"))
    assert line.startswith("- **Jobs: 5 of 8 jobs the commands plan have ok records**; 3 without: "
                           "RTE/scores_dropout seeds 3-4; RTE/vanilla seed 4"), line
    table = md.split("#### Compute per cell")[1].split("\n\n")[1].splitlines()
    assert [c.strip() for c in table[2].split("|")[1:3]] == ["vanilla", "1.50 CPU"]
    assert table[3].split("|")[2].strip() == "0.50 CPU + 0.50 GPU"
    assert "2.00 CPU-hours in all, 0.50 GPU-hours in all" in md and "GPU: H200" in md


def test_a_complete_grid_says_so_and_a_command_that_no_longer_plans_is_named(tmp_path):
    records = [make_record("rte", "vanilla", s, {"accuracy": 0.6 + s / 100}) for s in (1, 2)]
    _grid(tmp_path, records, f"python -m suite run --methods vanilla --tasks rte --seeds 1,2 --model {MODEL} --out x")
    md = build_report([tmp_path], PLANNED).read_text()
    assert "- **Jobs:** all 2 jobs the commands plan have ok records" in md
    (tmp_path / "commands.txt").write_text("python -m suite run --study gone.yaml\n")
    md = build_report([tmp_path], PLANNED).read_text()
    assert "- **Jobs:** the planned jobs are unknown (could not plan command 1 (" in md
