"""Faults in what the suite reads back and writes into: links planted in the output folder are never written
through; a malformed test set stops --predict-test before training; `report` and `predict` answer broken records,
sidecars, checkpoints and output folders with one line naming the file (never a traceback)."""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from conftest import fake_ok_record, run_cli

from suite import commands
from suite.api.errors import EXIT_BAD_INPUT
from suite.grid.store import Store
from suite.run.settings import RunConfig, TrainSettings

TEST_ROWS = 6
needs_links = pytest.mark.skipif(not hasattr(os, "symlink"), reason="symbolic links")


def _write_rte_test(data: Path, rows: list[str] | None = None) -> Path:
    path = data / "RTE" / "test.tsv"
    rows = rows if rows is not None else [f"{i}\tthe cat sat\ta dog ran" for i in range(TEST_ROWS)]
    path.write_text("\n".join(["index\tsentence1\tsentence2", *rows]) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tiny_bert_dir, glue_dir, tmp_path_factory) -> tuple[Path, Path, Path]:
    """One tiny run with --save-model and --predict-test: (data folder, output folder, its record)."""
    root = tmp_path_factory.mktemp("faults")
    data = root / "glue"
    shutil.copytree(glue_dir, data)
    _write_rte_test(data)
    out = root / "out"
    assert run_cli(tiny_bert_dir, str(data), out, "--save-model", "--predict-test", "--max-length", "32") == 0
    return data, out, next((out / "runs").glob("*.json"))


@pytest.fixture
def no_training(monkeypatch):
    def run_one(job, *args, **kwargs):
        raise AssertionError(f"{job.label} was trained although its input is impossible")

    monkeypatch.setattr("suite.run.runner.run_one", run_one)


def _one_line_error(capsys, rc: int, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err
    return err


# ---------------------------------------------------------------------------------------------------------
# Links planted in the output folder
# ---------------------------------------------------------------------------------------------------------

def _link_test_file(runs: Path, stem: str, outside: Path) -> None:
    (runs / f"{stem}.test" / "RTE.tsv").unlink()
    (runs / f"{stem}.test" / "RTE.tsv").symlink_to(outside / "precious.txt")


def _link_test_folder(runs: Path, stem: str, outside: Path) -> None:
    shutil.rmtree(runs / f"{stem}.test")
    (runs / f"{stem}.test").symlink_to(outside, target_is_directory=True)


def _link_model_folder(runs: Path, stem: str, outside: Path) -> None:
    shutil.rmtree(runs / f"{stem}.model")
    (runs / f"{stem}.model").symlink_to(outside, target_is_directory=True)


def _link_record(runs: Path, stem: str, outside: Path) -> None:
    (runs / f"{stem}.json").unlink()
    (runs / f"{stem}.json").symlink_to(outside / "precious.txt")


def _link_sidecar(runs: Path, stem: str, outside: Path) -> None:
    (runs / f"{stem}.predictions.npz").unlink()
    (runs / f"{stem}.predictions.npz").symlink_to(outside / "precious.txt")


# two runs plant them all: a linked test-predictions folder excludes a link inside it
PLANTED = {"test file, model folder, record and sidecar": (_link_test_file, _link_model_folder, _link_record,
                                                           _link_sidecar),
           "test predictions folder": (_link_test_folder,)}


@needs_links
@pytest.mark.parametrize("plants", list(PLANTED.values()), ids=list(PLANTED))
def test_outputs_replace_planted_links_and_never_write_through_them(plants, trained, tiny_bert_dir, tmp_path):
    data, first_out, record = trained
    out, outside = tmp_path / "out", tmp_path / "outside"
    shutil.copytree(first_out, out, symlinks=True)
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me\n")
    for plant in plants:
        plant(out / "runs", record.stem, outside)
    assert run_cli(tiny_bert_dir, str(data), out, "--save-model", "--predict-test", "--max-length", "32",
                   "--force") == 0
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]
    assert (outside / "precious.txt").read_text() == "keep me\n"
    for name in ("test", "model", "json", "predictions.npz"):
        assert not (out / "runs" / f"{record.stem}.{name}").is_symlink()
    submission = out / "runs" / f"{record.stem}.test" / "RTE.tsv"
    assert not submission.is_symlink() and len(submission.read_text().splitlines()) == TEST_ROWS + 1


