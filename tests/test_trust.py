"""What a reader trusts is checked (issue 67): every record is held against its own hash, its numbers are bounded as
they are parsed, a special file at a record's name is refused without being read, a file the reader refuses is set
aside (kept, named) before a rerun replaces it, and `run --dry-run` counts and refuses what the real run does."""
from __future__ import annotations

import json
import os
import signal
import warnings

import pytest
from conftest import fake_ok_record, run_cli

from suite.api.errors import EXIT_BAD_INPUT
from suite.commands import main
from suite.grid.executors import pending_jobs
from suite.grid.store import Store
from suite.report.load import load
from suite.run.record import InvalidRecord, read_record, record_files
from suite.run.settings import RunConfig, TrainSettings

JOB = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings(precision="fp32"))


def _stored(tmp_path, edit=None, job: RunConfig = JOB) -> tuple[Store, dict]:
    """A store holding the ok record of `job`, its JSON passed through `edit` (a hand edit) when given."""
    store = Store(tmp_path)
    data = fake_ok_record(job).to_dict()
    if edit is not None:
        edit(data)
    store.write(job.filename, data)
    return store, data


# ---------------------------------------------------------------------------------------------------------
# A record against its own hash
# ---------------------------------------------------------------------------------------------------------

def _task_renamed(data):
    data["config"]["task"] = "nosuchtask"  # the hash and the file name left alone


def _setting_changed(data):
    data["config"]["train"]["lr"] = 0.5


def _hash_of_another_job(data):
    data["hash"] = RunConfig("m", "rte", "vanilla", {}, 2, TrainSettings(precision="fp32")).hash


@pytest.mark.parametrize("edit", [_task_renamed, _setting_changed, _hash_of_another_job])
def test_a_record_whose_config_is_not_its_hash_is_no_record_to_any_reader(edit, tmp_path, capsys):
    store, _ = _stored(tmp_path, edit)
    with pytest.raises(InvalidRecord, match=r"its config \(.*\) hashes to [0-9a-f]{12}, not to the hash it holds"):
        read_record(store.path(JOB.filename))
    with pytest.warns(UserWarning, match="its job counts as not done"):
        todo, skipped = pending_jobs([JOB], store, force=False)
    assert todo == [JOB] and skipped == []   # the job is not done: it runs (and the file is set aside first)
    other = RunConfig("m", "rte", "vanilla", {}, 3, TrainSettings(precision="fp32"))
    Store(tmp_path).write(other.filename, fake_ok_record(other))
    loaded = load([tmp_path])
    assert list(loaded.frame["task"]) == ["rte"] and list(loaded.frame["seed"]) == [3]   # no nosuchtask column
    assert loaded.unreadable == [JOB.filename]
    err = capsys.readouterr().err
    assert f"skipped {store.path(JOB.filename)}: its config" in err and len(err.strip().splitlines()) == 1


def test_a_config_no_job_has_is_named(tmp_path):
    store, _ = _stored(tmp_path, lambda d: d["config"].pop("train"))
    with pytest.raises(InvalidRecord, match="its config is not a job this suite can rebuild"):
        read_record(store.path(JOB.filename))


def test_every_published_record_holds_its_own_hash():
    """The published records pass: today's rules give their hashes, or (the analyses runs, written while the
    settings that change no number were hashed) the earlier rule does."""
    from pathlib import Path

    folders = sorted(p for p in (Path(__file__).resolve().parents[1] / "results").rglob("runs") if p.is_dir())
    files = [f for folder in folders for f in record_files(folder)]
    assert len(files) > 900
    for path in files:
        read_record(path, unscored=True)


# ---------------------------------------------------------------------------------------------------------
# Numbers bounded as they are parsed
# ---------------------------------------------------------------------------------------------------------

HUGE = {
    "an integer past Python's digit limit": ("1" * 5000, "an integer of 5000 digits"),
    "a 400-digit integer score": ("9" * 400, "an integer of 400 digits"),
    "a 400-digit decimal score": ("9" * 400 + ".5", "beyond a float's range"),
    "a score of 1e999": ("1e999", "the number 1e999, beyond a float's range"),
}


@pytest.mark.parametrize("number, says", list(HUGE.values()), ids=list(HUGE))
@pytest.mark.parametrize("where", ["final.score", "wall_s", "an unknown key"])
def test_a_number_no_record_holds_is_not_a_record_naming_the_file(number, says, where, tmp_path):
    store, data = _stored(tmp_path)
    text = json.dumps(data)
    target = {"final.score": '"score": 0.5', "wall_s": '"wall_s": 0.0', "an unknown key": '"hash"'}[where]
    replaced = {"final.score": f'"score": {number}', "wall_s": f'"wall_s": {number}',
                "an unknown key": f'"extra": {number}, "hash"'}[where]
    store.path(JOB.filename).write_text(text.replace(target, replaced, 1))
    with pytest.raises(InvalidRecord, match=f"{JOB.filename}: not a run record: it holds .*{says}"):
        read_record(store.path(JOB.filename))


