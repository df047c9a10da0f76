"""End to end through the command line on a tiny random BERT and generated GLUE data: records, resume, bad input."""
import dataclasses
import json
import os
from pathlib import Path

import pytest

import suite
from suite.commands import main
from suite.grid.store import Store
from suite.run.settings import RunConfig, TrainSettings


def _run(tiny_bert_dir, glue_dir, out, *extra, methods="vanilla,scores_dropout", tasks="rte,stsb", seeds="1"):
    return main(["run", "--methods", methods, "--tasks", tasks, "--seeds", seeds, "--model", tiny_bert_dir,
                 "--data-dir", glue_dir, "--out", str(out), "--epochs", "2", "--batch-size", "8", "--quiet",
                 *extra])


def _records(out) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((Path(out) / "runs").glob("*.json"))}


def test_run_writes_records_with_curves_and_resumes(tiny_bert_dir, glue_dir, tmp_path, capsys):
    assert _run(tiny_bert_dir, glue_dir, tmp_path) == 0
    recs = _records(tmp_path)
    assert len(recs) == 4
    for rec in recs.values():
        assert rec["status"] == "ok"
        assert [e["epoch"] for e in rec["history"]] == [1, 2]
        for e in rec["history"]:
            assert {"train_loss", "dev_loss", "dev", "train_subset", "epoch_time_s"} <= set(e)
            assert "score" in e["dev"] and "score" in e["train_subset"]
        assert rec["config"]["seed"] == 1 and rec["hash"] in next(n for n in recs if rec["hash"] in n)
        assert {"torch", "transformers", "device", "git_commit"} <= set(rec["environment"])
        assert rec["timing"]["steps"] == 6 and rec["timing"]["peak_memory_mb"] > 0
    stsb = next(r for n, r in recs.items() if n.startswith("stsb"))
    assert {"pearson", "spearman", "score"} <= set(stsb["final"])
    assert "status" in capsys.readouterr().out  # the final status table

    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}
    assert _run(tiny_bert_dir, glue_dir, tmp_path) == 0
    assert "4 skipped" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")} == mtimes
    assert _run(tiny_bert_dir, glue_dir, tmp_path, "--force", methods="vanilla", tasks="rte") == 0
    changed = [p for p, t in mtimes.items() if p.stat().st_mtime_ns != t]
    assert len(changed) == 1 and changed[0].name.startswith("rte__vanilla")


def test_same_seed_same_numbers_on_cpu(tiny_bert_dir, glue_dir, tmp_path):
    _run(tiny_bert_dir, glue_dir, tmp_path / "a", methods="scores_dropout", tasks="mrpc", seeds="7")
    _run(tiny_bert_dir, glue_dir, tmp_path / "b", methods="scores_dropout", tasks="mrpc", seeds="7")
    _run(tiny_bert_dir, glue_dir, tmp_path / "c", methods="scores_dropout", tasks="mrpc", seeds="8")
    a, b, c = (next(iter(_records(tmp_path / x).values())) for x in "abc")
    strip = lambda r: [{k: v for k, v in e.items() if "time" not in k and "per_s" not in k} for e in r["history"]]  # noqa: E731
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)


def test_sweep_and_set(tiny_bert_dir, glue_dir, tmp_path):
    assert _run(tiny_bert_dir, glue_dir, tmp_path, "--sweep", "scores_dropout.p=0.0,0.3", "--set", "train.lr=1e-4",
                "--epochs", "1", methods="vanilla,scores_dropout", tasks="rte") == 0
    recs = list(_records(tmp_path).values())
    assert sorted(r["config"]["hparams"]["p"] for r in recs if r["config"]["method"] == "scores_dropout") == [0.0, 0.3]
    assert all(r["config"]["train"]["lr"] == 1e-4 for r in recs) and len(recs) == 3


@pytest.mark.parametrize("args, message", [
    (["--methods", "nope"], "unknown method 'nope'. Valid methods: "),
    (["--tasks", "sst3"], "unknown task 'sst3'. Valid tasks: "),
    (["--set", "scores_dropout.p=1.2"], "scores_dropout.p=1.2 is impossible"),
    (["--set", "scores_dropout.q=0.2"], "scores_dropout has no hyper-parameter 'q'. Valid: p"),
    (["--sweep", "train.epochs=1,0"], "train.epochs=0 is impossible"),
    (["--set", "train.lr=fast"], "expected a float"),
    (["--methods", "attendout", "--set", "train.precision=fp16"], "attendout computes gradients of its own"),
])
def test_bad_input_exits_2_before_training(tiny_bert_dir, glue_dir, tmp_path, capsys, args, message):
    base = {"--methods": "vanilla,scores_dropout", "--tasks": "rte"}
    for flag in ("--methods", "--tasks"):
        if flag in args:
            base[flag] = args[args.index(flag) + 1]
    extra = [a for i, a in enumerate(args) if a not in base and (i == 0 or args[i - 1] not in base)]
    code = main(["run", "--methods", base["--methods"], "--tasks", base["--tasks"], "--model", tiny_bert_dir,
                 "--data-dir", glue_dir, "--out", str(tmp_path), "--quiet", *extra])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    if "Valid methods" in message:
        assert "scores_dropout" in err and "uniform" in err
    assert not (tmp_path / "runs").exists()


