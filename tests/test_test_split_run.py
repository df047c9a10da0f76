"""A run with a held-out test split (train.test_holdout) scores it at the end of training, records its score beside
dev's and keeps its per-example predictions in the sidecar; the report scores such runs on it (dev beside) and its
example-level statistics read the held-out predictions; runs without one are read as before."""
import json
import re

import numpy as np
import pytest

from suite.run.record import HELDOUT, RunRecord, heldout_predictions, load_predictions

FLAGS = ["--tasks", "rte", "--methods", "vanilla,drophead", "--seeds", "1,2", "--max-length", "32",
         "--set", "train.test_holdout=8", "--set", "train.holdout=4", "--set", "train.stats_batches=0"]


@pytest.fixture(scope="module")
def heldout_runs(tiny_bert_dir, glue_dir, tmp_path_factory):
    from tests.conftest import run_cli

    out = tmp_path_factory.mktemp("heldout")
    assert run_cli(tiny_bert_dir, glue_dir, out, *FLAGS) == 0
    return out


def _records(out):
    return [(p, RunRecord.from_dict(json.loads(p.read_text()))) for p in sorted((out / "runs").glob("*.json"))]


def test_a_run_records_the_held_out_score_beside_dev_and_keeps_its_predictions(heldout_runs):
    records = _records(heldout_runs)
    assert len(records) == 4 and all(rec.ok for _, rec in records)
    rows = set()
    for path, rec in records:
        assert set(rec.heldout.names) == {"accuracy", "score"} and rec.final.score == rec.history[-1].dev.score
        assert rec.data.heldout == 8 and rec.data.tune == 4 and rec.data.train == 24 - 8 - 4
        assert rec.data.draw.heldout_rows == 8 and rec.heldout_baselines.majority is not None
        assert all("heldout" not in e.unknown for e in rec.history)  # scored once, at the end: no epoch is chosen on it
        dev = load_predictions(path.parent / rec.predictions)
        held = load_predictions(heldout_predictions(path.parent / rec.predictions))
        assert set(dev) == {""} and len(dev[""]["label"]) == 12  # the dev set, as before
        assert set(held) == {""} and held[""]["logits"].shape == (8, 2)
        # each held-out row's carving group (rows of equal text on RTE), and the split's make-up beside dev's
        assert held[""]["group"].shape == (8,) and "group" not in dev[""]
        assert rec.data.draw.heldout_groups == len(set(held[""]["group"].tolist()))
        assert rec.data.draw.heldout_median_words > 0 and rec.data.draw.dev_median_words > 0
        assert np.mean(held[""]["logits"].argmax(1) == held[""]["label"]) == pytest.approx(rec.heldout.get("accuracy"))
        rows.add(tuple(held[""]["index"].tolist()))
    assert len(rows) == 1  # every seed and method: the same train rows
    assert set(next(iter(rows))) <= set(range(24))  # rows of the train split (24 rows)
    assert json.loads(records[0][0].read_text())["config"]["train"]["test_holdout"] == 8


def test_the_report_scores_on_the_held_out_split_and_keeps_dev_beside(heldout_runs):
    from suite.report.load import load
    from suite.stats.evidence import compare_runs, loaded_predictions

    frame = load([heldout_runs]).frame
    assert set(frame["scored_on"]) == {"heldout"}
    for row in frame.itertuples():
        rec = RunRecord.from_dict(json.loads((heldout_runs / "runs" / row.file).read_text()))
        assert row.score == rec.heldout.score and row.dev_score == rec.final.score
        assert row.final.get("accuracy") == rec.heldout.get("accuracy")
        assert row.dev_final.get("accuracy") == rec.final.get("accuracy")
        assert row.baseline.constant == rec.heldout_baselines.majority.score
        assert row.predictions.endswith(f".npz#{HELDOUT}") and row.data.heldout == 8
        assert len(loaded_predictions(row.predictions)[""]["label"]) == 8
    from suite.stats.evidence import RunOutcome

    def outcomes(method):
        return {int(r.seed): RunOutcome(r.score * 100, r.predictions) for r in frame[frame["method"] == method]
                .itertuples()}

    compare_runs("rte", outcomes("drophead"), outcomes("vanilla"))  # reads the held-out sidecars as it reads dev's
    held = [loaded_predictions(p) for p in frame["predictions"]]  # what the example-level statistics resample
    assert all(set(p) == {""} and np.array_equal(p[""]["index"], held[0][""]["index"]) for p in held)


