"""Every report option is checked against what it names (issue 67): a primary comparison of no method or task in the
records, a per-task margin or collapse floor keyed by no task or of no finite value, an empty output folder: each is
refused with exit 2, in the suite's words (no pydantic internals), with the fix."""
from __future__ import annotations

import pytest
from conftest import fake_ok_record

from suite.api.errors import EXIT_BAD_INPUT
from suite.commands import main
from suite.grid.store import Store
from suite.run.settings import RunConfig, TrainSettings

REPORT = ["--no-figures", "--no-aso", "--allow-uncommitted"]


@pytest.fixture
def runs(tmp_path):
    store = Store(tmp_path / "out")
    for method in ("vanilla", "scores_dropout"):
        for seed in (1, 2):
            job = RunConfig("m", "rte", method, {"p": 0.1} if method != "vanilla" else {}, seed,
                            TrainSettings(precision="fp32"))
            store.write(job.filename, fake_ok_record(job))
    return tmp_path / "out"


def _study(tmp_path, runs, section: str) -> str:
    path = tmp_path / "study.yaml"
    path.write_text(f"out: {runs}\nreport:\n  {section}\n")
    return str(path)


@pytest.mark.parametrize("section, says", [
    ("margin: {nosuchtask: 1}", "report.margin: 'nosuchtask' is no task: key it by a registered task's name"),
    ("collapse_floor: .inf", "report.collapse_floor: inf is not a finite number >= 0"),
    ("margin: .nan", "report.margin: nan is not a finite number > 0"),
    ("margin: {rte: .inf}", "report.margin.rte: inf is not a finite number > 0"),
    ("collapse_floor: {rte: -1}", "report.collapse_floor.rte: -1 is not a finite number >= 0"),
    ("margin: {rte: true}", "report.margin.rte: True is not a finite number > 0"),
])
def test_a_per_task_value_of_no_task_or_no_finite_number_is_refused_in_the_suites_words(section, says, runs, tmp_path,
                                                                                      capsys):
    assert main(["report", "--study", _study(tmp_path, runs, section), *REPORT]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert says in err and "function-after" not in err and "validator" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_per_task_values_of_known_tasks_an_average_and_a_default_are_read(runs, tmp_path):
    section = "margin: {rte: 2, GLUE avg: 1.5, default: 1}"
    assert main(["report", "--study", _study(tmp_path, runs, section), *REPORT]) == 0


@pytest.mark.parametrize("given", [["--primary", "nosuchmethod"], ["--primary", "scores_dropout:nosuchtask"],
                                   ["--primary", "cola"]],
                         ids=["no such method", "no such task", "a task without records"])
def test_a_primary_comparison_that_names_nothing_reported_is_refused(given, runs, capsys):
    """It exited 0 and made every comparison exploratory, which changed the correction."""
    assert main(["report", str(runs), *given, *REPORT]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"--primary {given[1]!r} names no method, task or METHOD:TASK of the records reported" in err
    assert "methods: scores_dropout, vanilla" in err
    if given[1] == "cola":   # a registered name without records: a study under way is told how to look at it
        assert "it has no records yet" in err and f"`python -m suite report {runs}`, without --study" in err
    else:
        assert "fix the name" in err and "no records yet" not in err


def test_a_primary_list_of_nothing_is_refused(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["report", str(runs), "--primary", ",", *REPORT])
    assert stop.value.code == EXIT_BAD_INPUT and "',' names nothing" in capsys.readouterr().err
    assert main(["report", "--study", _study(tmp_path, runs, "primary: ','"), *REPORT]) == EXIT_BAD_INPUT
    assert "--primary '' names no method" in capsys.readouterr().err


def test_a_primary_comparison_of_the_records_is_read(runs, capsys):
    assert main(["report", str(runs), "--primary", "scores_dropout:rte", *REPORT]) == 0


def test_an_empty_output_folder_is_refused(runs, tmp_path, glue_dir, tiny_bert_dir, capsys):
    """`out: ''` in a study wrote into ./runs."""
    assert main(["report", str(runs), "--out", "", *REPORT]) == EXIT_BAD_INPUT
    assert "--out '' names no folder" in capsys.readouterr().err
    study = tmp_path / "run.yaml"
    study.write_text("out: ''\nmethods: [vanilla]\ntasks: [rte]\nseeds: [1]\n")
    for dry in (["--dry-run"], []):
        assert main(["run", "--study", str(study), "--model", tiny_bert_dir, "--data-dir", glue_dir, *dry]) \
            == EXIT_BAD_INPUT
        assert "--out '' names no folder" in capsys.readouterr().err
