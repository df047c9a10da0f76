"""Finished records are never lost or wrong: a diverged model is never recorded as ok; a record that cannot be
written stops the grid without losing it; invalid record files count as not done; repeated seeds and sweep values are
one job; SIGTERM stops the sequential executor with exit 143 and no record of the interrupted run; two grids into one
folder never train the same job at the same time."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fake_ok_record, run_cli

from suite.api.errors import EXIT_FAILED_RUNS, EXIT_TERMINATED
from suite.grid.executors import pending_jobs
from suite.grid.plan import build_grid
from suite.grid.store import Store
from suite.report.load import load
from suite.run.settings import RunConfig, TrainSettings, canonical_model, default_model

TESTS_DIR = str(Path(__file__).resolve().parent)


# ---------------------------------------------------------------------------------------------------------
# A full disk, file modes
# ---------------------------------------------------------------------------------------------------------

def test_full_disk_stops_the_grid_and_keeps_every_record(tiny_bert_dir, glue_dir, tmp_path, monkeypatch, capsys):
    """The second record cannot be written (ENOSPC): it is kept in a fallback file, the grid stops with exit 1 and a
    message saying where the record is, and the first record is intact."""
    import suite.grid.store

    trained = []
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: trained.append(job) or fake_ok_record(job))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    real_write, writes = suite.grid.store.atomic_write, []

    def atomic_write(target, write):
        writes.append(target)
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(target, write)

    monkeypatch.setattr(suite.grid.store, "atomic_write", atomic_write)
    out = tmp_path / "out"
    rc = run_cli(tiny_bert_dir, glue_dir, out, "--seeds", "1,2,3")
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED_RUNS and "No space left on device" in err and "the grid stopped" in err, err
    assert len(trained) == 2  # the third job was not started
    first, second = trained
    assert Store(out).read(first.filename).hash == first.hash
    kept = tmp_path / "tmp" / "suite-unsaved-records" / second.filename
    assert str(kept) in err and json.loads(kept.read_text())["hash"] == second.hash
    assert not (out / "runs" / second.filename).exists()


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symbolic links")
def test_the_fallback_copy_never_writes_through_a_link_in_the_shared_temporary_folder(tmp_path, monkeypatch):
    """Another user of a shared /tmp can plant a link at the fallback file's name: it is replaced, never followed."""
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp" / "suite-unsaved-records").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "tmp" / "suite-unsaved-records" / job.filename).symlink_to(victim)
    store = Store(tmp_path / "out")
    store.root.write_text("a file where the output folder should be")  # the record cannot be written
    with pytest.raises(OSError, match="The record was kept in"):
        store.write(job.filename, fake_ok_record(job))
    kept = tmp_path / "tmp" / "suite-unsaved-records" / job.filename
    assert victim.read_text() == "keep me\n" and not kept.is_symlink()
    assert json.loads(kept.read_text())["hash"] == job.hash


def test_records_are_readable_like_other_files(tmp_path):
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    old = os.umask(0o022)
    try:
        path = Store(tmp_path).write(job.filename, fake_ok_record(job))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


# ---------------------------------------------------------------------------------------------------------
# Records that are not records
# ---------------------------------------------------------------------------------------------------------

INVALID_RECORDS = {"list": "[]", "status only": '{"status": "ok"}', "not json": "{", "ok without score":
                   '{"config": {"task": "rte", "method": "vanilla", "seed": 1}, "hash": "h", "label": "l", '
                   '"status": "ok", "final": {"score": null}, "history": [{}]}',
                   "deeply nested JSON": "[" * 100_000 + "]" * 100_000}


@pytest.mark.parametrize("content", list(INVALID_RECORDS.values()), ids=list(INVALID_RECORDS))
def test_invalid_record_counts_as_not_done_and_is_named(content, tmp_path):
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    store = Store(tmp_path)
    store.runs.mkdir(parents=True)
    store.path(job.filename).write_text(content)
    with pytest.warns(UserWarning, match=job.filename):
        todo, skipped = pending_jobs([job], store, force=False)
    assert todo == [job] and skipped == []


def test_a_record_from_a_newer_suite_is_kept_and_its_job_skipped(tmp_path):
    """A newer suite's record is a finished run this suite cannot read: never retrained over, even with --force."""
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    store = Store(tmp_path)
    newer = {**fake_ok_record(job).to_dict(), "version": 99}
    store.runs.mkdir(parents=True)
    store.path(job.filename).write_text(json.dumps(newer))
    for force in (False, True):
        with pytest.warns(UserWarning, match="newer than this suite reads.*move the file away"):
            todo, skipped = pending_jobs([job], store, force=force)
        assert todo == [] and skipped == [job]
    assert json.loads(store.path(job.filename).read_text())["version"] == 99