@needs_links
def test_a_commands_file_linked_out_of_the_output_folder_exits_2(trained, tiny_bert_dir, no_training, tmp_path,
                                                                  capsys):
    data, _, _ = trained
    out, target = tmp_path / "out", tmp_path / "elsewhere.txt"
    out.mkdir()
    target.write_text("keep me\n")
    (out / "commands.txt").symlink_to(target)
    rc = run_cli(tiny_bert_dir, str(data), out)
    _one_line_error(capsys, rc, f"{out / 'commands.txt'} is a symbolic link", "remove the link")
    assert target.read_text() == "keep me\n"


# ---------------------------------------------------------------------------------------------------------
# A malformed test set: found before training
# ---------------------------------------------------------------------------------------------------------

BAD_TEST_FILES = {
    "index zero": ([f"{i}\ta\tb" for i in range(3)] + ["zero\ta\tb"], ":5: index 'zero' is not an integer"),
    "empty index": (["0\ta\tb", "\ta\tb"], ":3: index '' is not an integer"),
    "extra field": (["0\ta\tb", "1\ta\tb\tc\td"], ":3: expected 3 tab-separated fields, found 5"),
}


@pytest.mark.parametrize("rows,message", list(BAD_TEST_FILES.values()), ids=list(BAD_TEST_FILES))
def test_a_malformed_test_set_stops_predict_test_before_training(rows, message, tiny_bert_dir, glue_dir,
                                                                 no_training, tmp_path, capsys):
    data = tmp_path / "glue"
    shutil.copytree(Path(glue_dir) / "RTE", data / "RTE")
    path = _write_rte_test(data, rows)
    rc = run_cli(tiny_bert_dir, str(data), tmp_path / "out", "--predict-test")
    _one_line_error(capsys, rc, f"{path}{message}")


# ---------------------------------------------------------------------------------------------------------
# report: broken records and sidecars are skipped with a line naming them
# ---------------------------------------------------------------------------------------------------------

def _job(seed: int) -> RunConfig:
    return RunConfig("m", "rte", "vanilla", {}, seed, TrainSettings())


def _edit(**changes):
    def spoil(runs: Path) -> str:
        path = runs / _job(3).filename
        data = json.loads(path.read_text())
        for dotted, value in changes.items():
            *parents, last = dotted.split(".")
            target = data
            for part in parents:
                target = target[part]
            target[last] = value
        path.write_text(json.dumps(data))
        return path.name
    return spoil


def _truncated_sidecar(runs: Path) -> str:
    sidecar = runs / "seed3.predictions.npz"
    import numpy as np

    np.savez_compressed(sidecar, **{"dev/index": np.arange(4), "dev/label": np.zeros(4, int),
                                    "dev/logits": np.zeros((4, 2))})
    sidecar.write_bytes(sidecar.read_bytes()[:-40])
    _edit(predictions=sidecar.name)(runs)
    return sidecar.name


def _dangling_link(runs: Path) -> str:
    (runs / "annexed.json").symlink_to(runs / ".git" / "annex" / "missing")
    return "annexed.json"


def _unreadable(runs: Path) -> str:
    (runs / _job(3).filename).chmod(0)
    return _job(3).filename


def _permission_denied(runs: Path) -> str:
    """Another user's 0600 record, as root sees no such thing: reading it raises PermissionError."""
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == _job(3).filename:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    _permission_denied.patch.setattr(Path, "read_text", read_text)
    return _job(3).filename


def _folder(runs: Path) -> str:
    (runs / "x.json").mkdir()
    return "x.json"