def test_report_and_dry_run_name_such_a_record_and_go_on(tmp_path, glue_dir, tiny_bert_dir, capsys, monkeypatch):
    """It stopped `run` (even --dry-run) and `report` with "a fault of the suite", exit 1."""
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: fake_ok_record(job))
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, "--seeds", "1,2") == 0
    first = sorted(record_files(tmp_path / "runs"))[0]
    first.write_text(first.read_text().replace('"wall_s": 0.0', '"wall_s": ' + "7" * 5000))
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--no-figures", "--no-aso", "--allow-uncommitted"]) == 0
    err = capsys.readouterr().err
    assert "an integer of 5000 digits" in err and "fault of the suite" not in err
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, "--seeds", "1,2", "--dry-run") == 0
    out, err = capsys.readouterr()
    assert "1 have ok records" in out and "1 would run" in out and "fault of the suite" not in err


# ---------------------------------------------------------------------------------------------------------
# Special files at a record's name
# ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def no_hang():
    """A test that would hang (a FIFO read) fails after 60 s instead."""
    def hung(*_):
        raise TimeoutError("hung on a special file")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


def test_a_fifo_at_a_records_name_is_refused_without_hanging(tmp_path, no_hang):
    store = Store(tmp_path)
    store.runs.mkdir(parents=True)
    os.mkfifo(store.path(JOB.filename))   # nothing ever writes to it: reading it would wait forever
    with pytest.raises(InvalidRecord, match="not a regular file \\(a FIFO\\)"):
        read_record(store.path(JOB.filename))
    with pytest.warns(UserWarning, match="a FIFO"):
        assert pending_jobs([JOB], store, force=False)[0] == [JOB]
    other = RunConfig("m", "rte", "vanilla", {}, 2, TrainSettings(precision="fp32"))
    store.write(other.filename, fake_ok_record(other))
    assert load([tmp_path]).unreadable == [JOB.filename]
    with pytest.warns(UserWarning, match="set aside as"):
        store.write(JOB.filename, fake_ok_record(JOB))   # the FIFO is moved aside, never opened
    assert read_record(store.path(JOB.filename)).ok
    assert [p.name for p in store.runs.glob("*refused*")] == [JOB.filename[:-5] + ".refused-1.json"]


# ---------------------------------------------------------------------------------------------------------
# A refused record is set aside, never replaced
# ---------------------------------------------------------------------------------------------------------

def test_a_refused_record_and_its_sidecar_are_set_aside_before_the_rerun_replaces_them(tmp_path):
    store, _ = _stored(tmp_path, _task_renamed)
    (store.path(JOB.filename[:-5] + ".predictions.npz")).write_bytes(b"the old arrays")
    before = store.path(JOB.filename).read_bytes()
    for n in (1, 2):   # a second refused file goes beside the first, never over it
        with pytest.warns(UserWarning) as said:
            store.write(JOB.filename, fake_ok_record(JOB) if n == 2 else json.loads(before))
        aside = store.path(f"{JOB.filename[:-5]}.refused-{n}.json")
        assert aside.read_bytes() == before and f"set aside as {aside.name}" in str(said[-1].message)
        assert str(store.path(JOB.filename)) in str(said[-1].message)
    assert store.path(f"{JOB.filename[:-5]}.refused-1.predictions.npz").read_bytes() == b"the old arrays"
    assert read_record(store.path(JOB.filename)).ok
    assert [p.name for p in record_files(store.runs)] == [JOB.filename]   # set-aside files are no records


def test_a_record_that_reads_is_replaced_as_asked_without_a_copy(tmp_path):
    """--force and a failed run's rerun replace a valid record: nothing is set aside."""
    store, _ = _stored(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.write(JOB.filename, fake_ok_record(JOB))
    assert not list(store.runs.glob("*refused*"))


def test_a_rerun_keeps_the_hand_edited_record(tiny_bert_dir, glue_dir, tmp_path, monkeypatch):
    """The whole command: the edited record is kept beside the new one."""
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: fake_ok_record(job))
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path) == 0
    path = next(p for p in record_files(tmp_path / "runs"))
    data = json.loads(path.read_text())
    data["config"]["task"] = "nosuchtask"
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="set aside as"):
        assert run_cli(tiny_bert_dir, glue_dir, tmp_path) == 0
    assert json.loads(path.with_name(path.name[:-5] + ".refused-1.json").read_text()) == data
    assert read_record(path).task == "rte"