def test_a_record_this_process_cannot_open_is_kept_and_its_job_skipped(tmp_path, monkeypatch):
    """Another user's record (mode 0600 in a shared folder): skipped with the reason, not replaced."""
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    store = Store(tmp_path)
    store.write(job.filename, fake_ok_record(job))
    real_read = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == job.filename:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.warns(UserWarning, match="cannot be read .*Permission denied.*fix its permissions"):
        todo, skipped = pending_jobs([job], store, force=False)
    assert todo == [] and skipped == [job]


def test_a_record_of_another_job_under_this_jobs_name_is_kept_and_the_job_not_done(tmp_path):
    """A record copied or renamed by hand: its contents (hash) are another job's. Resume used to read only its
    status and skip this job forever; now the file is kept untouched, the job is not counted as done, and the
    warning names both jobs."""
    job, other = (RunConfig("m", "rte", "vanilla", {}, seed, TrainSettings()) for seed in (1, 2))
    store = Store(tmp_path)
    store.write(job.filename, fake_ok_record(other))
    before = store.path(job.filename).read_bytes()
    with pytest.warns(UserWarning, match=f"holds the record of another job .*{other.hash}.*rename or move it"):
        todo, skipped = pending_jobs([job], store, force=False)
    assert todo == [] and skipped == [job]
    with pytest.warns(UserWarning, match="another job"):
        assert store.status(job.filename) is None  # not shown as done (dry run, summaries)
    assert store.path(job.filename).read_bytes() == before


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symbolic links")
def test_a_planted_claims_link_is_replaced_never_followed(tmp_path):
    """A dangling `.claims` link used to create a file outside the output folder."""
    outside = tmp_path / "outside" / "claims"
    outside.parent.mkdir()
    store = Store(tmp_path / "out")
    store.runs.mkdir(parents=True)
    (store.runs / ".claims").symlink_to(outside)
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    with store.claims() as claims:
        assert claims.claim([job]) == ([job], [])
    assert not outside.exists() and not (store.runs / ".claims").is_symlink()


def test_report_skips_invalid_records_and_temporary_files(tmp_path):
    jobs = [RunConfig("m", "rte", "vanilla", {}, seed, TrainSettings()) for seed in (1, 2)]
    store = Store(tmp_path)
    for job in jobs:
        store.write(job.filename, fake_ok_record(job))
    (store.runs / "list.json").write_text("[]")
    (store.runs / "status-only.json").write_text('{"status": "ok"}')
    (store.runs / ".tmp-abc123.json").write_text(json.dumps(fake_ok_record(jobs[0]).to_dict()))
    loaded = load([tmp_path])
    assert len(loaded.frame) == 2
    assert loaded.unreadable == ["list.json", "status-only.json"]
    with pytest.warns(UserWarning) as caught:
        assert len(list(store)) == 2
    warned = " ".join(str(w.message) for w in caught)
    assert "list.json" in warned and "status-only.json" in warned and ".tmp-" not in warned


# ---------------------------------------------------------------------------------------------------------
# Duplicate work
# ---------------------------------------------------------------------------------------------------------

def test_repeated_seeds_and_sweep_values_are_one_job_each():
    t = TrainSettings()
    assert len(build_grid(["m"], ["rte"], ["vanilla"], [1, 1, 2], t)) == 2
    assert len(build_grid(["m"], ["rte"], ["scores_dropout"], [1], t, sweeps=["scores_dropout.p=0.1,0.1"])) == 1
    assert len(build_grid(["m"], ["rte"], ["vanilla"], [1], t, sweeps=["train.lr=1e-5,1e-5,2e-5"])) == 2


def test_one_model_has_one_name(tiny_bert_dir, tmp_path, monkeypatch):
    packaged = default_model()
    assert {canonical_model(m) for m in ("minilm", packaged, packaged + "/", " minilm ")} == {"minilm"}
    monkeypatch.chdir(Path(tiny_bert_dir).parent)
    name = Path(tiny_bert_dir).name
    assert len({canonical_model(m) for m in (name, name + "/", "./" + name, "./" + name + "//")}) == 1