def _deep(runs: Path) -> str:
    (runs / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    return "deep.json"


def _commands_not_text(runs: Path) -> str:
    (runs.parent / "commands.txt").write_bytes(b"\xff\xfe\x00python -m suite")
    return "commands.txt"


REPORT_FAULTS = {
    "truncated sidecar": _truncated_sidecar, "dangling record link": _dangling_link, "folder named x.json": _folder,
    "deeply nested JSON": _deep, "hparams a list": _edit(**{"config.hparams": [1]}),
    "train a string": _edit(**{"config.train": "fast"}), "history of numbers": _edit(history=[1, 2]),
    "final a list": _edit(final=[0.5], status="failed"), "score a string": _edit(**{"final.score": "0.5"}),
    "timing a list": _edit(timing=[1]), "environment a string": _edit(environment="x"),
    "attention a list": _edit(attention=[]), "version a string": _edit(version="2"),
    "seed a dict": _edit(**{"config.seed": {}}), "dev metrics a list": _edit(history=[{"epoch": 1, "dev": [0.5]}]),
    "permission denied": _permission_denied, "commands.txt not text": _commands_not_text,
}
if hasattr(os, "geteuid") and os.geteuid() != 0:  # root reads files of any mode
    REPORT_FAULTS["unreadable record"] = _unreadable


@pytest.mark.parametrize("spoil", list(REPORT_FAULTS.values()), ids=list(REPORT_FAULTS))
def test_report_skips_a_broken_record_or_sidecar_with_a_line_naming_it(spoil, tmp_path, capsys, monkeypatch):
    _permission_denied.patch = monkeypatch
    store = Store(tmp_path / "runs-out")
    for seed in (1, 2, 3):
        store.write(_job(seed).filename, fake_ok_record(_job(seed)))
    named = spoil(store.runs)
    rc = commands.main(["report", str(store.root), "--no-figures", "--no-aso", "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if named in line and "warning" in line], err
    assert (tmp_path / "rep" / "leaderboard.md").is_file()


def test_report_out_a_file_exits_2_with_one_line(tmp_path, capsys):
    store = Store(tmp_path / "runs-out")
    store.write(_job(1).filename, fake_ok_record(_job(1)))
    (tmp_path / "file").write_text("x")
    rc = commands.main(["report", str(store.root), "--no-figures", "--out", str(tmp_path / "file")])
    _one_line_error(capsys, rc, f"--out {tmp_path / 'file'} is a file")


# ---------------------------------------------------------------------------------------------------------
# predict: broken records and checkpoints
# ---------------------------------------------------------------------------------------------------------

def _predict_record(record: Path, model: Path, out: Path) -> Path:
    return record


def _malformed_record(record: Path, model: Path, tmp: Path) -> tuple[Path, str]:
    bad = tmp / "run.json"
    bad.write_text("[1, 2")
    return bad, "not a readable run record"


def _record_as_list(record: Path, model: Path, tmp: Path) -> tuple[Path, str]:
    bad = tmp / "run.json"
    bad.write_text("[1, 2]")
    return bad, "not a readable run record"


def _description(text: str, message: str):
    def spoil(record: Path, model: Path, tmp: Path) -> tuple[Path, str]:
        (model / "suite_run.json").write_text(text)
        return model, message
    return spoil


def _newer_suite(record: Path, model: Path, tmp: Path) -> tuple[Path, str]:
    info = json.loads((model / "suite_run.json").read_text())
    info["config"]["sharding"] = "tensor"  # a field a later suite added
    (model / "suite_run.json").write_text(json.dumps(info))
    return model, "written by a newer suite"


def _truncated_weights(record: Path, model: Path, tmp: Path) -> tuple[Path, str]:
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return model, "model.safetensors differ from what the run saved"  # its digest, before any byte is parsed


def _undigested(spoil):
    """The same fault in a checkpoint saved before checkpoints held digests: the loader's own defences answer it."""
    def older(record: Path, model: Path, tmp: Path) -> tuple[Path, str]:
        given, message = spoil(record, model, tmp)
        info = json.loads((model / "suite_run.json").read_text())
        del info["files"]
        (model / "suite_run.json").write_text(json.dumps(info))
        return given, message
    return older


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _pickled_weights(record: Path, model: Path, tmp: Path) -> tuple[Path, str]:
    (model / "model.safetensors").unlink()
    with open(model / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"weight": Payload()}, fh)
    return model, "refused (torch.load weights_only)"


PREDICT_FAULTS = {
    "malformed record": _malformed_record, "record a JSON list": _record_as_list,
    "description not JSON": _description("{", "not a readable checkpoint description"),
    "description without config": _description('{"cfg": {}}', "not a checkpoint description"),
    "description config a list": _description('{"config": []}', "not a checkpoint description"),
    "checkpoint from a newer suite": _newer_suite, "truncated safetensors": _truncated_weights,
    "truncated safetensors, no digests": _undigested(lambda r, m, t: (_truncated_weights(r, m, t)[0],
                                                                       "cannot load the saved model")),
    "malicious pytorch_model.bin": lambda r, m, t: (_pickled_weights(r, m, t)[0], "model.safetensors, "
                                                    "pytorch_model.bin differ from what the run saved"),
    "malicious pytorch_model.bin, no digests": _undigested(_pickled_weights),
}


@pytest.mark.parametrize("spoil", list(PREDICT_FAULTS.values()), ids=list(PREDICT_FAULTS))
def test_predict_answers_broken_checkpoints_with_one_line(spoil, trained, tmp_path, capsys):
    data, first_out, record = trained
    model = tmp_path / "ckpt"
    shutil.copytree(first_out / "runs" / f"{record.stem}.model", model)
    given, message = spoil(record, model, tmp_path)
    rc = commands.main(["predict", str(given), "--data-dir", str(data), "--out", str(tmp_path / "sub")])
    err = _one_line_error(capsys, rc, message)
    assert "pwned" not in capsys.readouterr().out + err


def test_predict_out_a_file_exits_2(trained, tmp_path, capsys):
    data, _, record = trained
    (tmp_path / "file").write_text("x")
    rc = commands.main(["predict", str(record), "--data-dir", str(data), "--out", str(tmp_path / "file")])
    _one_line_error(capsys, rc, f"--out {tmp_path / 'file'}")


# ---------------------------------------------------------------------------------------------------------
# A pool worker that never comes back: the per-run time limit
# ---------------------------------------------------------------------------------------------------------

def test_a_run_past_the_pool_time_limit_is_recorded_failed_and_the_grid_goes_on(tiny_bert_dir, glue_dir, tmp_path,
                                                                                   monkeypatch):
    """A worker that never returns (stopped with SIGSTOP, hung) held the grid forever; with $SUITE_MAX_RUN_MINUTES
    its run is recorded as failed with the reason and the next job runs on a fresh worker."""
    import executor_faults  # spawned workers import it by name (this folder is on their sys.path)

    from suite.api.attention import METHODS
    from suite.grid.executors import run_grid
    from suite.grid.executors.local import LocalPlan
    from suite.grid.plan import build_grid

    for name, cls in executor_faults.METHOD_CLASSES.items():  # an earlier test's teardown may have removed them
        if name not in METHODS:
            METHODS.add(name, cls)
    monkeypatch.setenv("SUITE_MAX_RUN_MINUTES", "0.05")
    settings = TrainSettings(epochs=1, batch_size=8)
    jobs = [job for seed in (1, 2) for job in build_grid([tiny_bert_dir], ["rte"], ["test_hangs"], [seed], settings,
                                                           [f"test_hangs.marker={tmp_path / 'attempts'}"])]
    try:
        result = run_grid(jobs, Store(tmp_path / "out"), glue_dir, executor="local", quiet=True,
                          plan=LocalPlan(1, [{}], "cpu", 1))
    finally:
        for name in executor_faults.METHOD_CLASSES:  # keep them out of other tests' `--methods all`
            METHODS.remove(name)
    assert sorted(j.seed for j, _ in result.failed) == [1, 2] and not result.done
    for _, rec in result.failed:
        assert rec.error.startswith("TimeLimit: the run took longer than 0.05 minutes"), rec.error
    stored = [json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*.json")]
    assert len(stored) == 2 and all(r["status"] == "failed" and "SUITE_MAX_RUN_MINUTES" in r["error"] for r in stored)


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_an_impossible_pool_time_limit_is_refused(value, monkeypatch):
    """One rule for the environment variable and the flag."""
    from suite.api.errors import ExecutorError
    from suite.grid.executors.pool import max_run_seconds

    monkeypatch.setenv("SUITE_MAX_RUN_MINUTES", value)
    with pytest.raises(ExecutorError, match="SUITE_MAX_RUN_MINUTES"):
        max_run_seconds()
    monkeypatch.delenv("SUITE_MAX_RUN_MINUTES")
    if value != "abc":
        with pytest.raises(ExecutorError, match="--max-run-minutes"):
            max_run_seconds(float(value))


def test_the_time_limit_counts_the_run_not_the_workers_start(tiny_bert_dir, glue_dir, tmp_path, monkeypatch):
    """A worker that takes longer to start (imports) than the limit still runs its short job: the clock starts when
    the worker begins the job. It used to kill healthy runs as over time."""
    from suite.api.attention import METHODS
    from suite.grid.executors import run_grid
    from suite.grid.plan import build_grid

    monkeypatch.setattr("time.sleep", lambda s: None)  # this process imports the module fast; workers do not
    import slow_start_method  # noqa: F401  registers test_slow_start here; spawned workers import it by name

    monkeypatch.undo()
    monkeypatch.delenv("SUITE_MAX_RUN_MINUTES", raising=False)
    jobs = build_grid([tiny_bert_dir], ["rte"], ["test_slow_start"], [1], TrainSettings(epochs=1, batch_size=8))
    try:  # 15 s for the run (2-3 on an idle machine, 9+ under load); the worker's import alone takes 20 s
        result = run_grid(jobs, Store(tmp_path / "out"), glue_dir, executor="local", quiet=True, device="cpu",
                          max_run_minutes=0.25)
    finally:
        METHODS.remove("test_slow_start")
    assert [j.seed for j, _ in result.done] == [1] and not result.failed, result.failed


def test_the_time_limit_flag_runs_even_one_worker_as_a_pool_and_stops_a_hung_run(tiny_bert_dir, glue_dir, tmp_path,
                                                                                   monkeypatch):
    """--max-run-minutes (the flag, no environment variable): with the default single worker the grid used to run
    in its own process, where no run can be stopped; the limit makes it a pool of one."""
    import executor_faults

    from suite.api.attention import METHODS
    from suite.grid.executors import run_grid
    from suite.grid.plan import build_grid

    for name, cls in executor_faults.METHOD_CLASSES.items():
        if name not in METHODS:
            METHODS.add(name, cls)
    monkeypatch.delenv("SUITE_MAX_RUN_MINUTES", raising=False)
    settings = TrainSettings(epochs=1, batch_size=8)
    jobs = build_grid([tiny_bert_dir], ["rte"], ["test_hangs"], [1], settings,
                      [f"test_hangs.marker={tmp_path / 'attempts'}"])
    try:
        result = run_grid(jobs, Store(tmp_path / "out"), glue_dir, executor="local", quiet=True, device="cpu",
                          max_run_minutes=0.05)
    finally:
        for name in executor_faults.METHOD_CLASSES:
            METHODS.remove(name)
    assert [j.seed for j, _ in result.failed] == [1] and not result.done
    assert "--max-run-minutes" in result.failed[0][1].error


def test_an_impossible_time_limit_flag_exits_2(tiny_bert_dir, glue_dir, tmp_path, capsys):
    from conftest import run_cli

    assert run_cli(tiny_bert_dir, glue_dir, tmp_path / "out", "--max-run-minutes", "-1") == 2
    assert "--max-run-minutes -1" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["host:notaport", "justhost", "host:0", "ray://:10001"])
def test_a_malformed_ray_address_is_refused_with_the_forms_it_takes(address):
    from suite.api.errors import ExecutorError
    from suite.grid.executors.ray import check_address

    with pytest.raises(ExecutorError, match="give auto, HOST:PORT"):
        check_address(address)


def test_a_ray_address_where_nothing_listens_is_refused_at_once():
    """Ray itself kept the driver waiting for minutes."""
    import socket
    import time

    from suite.api.errors import ExecutorError
    from suite.grid.executors.ray import check_address

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ExecutorError, match=f"127.0.0.1:{port}: nothing answers there"):
        check_address(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 30


def test_a_stop_signal_inside_ray_wait_is_the_stop_not_a_system_error():
    """A SIGTERM's exception raised inside ray.wait's compiled code came out as a raw SystemError (exit 1, not 143)."""
    from types import SimpleNamespace

    from suite.api.errors import Terminated
    from suite.grid.executors.ray import TaskResources, _collect
    from suite.grid.executors.status import GridStatus
    from suite.run import stopping

    def wait(refs, num_returns, timeout):
        stopping._requested = Terminated  # what the SIGTERM handler records before its exception is mangled
        raise SystemError("<built-in method wait> returned a result with an exception set")

    fake = SimpleNamespace(wait=wait, cluster_resources=lambda: {"CPU": 2.0})
    try:
        with pytest.raises(Terminated):
            _collect(fake, {"ref": None}, lambda job, rec: None, GridStatus(1, quiet=True), TaskResources(0, 1))
    finally:
        stopping._requested = None


def test_stopping_the_pool_kills_a_worker_that_sigterm_cannot_stop():
    """A driver SIGTERMed while its only worker was SIGSTOPped waited forever: SIGTERM stays pending on a stopped
    process, and multiprocessing's exit joins its children. The pool's stop waits a bounded time, then kills."""
    import multiprocessing as mp
    import signal
    import time

    from suite.grid.executors import pool

    proc = mp.get_context("fork").Process(target=time.sleep, args=(120,), daemon=True)
    proc.start()
    os.kill(proc.pid, signal.SIGSTOP)
    stopper = pool.WorkerPool.__new__(pool.WorkerPool)
    stopper.procs, stopper.inboxes, stopper.running = {0: proc}, {0: mp.get_context("fork").Queue()}, {0: 0}
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pool, "STOP_GRACE_S", 0.5)
        stopper._stop_workers()
    assert not proc.is_alive() and proc.exitcode == -signal.SIGKILL
    assert time.monotonic() - started < 10