def test_the_report_builds_from_held_out_runs(heldout_runs):
    from suite.report import ReportOptions, build_report
    from suite.report.markdown import unwrap_prose

    md = build_report([heldout_runs], ReportOptions(aso=False, figures=False, allow_uncommitted=True)).read_text()
    text = unwrap_prose(md)   # each paragraph on one line, as it renders
    assert "held-out test 8 (scored)" in text and "Scored on the held-out test split" in text
    draw = _records(heldout_runs)[0][1].data.draw
    assert (f"The held-out split holds 8 rows from {draw.heldout_groups} sources" in text
            and f"a median row of {draw.heldout_median_words:g} words against dev's {draw.dev_median_words:g}"
            in text)
    assert "a held-out test split of the train set as the test set for RTE (train.test_holdout" in text
    assert "dev split as the test set" not in text
    assert re.search(r"\| headline +\| dev +\| seeds", md)  # the dev headline beside the held-out one


def test_a_record_without_it_is_read_on_dev(heldout_runs, tmp_path):
    from suite.report.load import read_row

    path, rec = _records(heldout_runs)[0]
    data = json.loads(path.read_text())
    for key in ("heldout", "heldout_baselines"):
        del data[key]
    (tmp_path / path.name).write_text(json.dumps(data))
    (tmp_path / rec.predictions).write_bytes((path.parent / rec.predictions).read_bytes())
    row = read_row(tmp_path / path.name)
    assert row["scored_on"] == "dev" and row["score"] == row["dev_score"] == rec.final.score
    assert row["predictions"] == str(tmp_path / rec.predictions)
    assert row["baseline"].constant == rec.baselines.majority.score


def test_a_held_out_score_that_is_not_a_number_is_no_record(heldout_runs, tmp_path, capsys):
    from suite.report.load import read_folder

    path, _ = _records(heldout_runs)[0]
    data = json.loads(path.read_text())
    data["heldout"] = {"score": "high"}
    (tmp_path / path.name).write_text(json.dumps(data))
    rows, problems = read_folder(tmp_path)
    assert not rows and "heldout.score" in problems[path.name]


def test_it_is_scored_once_after_the_epoch_is_chosen(tiny_bert_dir, glue_dir, monkeypatch):
    """select_epoch=best and early stopping read the tuning split; the held-out split is scored after the choice,
    by the model the run ends with, and never enters an epoch's entry."""
    from suite.run import training
    from suite.run.runner import TokenizedCache, run_one
    from suite.run.settings import RunConfig, TrainSettings

    calls, evaluate, finish = [], training.evaluate, training.EpochSelection.finish

    def logged_evaluate(model, enc, *args, **kwargs):
        calls.append(("evaluate", len(enc)))
        return evaluate(model, enc, *args, **kwargs)

    def logged_finish(self, *args):
        calls.append(("finish", None))
        return finish(self, *args)

    monkeypatch.setattr(training, "evaluate", logged_evaluate)
    monkeypatch.setattr(training.EpochSelection, "finish", logged_finish)
    t = TrainSettings(epochs=2, batch_size=8, max_length=32, train_eval_samples=0, stats_batches=0, precision="fp32",
                      holdout=5, test_holdout=7, select_epoch="best", early_stopping_patience=1)
    rec = run_one(RunConfig(tiny_bert_dir, "rte", "vanilla", {"p": 0.1}, 1, t), glue_dir, device="cpu", quiet=True,
                  cache=TokenizedCache())
    assert rec.ok, rec.error
    assert calls.count(("evaluate", 7)) == 1 and calls[-2:] == [("finish", None), ("evaluate", 7)]
    assert all(set(e.to_json()) & {"heldout", "heldout_loss"} == set() for e in rec.history)
    assert rec.data.heldout == 7 and rec.prediction_arrays[HELDOUT]["logits"].shape == (7, 2)
