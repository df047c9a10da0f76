"""The command line as a new user meets it: help for every option, --version, `list` within 100 columns, dry runs
that read no data, suggestions for misspelt names, plugin errors, metrics checked before training, the options
table in docs/usage.md."""
import dataclasses
import re
from pathlib import Path

import pytest

import suite
from suite.commands import build_parser, main
from suite.grid.store import Store
from suite.run.record import RunRecord
from suite.run.record_parts import Epoch, Metrics
from suite.run.settings import RunConfig, TrainSettings

ROOT = Path(__file__).resolve().parents[1]


def _subparser(name: str):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[name]


def _options(name: str) -> dict[str, str]:
    return {opt: action.help or "" for action in _subparser(name)._actions for opt in action.option_strings
            if opt.startswith("--") and opt != "--help"}


@pytest.mark.parametrize("command", ["run", "list", "report", "predict", "bench", "check"])
def test_every_option_has_help(command):
    missing = [opt for opt, text in _options(command).items() if not text.strip()]
    assert not missing


def test_every_training_setting_has_a_description():
    for f in dataclasses.fields(TrainSettings):
        assert f.metadata.get("help", "").strip(), f"train.{f.name} has no help text"


def test_a_setting_declared_once_drives_help_validation_and_hash():
    """One declaration per setting: the choices given with the field are what validation accepts and what the help
    names, and its hash rule is the one the hash applies."""
    from suite.api.errors import HyperParameterError
    from suite.run.batching import BATCHINGS
    from suite.run.settings import ADDED, NEVER, TRAIN_FIELDS, TRAIN_HASH_RULES, RunConfig, unless

    assert TRAIN_FIELDS["batching"].metadata["choices"] == tuple(BATCHINGS)
    for name in BATCHINGS:
        assert name in TRAIN_FIELDS["batching"].metadata["help"]
        TrainSettings(batching=name).validate()
    with pytest.raises(HyperParameterError, match="choose length, trainer_length, random"):
        TrainSettings(batching="sorted").validate()
    assert TRAIN_HASH_RULES["batching"] == unless("length") and TRAIN_HASH_RULES["analyses"] == NEVER
    assert ADDED not in TRAIN_HASH_RULES.values()  # declared as added: resolved to unless(its default)
    base = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    assert base.hash != RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings(batching="random")).hash