# ---------------------------------------------------------------------------------------------------------
# A diverged model is a failed run, never an ok record
# ---------------------------------------------------------------------------------------------------------

def test_diverged_model_is_recorded_as_failed(tiny_bert_dir, glue_dir):
    from suite.run.runner import run_one

    t = TrainSettings(epochs=1, batch_size=8, max_train_samples=8, lr=1e10, train_eval_samples=4, stats_batches=0)
    rec = run_one(RunConfig(tiny_bert_dir, "rte", "vanilla", {}, 1, t), glue_dir, device="cpu", quiet=True)
    assert rec.status == "failed" and "NonFiniteLoss" in rec.error, rec.error


# ---------------------------------------------------------------------------------------------------------
# SIGTERM on the sequential executor, and two grids into one folder
# ---------------------------------------------------------------------------------------------------------

def _cli_process(argv: list[str], **popen) -> subprocess.Popen:
    code = f"import sys, executor_faults; from suite import commands; sys.exit(commands.main({argv!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or sys.platform == "win32", reason="POSIX signals and locks")
def test_second_grid_skips_claimed_jobs_and_sigterm_exits_143(tiny_bert_dir, glue_dir, tmp_path):
    """Grid A (sequential, the default) hangs inside its first run. Grid B, the same command into the same folder,
    skips both jobs A has claimed instead of training them a second time. SIGTERM then stops A with exit 143 and
    records nothing for the interrupted run."""
    marker, out = tmp_path / "hangs.attempts", tmp_path / "out"
    argv = ["run", "--methods", "test_hangs", "--tasks", "rte", "--seeds", "1,2", "--model", tiny_bert_dir,
            "--data-dir", glue_dir, "--epochs", "1", "--out", str(out), "--quiet",
            "--set", f"test_hangs.marker={marker}"]
    first = _cli_process(argv)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():  # A is inside its first run
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else ""
            time.sleep(0.2)
        second = _cli_process(argv, stdout=subprocess.PIPE)
        try:
            _, second_err = second.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                second.kill()
        assert second.returncode == 0, second_err
        assert "2 run(s) are being run by another grid" in second_err, second_err
        assert len(marker.read_text().splitlines()) == 1  # B started neither job
        first.send_signal(signal.SIGTERM)
        rc = first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert rc == EXIT_TERMINATED
    assert "terminated: finished records are kept" in first.stderr.read()
    assert not list((out / "runs").glob("*.json"))
    assert len(marker.read_text().splitlines()) == 1  # A did not go on to its second job


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX record locks")
def test_claims_are_exclusive_between_processes_and_die_with_their_holder(tmp_path):
    jobs = [RunConfig("m", "rte", "vanilla", {}, seed, TrainSettings()) for seed in (1, 2, 3)]
    code = ("import sys, time, types; from suite.grid.store import Store\n"  # light imports: jobs by hash only
            "jobs = [types.SimpleNamespace(hash=h) for h in sys.argv[2:]]\n"
            "claims = Store(sys.argv[1]).claims(); mine, _ = claims.claim(jobs); print(len(mine), flush=True)\n"
            "time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), *(j.hash for j in jobs[:2])],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "2"
        with Store(tmp_path).claims() as claims:
            mine, elsewhere = claims.claim(jobs)
        assert mine == jobs[2:] and elsewhere == jobs[:2]
    finally:
        holder.kill()
        holder.wait()
    with Store(tmp_path).claims() as claims:  # the holder is gone (killed, not closed): its claims went with it
        assert claims.claim(jobs) == (jobs, [])


class _ReaderGone:
    """stdout of `... | head` once head has exited: every write fails with a broken pipe."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self):
        return False


def test_a_closed_stdout_pipe_never_fails_a_run(tiny_bert_dir, glue_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdout", _ReaderGone())
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, "--sweep", "train.lr=1e-4,2e-4") == 0
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json")]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)


def test_a_sigterm_swallowed_inside_a_destructor_still_stops_the_run():
    """Python discards an exception raised inside `__del__` (a tokenizer's regex objects, at tokenisation): the stop
    request is kept and raised again at the next check, between batches."""
    import gc

    from suite.api.errors import Terminated
    from suite.run import stopping

    class Collected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, and its exception is discarded

    with stopping.stop_signals():
        item = Collected()
        del item
        gc.collect()
        with pytest.raises(Terminated):
            stopping.check()
    stopping.check()  # outside the context nothing is pending any more
