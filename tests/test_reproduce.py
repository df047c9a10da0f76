"""`python -m suite reproduce`: a recorded run trained again computes what its record says, bit for bit; a record
that says otherwise (edited scores, losses, digests, statistics or predictions) is caught and named; bad input stops
before anything trains."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from suite.commands import main
from suite.commands.reproduce import computed, differences
from suite.run.record import HELDOUT, load_predictions, save_predictions


@pytest.fixture(scope="module")
def recorded(tiny_bert_dir, glue_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("recorded")
    assert run_cli(tiny_bert_dir, glue_dir, out, "--methods", "vanilla,scores_dropout", "--seeds", "1,2") == 0
    return out


def _records(out: Path) -> list[Path]:
    return sorted((out / "runs").glob("*.json"))


def _copy(record: Path, to: Path) -> tuple[Path, dict]:
    """The record and its sidecar copied into `to`, and the record's JSON to edit."""
    to.mkdir(exist_ok=True)
    data = json.loads(record.read_text())
    shutil.copy(record.parent / data["predictions"], to / data["predictions"])
    return to / record.name, data


def test_a_rerun_computes_what_its_record_says(recorded, glue_dir, tmp_path, capsys):
    before = {p: p.read_bytes() for p in (recorded / "runs").iterdir()}
    assert main(["reproduce", str(recorded), "--sample", "2", "--data-dir", glue_dir,
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 rerun(s) computed what their records say, bit for bit" in out
    assert out.count("| identical") == 2 and out.count("| +0 ") == 2   # the final score's change
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results) == 2 and all(r["differences"] == [] and r["failed"] is None for r in results)
    assert {p: p.read_bytes() for p in (recorded / "runs").iterdir()} == before  # nothing written there


def test_an_edit_in_each_part_of_a_record_is_named(recorded, glue_dir, tmp_path, capsys):
    path, data = _copy(_records(recorded)[0], tmp_path / "runs")
    true_score, true_loss = data["final"]["score"], data["history"][0]["train_loss"]
    data["final"]["score"] = true_score + 0.01
    data["history"][0]["train_loss"] = true_loss * 2
    data["history"][0]["train_subset_loss"] = -1.0
    data["data"]["draw"]["train_rows_sha"] = "0" * 12
    data["attention"]["mean"]["mass_sep"] = -1.0
    data["parameters"]["total"] += 1
    data["history"][0]["epoch_time_s"] += 100  # the clock: no difference
    path.write_text(json.dumps(data))
    sidecar = path.parent / data["predictions"]
    arrays = load_predictions(sidecar)
    arrays[""]["logits"] = arrays[""]["logits"].copy()
    arrays[""]["logits"][0] += 1.0
    save_predictions(sidecar, arrays)
    assert main(["reproduce", str(path), "--data-dir", glue_dir, "--json", str(tmp_path / "r.json")]) == 1
    found = json.loads((tmp_path / "r.json").read_text())[0]["differences"]
    assert f"final.score: {true_score + 0.01!r} -> {true_score!r} (-0.01)" in found
    assert any(d.startswith(f"history[0].train_loss: {true_loss * 2!r} -> {true_loss!r}") for d in found)
    for place in ("history[0].train_subset_loss: -1.0 ->", "data.draw.train_rows_sha: '000000000000' ->",
                  "attention.mean.mass_sep: -1.0 ->", "parameters.total:",
                  f"{sidecar.name}: not the file the run wrote (its sha256 differs from the record's)",
                  "dev predictions logits: 1 of"):
        assert any(d.startswith(place) for d in found), (place, found)
    assert not any("epoch_time_s" in d for d in found)
    out = capsys.readouterr().out
    assert "0 of 1 rerun(s) computed what their records say" in out and "more (--json keeps them all)" in out


def test_a_last_bit_rounding_of_a_number_is_the_same_result_unless_exact(recorded, glue_dir, tmp_path, capsys):
    """Another CPU's numpy may sum a metric in another order: the same value but for its last bits."""
    path, data = _copy(_records(recorded)[0], tmp_path / "runs")
    score = data["final"]["score"]
    data["final"]["score"] = float(np.nextafter(score, 2.0))
    path.write_text(json.dumps(data))
    assert main(["reproduce", str(path), "--data-dir", glue_dir]) == 0
    out = capsys.readouterr().out
    assert "the same but for rounding (1 number(s))" in out and "0 of 1 rerun(s) computed what their records say, " \
        "bit for bit" in out and "1 the same but for the last-bit rounding of a number" in out
    assert f"final.score: {float(np.nextafter(score, 2.0))!r} -> {score!r}" in out
    assert main(["reproduce", str(path), "--data-dir", glue_dir, "--exact"]) == 1


def test_held_out_predictions_are_compared_apart_from_dev(tiny_bert_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "held"
    assert run_cli(tiny_bert_dir, glue_dir, out, "--set", "train.test_holdout=6") == 0
    assert main(["reproduce", str(out), "--data-dir", glue_dir]) == 0
    path, data = _copy(_records(out)[0], tmp_path / "edited")
    path.write_text(json.dumps(data))
    sidecar = path.parent / data["predictions"]
    with np.load(sidecar) as kept:
        arrays = {key: kept[key].copy() for key in kept.files}
    arrays[f"{HELDOUT}/logits"][0] += 1.0
    np.savez_compressed(sidecar, **arrays)
    data.pop("predictions_sha256")
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["reproduce", str(path), "--data-dir", glue_dir]) == 1
    text = capsys.readouterr().out
    assert "held-out predictions logits: 1 of 6 rows differ" in text and "dev predictions" not in text


def test_the_rerun_uses_the_threads_its_record_names(recorded, glue_dir, monkeypatch):
    import torch

    import suite.run.runner as runner

    seen, real = [], runner.run_one
    monkeypatch.setattr(runner, "run_one", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    record = _records(recorded)[0]
    threads, original = json.loads(record.read_text())["environment"]["cpu_threads"], torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert main(["reproduce", str(record), "--data-dir", glue_dir]) == 0
        assert seen == [threads] and torch.get_num_threads() == threads + 1  # and back after it
    finally:
        torch.set_num_threads(original)


def _missing_sidecar(tmp: Path, record: Path) -> Path:
    path, data = _copy(record, tmp / "runs")
    (path.parent / data["predictions"]).unlink()
    path.write_text(json.dumps(data))
    return path


def _cuda_record(tmp: Path, record: Path) -> Path:
    path, data = _copy(record, tmp / "runs")
    path.write_text(json.dumps({**data, "environment": {**data["environment"], "device": "cuda:0"}}))
    return path


@pytest.mark.parametrize("make, extra, message", [
    (lambda tmp, rec: tmp / "absent", [], "no such record file or folder"),
    (lambda tmp, rec: (tmp / "empty").mkdir() or tmp / "empty", [], "no run records"),
    (lambda tmp, rec: (tmp / "x.json").write_text("{}") and tmp / "x.json", [], "not a readable run record"),
    (_missing_sidecar, [], "predictions sidecar"),
    (_cuda_record, [], "no CUDA device is visible"),
    (lambda tmp, rec: rec, ["--json", "/nonexistent-folder/r.json"], "--json /nonexistent-folder/r.json: cannot"),
])
def test_bad_input_exits_2_before_anything_trains(recorded, tmp_path, capsys, monkeypatch, make, extra, message):
    import suite.run.runner as runner

    monkeypatch.setattr(runner, "run_one", lambda *a, **k: pytest.fail("trained"))
    assert main(["reproduce", str(make(tmp_path, _records(recorded)[0])), *extra]) == 2
    assert message in capsys.readouterr().err


def test_differences_name_each_place_and_leave_the_clock_out():
    old = {"final": {"score": 0.5, "mcc": float("nan")}, "data": {"a": "x"},
           "history": [{"train_loss": 1.0, "epoch_time_s": 3.0, "train_samples_per_s": 9.0}],
           "method_record": {"cost": {"step_s": 1.0, "step_ratio": 1.2}, "rate": 0.1}}
    new = {"final": {"score": 0.75, "mcc": float("nan")}, "data": {"a": "y"},
           "history": [{"train_loss": 1.0, "epoch_time_s": 4.0, "train_samples_per_s": 8.0}],
           "method_record": {"cost": {"step_s": 2.0, "step_ratio": 1.5}, "rate": 0.1}}
    assert differences(computed(old), computed(new)) == ["data.a: 'x' -> 'y'", "final.score: 0.5 -> 0.75 (+0.25)"]
    assert differences(computed(old), computed(old)) == []  # NaN against NaN is no difference
    assert differences({"h": [1, 2]}, {"h": [1]}) == ["h: 2 entries -> 1"]
    assert differences({"r": 0.8925344918553438}, {"r": 0.892534491855344}, tolerance=1e-12) == []  # seen: numpy's sums
    assert differences({"r": 0.5}, {"r": 0.5 + 1e-9}, tolerance=1e-12) == ["r: 0.5 -> 0.500000001 (+1e-09)"]