def test_missing_and_malformed_data_exit_2(tiny_bert_dir, glue_dir, tmp_path, capsys):
    code = main(["run", "--methods", "vanilla", "--tasks", "rte,qnli", "--model", tiny_bert_dir,
                 "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path), "--quiet"])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    broken = tmp_path / "glue"
    (broken / "RTE").mkdir(parents=True)
    (broken / "RTE" / "dev.tsv").write_text((Path(glue_dir) / "RTE" / "dev.tsv").read_text())
    code = main(["run", "--methods", "vanilla", "--tasks", "rte", "--model", tiny_bert_dir,
                 "--data-dir", str(broken), "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and f"missing file {broken / 'RTE' / 'train.tsv'}" in err and "hub" in err
    (broken / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\n")
    code = main(["run", "--methods", "vanilla", "--tasks", "rte", "--model", tiny_bert_dir,
                 "--data-dir", str(broken), "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "RTE/train.tsv:2: expected 4 tab-separated fields, found 3" in err


@dataclasses.dataclass
class _NoConfig:
    pass


@suite.register_method("test_nan_in_training")
class NanInTraining(suite.AttentionMethod):
    """Softmax attention that returns NaN while training: a stand-in for a diverging method."""

    Config = _NoConfig

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        probs = suite.softmax(suite.scores(query, key, scaling, attention_mask))
        if module.training:
            probs = probs * float("nan")
        return suite.attend(module, probs, value)


def test_nan_loss_fails_that_run_and_the_grid_goes_on(tiny_bert_dir, glue_dir, tmp_path, capsys):
    code = _run(tiny_bert_dir, glue_dir, tmp_path, methods="test_nan_in_training,vanilla", tasks="rte")
    assert code == 1
    recs = {r["config"]["method"]: r for r in _records(tmp_path).values()}
    assert recs["vanilla"]["status"] == "ok"
    assert recs["test_nan_in_training"]["status"] == "failed"
    assert recs["test_nan_in_training"]["error"].startswith("NonFiniteLoss: training loss became nan")
    assert "failed" in capsys.readouterr().out


def test_interrupt_keeps_finished_records_and_resumes(tiny_bert_dir, glue_dir, tmp_path, monkeypatch):
    import suite.run.runner as runner

    real = runner.train_and_record
    calls = []

    def interrupted_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "train_and_record", interrupted_second)
    assert _run(tiny_bert_dir, glue_dir, tmp_path, methods="vanilla", tasks="rte", seeds="1,2,3") == 130
    first = _records(tmp_path)
    assert len(first) == 1 and next(iter(first.values()))["status"] == "ok"
    assert not list((tmp_path / "runs").glob(".tmp-*"))
    monkeypatch.setattr(runner, "train_and_record", real)
    assert _run(tiny_bert_dir, glue_dir, tmp_path, methods="vanilla", tasks="rte", seeds="1,2,3") == 0
    after = _records(tmp_path)
    assert len(after) == 3 and all(after[n] == r for n, r in first.items())


def _valid_record(score: float, **extra) -> dict:
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())  # a reader holds a record against its own hash
    return {"config": job.to_dict(), "hash": job.hash, "label": "l", "status": "ok",
            "final": {"score": score}, "history": [{"epoch": 1}], **extra}


def test_store_write_is_atomic(tmp_path, monkeypatch):
    store = Store(tmp_path)
    store.write("a.json", _valid_record(0.5))

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        store.write("a.json", _valid_record(0.7))
    monkeypatch.undo()
    assert json.loads(store.path("a.json").read_text()) == _valid_record(0.5)
    assert store.read("a.json").final.score == 0.5
    assert list(store.runs.iterdir()) == [store.runs / "a.json"]
    store.write("b.json", _valid_record(0.5, generalisation_gap=float("nan")))
    assert store.read("b.json").generalisation_gap is None


def test_list_prints_methods_with_defaults_and_tasks(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "scores_dropout" in out and "p=0.1 (float)" in out and "mnli" in out and "accuracy_m" in out
