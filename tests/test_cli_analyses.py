"""End-of-run analyses are off unless asked for (`--analyses`, or `train.analyses` in a study or `--set`), and asking
for them never changes a run's hash: the committed records, which ran them, keep theirs."""
import dataclasses
import json
from pathlib import Path

from suite.commands import main
from suite.grid import resolve
from suite.run.settings import RunConfig, TrainSettings

ROOT = Path(__file__).resolve().parents[1]


def test_analyses_are_off_by_default():
    assert TrainSettings().analyses == "none"


def test_asking_for_analyses_keeps_the_hash():
    plain = RunConfig("minilm", "rte", "vanilla", {}, 1, TrainSettings())
    for analyses in ("seeds,heads", "importance"):
        asked = dataclasses.replace(plain, train=dataclasses.replace(plain.train, analyses=analyses,
                                                                     analysis_examples=8))
        assert asked.hash == plain.hash


def test_committed_records_keep_their_hashes_read_back():
    # the study's records (final, tuning) and its budget check's
    folders = [ROOT / "results" / d for d in ("runs", "tuning/runs", "stsb_budget/runs")]
    records = sorted(p for folder in folders for p in folder.glob("*.json"))[::7]
    assert records
    for path in records:
        rec = json.loads(path.read_text())
        assert RunConfig.from_dict(rec["config"]).hash == rec["hash"], path.name


def test_a_record_that_ran_analyses_reads_back_to_the_hash_of_one_that_did_not():
    plain = RunConfig("minilm", "rte", "vanilla", {"p": 0.1}, 1, TrainSettings())
    asked = dataclasses.replace(plain, train=dataclasses.replace(plain.train, analyses="seeds,heads"))
    read_back = RunConfig.from_dict(json.loads(json.dumps(asked.to_dict())))
    assert read_back.train.analyses == "seeds,heads" and read_back.hash == plain.hash


def test_the_analyses_flag_sets_train_analyses(tmp_path, monkeypatch, capsys):
    planned = []

    def plan_grid(request):
        planned.append(plan := real(request))
        return plan

    real = resolve.plan_grid
    monkeypatch.setattr(resolve, "plan_grid", plan_grid)
    argv = ["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--out", str(tmp_path), "--dry-run"]
    assert main(argv) == 0 and main([*argv, "--analyses", "seeds,heads"]) == 0
    assert [p.jobs[0].train.analyses for p in planned] == ["none", "seeds,heads"]
    assert planned[0].jobs[0].filename == planned[1].jobs[0].filename
    assert main([*argv, "--analyses", "seedz"]) == 2 and "Valid: importance, seeds, heads" in capsys.readouterr().err