# ---------------------------------------------------------------------------------------------------------
# One validation for the dry run and the real run
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, says", [
    (["--workers", "0"], "--workers 0: give a value > 0"),
    (["--workers", "-1"], "--workers -1: give a value > 0"),
    (["--set", "train.holdout=100000"], "train.holdout=100000 gives a tuning split of 100000"),
], ids=["workers 0", "workers -1", "holdout beyond the rows"])
@pytest.mark.parametrize("dry", [True, False], ids=["dry run", "real run"])
def test_the_dry_run_refuses_what_the_real_run_refuses(flags, says, dry, tiny_bert_dir, glue_dir, tmp_path, capsys,
                                                        monkeypatch):
    monkeypatch.setattr("suite.run.runner.run_one", lambda *a, **k: pytest.fail("trained"))
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, *flags, *(["--dry-run"] if dry else [])) == EXIT_BAD_INPUT
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("kept, named", [("newer", "newer than this suite reads"),
                                         ("another job's", "holds the record of another job")])
def test_the_dry_run_counts_a_kept_record_as_the_real_run_skips_it(kept, named, tiny_bert_dir, glue_dir, tmp_path,
                                                                   capsys, monkeypatch):
    """The dry run said "would run" of both; the real run keeps and skips them."""
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: fake_ok_record(job))
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, "--seeds", "1,2") == 0
    first, second = sorted(record_files(tmp_path / "runs"), key=lambda p: "seed2" in p.name)
    data = json.loads(first.read_text())
    if kept == "newer":
        first.write_text(json.dumps({**data, "version": 99}))
    else:   # a valid record of another job, copied under this job's name
        first.write_bytes(second.read_bytes())
    capsys.readouterr()
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, "--seeds", "1,2", "--dry-run") == 0
    out, err = capsys.readouterr()
    assert "1 have ok records (skipped unless --force), 1 kept records (skipped even with --force), 0 would run" \
        in out and named in err
    monkeypatch.setattr("suite.run.runner.run_one", lambda *a, **k: pytest.fail("trained"))
    with pytest.warns(UserWarning, match=named):
        assert run_cli(tiny_bert_dir, glue_dir, tmp_path, "--seeds", "1,2") == 0


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch, capsys):
    """ENOSPC from a write or fsync carries no file name: the message named none."""
    import errno

    from suite.commands.boundary import failure
    from suite.grid.store import atomic_write

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as raised:
        atomic_write(tmp_path / "until_decided.json", lambda fh: fh.write(b"{}"))
    line, _ = failure(raised.value, "run")
    assert f"{tmp_path / 'until_decided.json'}: No space left on device (ENOSPC)" in line
    assert list(tmp_path.iterdir()) == []   # its temporary file is gone too


def test_a_swapped_predictions_sidecar_is_named_and_not_read(tmp_path, capsys):
    """The record holds its sidecar's sha256: a sidecar copied over from another run went unnoticed."""
    import hashlib

    import numpy as np

    store, paths = Store(tmp_path), {}
    for seed in (1, 2):
        job = RunConfig("m", "rte", "vanilla", {}, seed, TrainSettings(precision="fp32"))
        rec = fake_ok_record(job)
        rec.prediction_arrays = {"": {"index": np.arange(4), "label": np.array([0, 1, 0, 1]),
                                      "logits": np.full((4, 2), float(seed))}}
        store.write(job.filename, rec)
        written = read_record(store.path(job.filename))
        sidecar = store.path(written.predictions)
        assert written.predictions_sha256 == hashlib.sha256(sidecar.read_bytes()).hexdigest()
        paths[seed] = sidecar
    assert all(load([tmp_path]).frame["predictions"])   # both read while they are their own
    paths[1].write_bytes(paths[2].read_bytes())   # run 2's predictions under run 1's name
    capsys.readouterr()
    frame = load([tmp_path]).frame.set_index("seed")
    assert frame.loc[1, "predictions"] == "" and frame.loc[2, "predictions"] != ""
    err = capsys.readouterr().err
    assert f"{paths[1]}: predictions file unreadable (ValueError: its sha256 is not the one its record holds" in err


def test_a_fifo_sidecar_is_named_without_hanging(tmp_path, capsys, no_hang):
    import numpy as np

    store = Store(tmp_path)
    rec = fake_ok_record(JOB)
    rec.prediction_arrays = {"": {"index": np.arange(2), "label": np.array([0, 1]), "logits": np.zeros((2, 2))}}
    store.write(JOB.filename, rec)
    sidecar = store.path(read_record(store.path(JOB.filename)).predictions)
    sidecar.unlink()
    os.mkfifo(sidecar)
    assert load([tmp_path]).frame["predictions"].tolist() == [""]
    assert f"{sidecar}: predictions file unreadable (ValueError: not a regular file)" in capsys.readouterr().err