def test_run_help_lists_every_training_setting_and_preset(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    for field in dataclasses.fields(TrainSettings):
        assert f"train.{field.name}" in out
    assert "paper:modelsbert-base-uncased,roberta-base" in re.sub(r"\s+", "", out)


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"python -m suite {suite.__version__}"


def test_list_fits_100_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert any("p=0.1 (float)" in line for line in lines)


def test_list_fits_100_columns_with_plugins_of_long_names(capsys, monkeypatch):
    """Whatever a plugin registers (long names, labels, groups), the listing stays within 100 columns."""
    import dataclasses

    import suite
    from suite.api.tasks import TASKS, get_task, register_task

    monkeypatch.setenv("COLUMNS", "240")
    task, method = "a_very_long_plugin_task_name", "a_method_" + "with_a_long_name_" * 3  # names hold 64 bytes
    register_task(dataclasses.replace(get_task("rte"), name=task, groups=("a_group_of_plugin_tasks",),
                                      label_names=("strongly_agreeing_label", "strongly_disagreeing_label", "other")))
    try:
        suite.register_method(method, "described " * 30)(type("Long", (suite.METHODS.get("vanilla"),), {}))
        assert main(["list"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert max(len(line) for line in lines) <= 100
        assert any(line.startswith("a_method_") for line in lines)
    finally:
        TASKS.remove(task)
        suite.METHODS.remove(method)


def test_dry_run_reads_no_data_and_marks_existing_records(tmp_path, capsys):
    args = ["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1,2", "--data-dir", str(tmp_path / "absent"),
            "--model", str(tmp_path / "no-model"), "--out", str(tmp_path), "--dry-run"]
    assert main(args) == 0
    capsys.readouterr()
    # the quick preset (the default) has no per-task values for RTE; its precision `auto` is fp32 on a CPU without
    # bf16 instructions (conftest), and its padding `auto` the longest row on a CPU
    quick = TrainSettings(precision="fp32", pad_to="longest")
    job = RunConfig(str(tmp_path / "no-model"), "rte", "vanilla", {"p": 0.1}, 1, quick, "local")
    Store(tmp_path).write(job.filename, RunRecord(job.to_dict(), job.hash, job.label, "ok",
                                                  final=Metrics.from_json({"score": 0.5}), history=(Epoch(epoch=1),)))
    assert main(args) == 0
    rows = {line.split()[-1]: line.split()[0] for line in capsys.readouterr().out.splitlines()
            if line.endswith(".json")}  # the job rows (the cost lines below them name bench files mid-line)
    assert rows[job.filename] == "ok" and len(rows) == 2
    assert [v for k, v in rows.items() if k != job.filename] == ["rte/vanilla/seed2"]  # no mark: the label comes first


@pytest.mark.parametrize("args, message", [
    (["--methods", "scores_dropot", "--tasks", "rte"], "Did you mean 'scores_dropout'?"),
    (["--methods", "vanilla", "--tasks", "mrcp"], "Did you mean 'mrpc'?"),
])
def test_misspelt_names_get_a_suggestion(args, message, capsys, tmp_path):
    assert main(["run", *args, "--out", str(tmp_path), "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_report_with_an_unknown_baseline_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--baseline", "vanila"]) == 2
    assert "unknown method 'vanila'" in capsys.readouterr().err


def test_run_shows_plugin_load_errors_for_methods_and_tasks(monkeypatch, tmp_path, capsys):
    from suite.api.attention import METHODS
    from suite.api.tasks import TASKS

    monkeypatch.setattr(METHODS, "plugin_errors", {"broken_method": "ImportError: no module named x"})
    monkeypatch.setattr(TASKS, "plugin_errors", {"broken_task": "SyntaxError: bad"})
    assert main(["run", "--methods", "vanilla", "--tasks", "rte", "--out", str(tmp_path), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "method plugin 'broken_method' failed to load" in err and "task plugin 'broken_task' failed" in err
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "broken_method" in out and "broken_task" in out


def test_unknown_task_metric_is_refused_before_training_and_registered_ones_work(tmp_path, capsys):
    import numpy as np

    from suite.api.metrics import METRICS, compute, register_metric
    from suite.api.tasks import TASKS, get_task, register_task

    spec = dataclasses.replace(get_task("rte"), name="rte_balanced", display="RTE-balanced", benchmark="",
                               metrics=("balanced_acuracy",))
    register_task(spec)
    try:
        assert main(["run", "--methods", "vanilla", "--tasks", "rte_balanced", "--out", str(tmp_path),
                     "--dry-run"]) == 2
        assert "unknown metric(s) 'balanced_acuracy'" in capsys.readouterr().err
        from sklearn.metrics import balanced_accuracy_score

        register_metric("balanced_acuracy", lambda pred, gold: float(balanced_accuracy_score(gold, pred)))
        logits = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
        # recall of class 1: 1/1, of class 0: 2/3 -> (1 + 2/3) / 2
        assert compute(["balanced_acuracy"], logits, np.array([1, 0, 0, 1]) * 0 + np.array([1, 0, 0, 0]),
                       False)["balanced_acuracy"] == pytest.approx((1 + 1) / 2)
        assert main(["run", "--methods", "vanilla", "--tasks", "rte_balanced", "--out", str(tmp_path),
                     "--dry-run"]) == 0
    finally:
        TASKS.remove("rte_balanced")
        METRICS.remove("balanced_acuracy")


def test_usage_options_table_lists_every_run_option():
    usage = ROOT.joinpath("docs", "usage.md").read_text()
    documented = set(re.findall(r"--[a-z][a-z-]+", usage))
    missing = sorted(opt for opt in _options("run") if opt not in documented and not opt.startswith("--no-"))
    assert not missing


def test_docs_list_every_training_settings_hash_rule():
    """docs/records.md's hash table is the code's: every setting that does not always enter the hash, with its rule."""
    import re
    from pathlib import Path

    from suite.run.settings import ALWAYS, TRAIN_HASH_RULES

    text = (Path(__file__).resolve().parents[1] / "docs" / "records.md").read_text()
    documented = dict(re.findall(r"^\| `train\.(\w+)` \| ([^|]+?) \|$", text, flags=re.M))
    assert documented == {name: str(rule) for name, rule in TRAIN_HASH_RULES.items() if rule is not ALWAYS}


@pytest.mark.parametrize("value", ["0", "-5", "x"])
def test_predict_refuses_a_batch_size_below_one(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "RUN.model", "--out", "sub", "--batch-size", value])
    assert exit_.value.code == 2 and "is not an integer >= 1" in capsys.readouterr().err


def test_ctrl_c_outside_training_is_one_line_and_exit_130(monkeypatch, capsys):
    """Planning, preflight, report, bench and predict run outside the grid's own signal handling."""
    import suite.commands.listing as listing

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(listing, "main", interrupted)
    assert main(["list"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_settings_that_change_no_number_are_the_never_hashed_ones_the_report_does_not_group_by():
    """The report groups runs by their training settings but for NEVER_HASHED (speed and analyses): runs that differ
    only in capture or in the analyses asked for are one setting, as their hashes say."""
    from suite.run.settings import NEVER_HASHED, TRAIN_HASH_RULES

    assert {"capture", "analyses", "analysis_examples"} <= NEVER_HASHED
    assert all(TRAIN_HASH_RULES[name].when == "never" for name in NEVER_HASHED)
    assert {"lr", "epochs", "batch_size"}.isdisjoint(NEVER_HASHED)
