"""`python -m suite reproduce`: a recorded run trained again computes what its record says, bit for bit; a record
that says otherwise (edited scores, losses or predictions) is caught and named."""
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from suite.commands import main
from suite.commands.reproduce import computed, differences
from suite.run.record import load_predictions, save_predictions


@pytest.fixture(scope="module")
def recorded(tiny_bert_dir, glue_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("recorded")
    assert run_cli(tiny_bert_dir, glue_dir, out, "--methods", "vanilla,scores_dropout", "--seeds", "1,2") == 0
    return out


def _records(out: Path) -> list[Path]:
    return sorted((out / "runs").glob("*.json"))


def test_a_rerun_computes_what_its_record_says(recorded, glue_dir, tmp_path, capsys):
    before = {p: p.read_bytes() for p in (recorded / "runs").iterdir()}
    assert main(["reproduce", str(recorded), "--sample", "2", "--data-dir", glue_dir,
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 rerun(s) computed what their records say, bit for bit" in out
    assert out.count("| identical") == 2
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results) == 2 and all(r["differences"] == [] and r["failed"] is None for r in results)
    assert {p: p.read_bytes() for p in (recorded / "runs").iterdir()} == before  # nothing written there


def test_edited_scores_losses_and_predictions_are_named(recorded, glue_dir, tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    record = _records(recorded)[0]
    data = json.loads(record.read_text())
    true_score, true_loss = data["final"]["score"], data["history"][0]["train_loss"]
    data["final"]["score"] = true_score + 0.01
    data["history"][0]["train_loss"] = true_loss * 2
    (runs / record.name).write_text(json.dumps(data))
    sidecar = recorded / "runs" / data["predictions"]
    arrays = load_predictions(sidecar)
    arrays[""]["logits"] = arrays[""]["logits"].copy()
    arrays[""]["logits"][0] += 1.0
    save_predictions(runs / data["predictions"], arrays)
    assert main(["reproduce", str(runs / record.name), "--data-dir", glue_dir]) == 1
    out = capsys.readouterr().out
    assert f"final.score: {true_score + 0.01!r} -> {true_score!r} (-0.01)" in out
    assert f"history[0].train_loss: {true_loss * 2!r} -> {true_loss!r}" in out
    assert "not the file the run wrote (its sha256 differs from the record's)" in out
    assert "dev predictions: 1 of" in out and "rows' logits differ (largest change 1)" in out
    assert "0 of 1 rerun(s) computed what their records say" in out


def test_the_rerun_uses_the_threads_its_record_names(recorded, glue_dir, monkeypatch, capsys):
    import torch

    import suite.run.runner as runner

    seen, real = [], runner.run_one
    monkeypatch.setattr(runner, "run_one", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    record = _records(recorded)[0]
    threads = json.loads(record.read_text())["environment"]["cpu_threads"]
    torch.set_num_threads(threads + 1)
    try:
        assert main(["reproduce", str(record), "--data-dir", glue_dir]) == 0
        assert seen == [threads] and torch.get_num_threads() == threads + 1  # and back after it
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "absent", "no such record file or folder"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "no run records"),
    (lambda tmp: (tmp / "x.json").write_text("{}") and tmp / "x.json", "not a readable run record"),
])
def test_bad_paths_exit_2_before_anything_trains(tmp_path, capsys, make, message):
    assert main(["reproduce", str(make(tmp_path))]) == 2
    assert message in capsys.readouterr().err


def test_differences_name_each_place_and_ignore_the_clock():
    old = {"final": {"score": 0.5, "mcc": float("nan")}, "history": [{"train_loss": 1.0, "epoch_time_s": 3.0,
                                                                       "train_samples_per_s": 9.0}], "data": {"a": "x"}}
    new = {"final": {"score": 0.75, "mcc": float("nan")}, "history": [{"train_loss": 1.0, "epoch_time_s": 4.0,
                                                                       "train_samples_per_s": 8.0}], "data": {"a": "y"}}
    assert differences(computed(old), computed(new)) == ["data.a: 'x' -> 'y'", "final.score: 0.5 -> 0.75 (+0.25)"]
    assert differences(computed(old), computed(old)) == []
    assert differences({"h": [1, 2]}, {"h": [1]}) == ["h: [1, 2] -> [1]"]
    assert np.isnan(old["final"]["mcc"])  # NaN against NaN is no difference
