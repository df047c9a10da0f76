"""Executors: the same grid gives the same records whoever runs it (in-process, a pool of worker processes, a local
Ray cluster), a grid interrupted under one executor finishes under another, a dead worker's job is run again, and a
run that fails on its own is recorded as failed once. GPU layouts are checked through stand-ins (no GPU in CI)."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import loopback_ns  # this folder is on sys.path under pytest (as conftest is)
import pytest

from suite import commands
from suite.api.attention import METHODS
from suite.api.errors import EXIT_BAD_INPUT, EXIT_TERMINATED
from suite.grid.executors import (
    ExecutorError,
    GridResult,
    GridStatus,
    LocalPlan,
    check_executor,
    local_plan,
    run_grid,
    status_table,
    visible_gpus,
)
from suite.grid.executors.ray import TaskResources
from suite.grid.plan import build_grid
from suite.grid.store import Store
from suite.run.device import wait_env, wait_policy
from suite.run.record import RunRecord
from suite.run.record_parts import Metrics
from suite.run.settings import RunConfig, TrainSettings

TESTS_DIR = str(Path(__file__).resolve().parent)
SETTINGS = TrainSettings(epochs=1, batch_size=8)  # what the command line below produces (quick preset + flags)
METHOD_NAMES, SEEDS = ["vanilla", "scores_dropout"], [1, 2]


def cli_args(model, glue, out, *extra):
    return ["run", "--methods", ",".join(METHOD_NAMES), "--tasks", "rte", "--seeds", ",".join(map(str, SEEDS)),
            "--model", model, "--data-dir", glue, "--epochs", "1", "--batch-size", "8", "--out", str(out),
            # a stated precision: the module-scoped reference grid runs before the per-test fixture hides this CPU's
            # bf16 instructions, so `auto` would name its runs after the real CPU, the Ray grid's after the hidden one
            "--precision", "fp32", "--quiet", *extra]


def records(out) -> dict[str, RunRecord]:
    return {rec.hash: rec for _, rec in Store(out)}


def assert_same_numbers(a: RunRecord, b: RunRecord, tol: float = 1e-5) -> None:
    """Same metrics for the same job: final scores and every epoch's losses and dev metrics."""
    assert a.status == b.status == "ok", (a.error, b.error)
    assert dict(a.final.values) == pytest.approx(dict(b.final.values), abs=tol)
    assert len(a.history) == len(b.history)
    for ea, eb in zip(a.history, b.history):
        for key in ("train_loss", "dev_loss", "train_subset_loss"):
            assert getattr(ea, key) == pytest.approx(getattr(eb, key), rel=tol, abs=tol), key
        assert dict(ea.dev.values) == pytest.approx(dict(eb.dev.values), abs=tol)
        assert dict(ea.train_subset.values) == pytest.approx(dict(eb.train_subset.values), abs=tol)


@pytest.fixture(scope="module")
def sequential(tiny_bert_dir, glue_dir, tmp_path_factory):
    """The reference: the grid run in this process, one job after another."""
    out = tmp_path_factory.mktemp("sequential")
    assert commands.main(cli_args(tiny_bert_dir, glue_dir, out)) == 0
    recs = records(out)
    assert len(recs) == len(METHOD_NAMES) * len(SEEDS)
    assert all(r.executor.name == "local" and r.executor.worker is None for r in recs.values())
    return out, recs


@pytest.fixture(scope="module")
def ray_cluster():
    """One local 2-CPU Ray cluster for the module. Its workers get this folder on PYTHONPATH (for executor_faults),
    as an installed plugin would be importable on a real cluster."""
    ray = pytest.importorskip("ray")
    loopback_ns.require_confined()
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, saved) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def fault_methods():
    import executor_faults  # this folder is on sys.path under pytest (as conftest is)

    for name, cls in executor_faults.METHOD_CLASSES.items():  # again, if an earlier teardown removed them
        METHODS.add(name, cls)
    yield executor_faults
    for name in executor_faults.METHOD_CLASSES:  # keep them out of other tests' `--methods all`
        METHODS.remove(name)


def fault_jobs(tiny_bert_dir, tmp_path) -> tuple[list[RunConfig], Path, Path]:
    dies, raises = tmp_path / "dies_once.attempts", tmp_path / "raises.attempts"
    jobs = build_grid([tiny_bert_dir], ["rte"], ["test_dies_once"], [1], SETTINGS, [f"test_dies_once.marker={dies}"])
    jobs += build_grid([tiny_bert_dir], ["rte"], ["test_raises"], [1], SETTINGS, [f"test_raises.marker={raises}"])
    return jobs, dies, raises


def check_fault_outcome(result, dies: Path, raises: Path) -> None:
    (rec_ok,) = [rec for job, rec in result.done if job.method == "test_dies_once"]
    (job_failed, rec_failed), = result.failed
    assert rec_ok.ok and rec_ok.executor.attempts == 2  # the retry is in the record
    assert len(dies.read_text().splitlines()) == 2  # died once, ran again, finished
    assert job_failed.method == "test_raises" and "this method always fails" in rec_failed.error
    assert len(raises.read_text().splitlines()) == 1  # failed on its own: not retried


# ---------------------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.starts_ray
def test_ray_cli_matches_local_and_resumes_its_grid(ray_cluster, sequential, tiny_bert_dir, glue_dir, tmp_path):
    seq_out, seq = sequential
    # One run finished under the local executor: the Ray grid must skip it and run the other three.
    first = sorted(Path(seq_out, "runs").glob("*.json"))[0]
    Path(tmp_path, "runs").mkdir()
    shutil.copy(first, tmp_path / "runs" / first.name)
    assert commands.main(cli_args(tiny_bert_dir, glue_dir, tmp_path, "--executor", "ray")) == 0
    got = records(tmp_path)
    assert got.keys() == seq.keys()
    ran_on_ray = [h for h, r in got.items() if r.executor.name == "ray"]
    assert len(ran_on_ray) == len(seq) - 1
    for h in seq:
        assert_same_numbers(got[h], seq[h])


@pytest.mark.starts_ray
def test_ray_retries_dead_worker_but_not_failed_run(ray_cluster, fault_methods, tiny_bert_dir, glue_dir, tmp_path):
    jobs, dies, raises = fault_jobs(tiny_bert_dir, tmp_path)
    result = run_grid(jobs, Store(tmp_path / "out"), glue_dir, executor="ray", quiet=True)
    check_fault_outcome(result, dies, raises)


@pytest.mark.starts_ray
def test_ray_ships_data_to_workers(ray_cluster, sequential, tiny_bert_dir, glue_dir, tmp_path):
    """With shipping (the default for --address), workers read a copy sent through the object store."""
    _, seq = sequential
    job = next(RunConfig.from_dict(r.config) for r in seq.values())
    result = run_grid([job], Store(tmp_path), glue_dir, executor="ray", quiet=True, ship=True)
    (_, rec), = result.done
    assert_same_numbers(rec, seq[job.hash])
    # the cluster was started without a wait setting: the task's runtime env brought the driver's (PASSIVE)
    assert rec.env.omp_wait_policy == wait_policy(wait_env()) and rec.env.cpu_threads == "1"


def test_ray_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ExecutorError, match=r"pip install '\.\[ray\]'"):
        check_executor("ray", {})


# ---------------------------------------------------------------------------------------------------------
# local: the worker pool (CPU workers stand in for GPUs) and its layout on GPU machines
# ---------------------------------------------------------------------------------------------------------

def test_local_pool_matches_sequential_and_retries_dead_worker(sequential, fault_methods, tiny_bert_dir, glue_dir,
                                                               tmp_path):
    """Two spawned workers, each given its own CUDA_VISIBLE_DEVICES as on a 2-GPU machine (CPU runs here): the same
    records as in-process; the job whose worker died runs again; the run that fails on its own fails once."""
    _, seq = sequential
    jobs = [RunConfig.from_dict(r.config) for r in seq.values()]
    faults, dies, raises = fault_jobs(tiny_bert_dir, tmp_path)
    plan = LocalPlan(2, [{"CUDA_VISIBLE_DEVICES": "gpu-a"}, {"CUDA_VISIBLE_DEVICES": "gpu-b"}], "cpu", 1)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    result = run_grid(faults + jobs, Store(tmp_path / "out"), glue_dir, executor="local", quiet=True, plan=plan)
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before
    ok = {j.hash: rec for j, rec in result.done}
    for h in seq:
        assert_same_numbers(ok[h], seq[h])
    seen = {(r.executor.worker, r.executor.cuda_visible_devices) for r in ok.values()}
    assert seen == {(0, "gpu-a"), (1, "gpu-b")}
    check_fault_outcome(result, dies, raises)


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: in a container nobody may reap an orphan)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopped_driver_leaves_no_pool_workers(sig, tiny_bert_dir, glue_dir, tmp_path):
    """A scheduler stopping the driver (SIGTERM) gets exit code 143 and no records written for the unfinished runs;
    even a driver killed outright (SIGKILL) leaves no worker running on."""
    marker, out = tmp_path / "hangs.attempts", tmp_path / "out"
    argv = ["run", "--methods", "test_hangs", "--tasks", "rte", "--seeds", "1,2", "--model", tiny_bert_dir,
            "--data-dir", glue_dir, "--epochs", "1", "--out", str(out), "--quiet", "--workers", "2",
            "--set", f"test_hangs.marker={marker}"]
    code = f"import sys, executor_faults; from suite import commands; sys.exit(commands.main({argv!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)}
    driver = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and len(marker.read_text().splitlines()) == 2):  # both workers inside a run
            assert driver.poll() is None and time.monotonic() < deadline, driver.stderr.read() if driver.poll() else ""
            time.sleep(0.2)
        workers = [int(line) for line in marker.read_text().split()]
        driver.send_signal(sig)
        rc = driver.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(pid) for pid in workers), workers
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in [int(line) for line in marker.read_text().split()] if marker.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert rc == EXIT_TERMINATED
        assert "terminated: finished records are kept" in driver.stderr.read()
        assert not list((out / "runs").glob("*.json"))


def test_local_plan_gpu_layouts():
    two = local_plan("auto", gpu_count=2, cpu_count=16, env={})
    assert (two.workers, two.device, two.threads) == (2, "cuda", 8)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in two.envs] == ["0", "1"]
    masked = local_plan("auto", gpu_count=2, cpu_count=16, env={"CUDA_VISIBLE_DEVICES": "3,GPU-5f2"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in masked.envs] == ["3", "GPU-5f2"]
    packed = local_plan("cuda", workers=4, gpu_count=2, cpu_count=16, env={})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in packed.envs] == ["0", "1", "0", "1"]
    assert local_plan("auto", gpu_count=1, env={}).workers == 0          # one GPU: in this process
    assert local_plan("cpu", gpu_count=2, env={}).workers == 0           # --device cpu: GPUs unused
    assert local_plan("cuda:1", gpu_count=0, env={}).workers == 0         # an explicit GPU: in this process
    cpu = local_plan("auto", workers=2, gpu_count=0, cpu_count=2)
    assert (cpu.workers, cpu.device, cpu.threads, cpu.envs) == (2, "cpu", 1, [{}, {}])
    with pytest.raises(ExecutorError, match="no CUDA device"):
        local_plan("cuda", gpu_count=0)
    with pytest.raises(ExecutorError, match="at least 1"):
        local_plan("auto", workers=0, gpu_count=0)
    assert visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "2, 7,9"}) == ["2", "7"]


# ---------------------------------------------------------------------------------------------------------
# Options, status display, hashes
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--executor", "local", "--address", "auto"], "--address does not apply to --executor local"),
    (["--executor", "ray", "--workers", "2"], "--workers does not apply to --executor ray"),
    (["--executor", "ray", "--gpus-per-run", "0"], "--gpus-per-run 0.0: give a value > 0"),
])
def test_cli_rejects_executor_options(extra, message, tiny_bert_dir, glue_dir, tmp_path, capsys):
    assert commands.main(cli_args(tiny_bert_dir, glue_dir, tmp_path, *extra)) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_cli_rejects_an_unknown_executor(tiny_bert_dir, glue_dir, tmp_path, capsys):
    assert commands.main(cli_args(tiny_bert_dir, glue_dir, tmp_path, "--executor", "slurm")) == EXIT_BAD_INPUT
    assert "unknown executor 'slurm'. Valid executors: local, ray" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_grid_status_line():
    stream = io.StringIO()
    status = GridStatus(3, stream=stream)
    job = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS)[0]
    status.started(job)
    status.started(job)
    assert status.line().startswith("0 done, 2 running, 1 pending, 0 failed | ETA ?")
    status.finished_run(job, RunRecord(job.to_dict(), job.hash, job.label, "ok",
                                       final=Metrics.from_json({"score": 0.5}), wall_s=3.0))
    status.finished_run(job, RunRecord.failed(job, "boom"))
    out = stream.getvalue()
    assert "done rte/vanilla/seed1: dev 0.5000" in out and "FAILED rte/vanilla/seed1: boom" in out
    assert "[2/3: 1 done, 0 running, 1 pending, 1 failed | ETA " in out


def test_status_table_lists_every_run():
    done, failed, skipped, stopped = build_grid(["m"], ["rte"], ["vanilla"], [1, 2, 3, 4], SETTINGS)
    ok = RunRecord(done.to_dict(), done.hash, done.label, "ok", final=Metrics.from_json({"score": 0.6251}),
                   wall_s=61.4)
    result = GridResult(done=[(done, ok)], failed=[(failed, RunRecord.failed(failed, "ValueError: boom", wall_s=2.0))],
                        skipped=[skipped], not_run=[stopped])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in status_table(result).splitlines() if line.startswith("| rte/")}
    assert rows == {done.label: ["done", "0.6251", "61s", ""],
                    failed.label: ["failed", "", "2s", "ValueError: boom"],
                    skipped.label: ["skipped", "", "", "record exists"],
                    stopped.label: ["not run", "", "", "interrupted"]}
    assert status_table(result).endswith("1 done, 1 skipped, 1 failed, 1 not run")


def test_ray_task_resources():
    cpu = TaskResources.choose(cluster_gpus=0, device="auto", gpus_per_run=None, cpus_per_run=None)
    assert (cpu.num_cpus, cpu.num_gpus, cpu.device, cpu.threads) == (1, 0, "cpu", 1)
    assert cpu.slots({"CPU": 8.0}, pending=20) == 8
    packed = TaskResources.choose(cluster_gpus=2, device="auto", gpus_per_run=0.5, cpus_per_run=2)
    assert (packed.device, packed.threads) == ("cuda", 2)
    assert packed.slots({"CPU": 16.0, "GPU": 2.0}, pending=20) == 4      # GPUs limit: 2 / 0.5
    assert packed.slots({"CPU": 6.0, "GPU": 2.0}, pending=20) == 3       # CPUs limit: 6 / 2
    assert TaskResources.choose(cluster_gpus=2, device="cpu", gpus_per_run=None, cpus_per_run=None).num_gpus == 0
    with pytest.raises(ExecutorError, match="no GPU"):
        TaskResources.choose(cluster_gpus=0, device="cuda", gpus_per_run=None, cpus_per_run=None)


def test_added_settings_leave_old_hashes_alone():
    import hashlib

    from suite.run.settings import unhashed_at_default

    job = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS)[0]
    old_style = job.to_dict()
    for name in unhashed_at_default():  # records written before these settings existed
        del old_style["train"][name]
    blob = json.dumps(old_style, sort_keys=True, default=str)
    assert job.hash == hashlib.sha256(blob.encode()).hexdigest()[:12]
    compiled = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS, ["train.compile=true"])[0]
    assert compiled.train.compile is True and compiled.hash != job.hash
    assert RunConfig.from_dict(json.loads(json.dumps(old_style))).hash == job.hash


def test_added_method_fields_leave_old_hashes_alone():
    """topk's div/lb came after records of it existed: at their defaults they stay out of the hash."""
    import hashlib

    job = build_grid(["m"], ["rte"], ["topk"], [1], SETTINGS)[0]
    old_style = job.to_dict()
    from suite.run.settings import unhashed_at_default

    for name in unhashed_at_default():
        del old_style["train"][name]
    for name in ("div", "lb"):
        del old_style["hparams"][name]
    assert job.hash == hashlib.sha256(json.dumps(old_style, sort_keys=True, default=str).encode()).hexdigest()[:12]
    changed = build_grid(["m"], ["rte"], ["topk"], [1], SETTINGS, ["topk.div=2"])[0]
    assert changed.hash != job.hash


def test_compile_flag_reaches_the_model(tiny_bert_dir, glue_dir, tmp_path, monkeypatch):
    """--compile sets train.compile and the runner compiles the model in place (compiling itself is stubbed: on CPU
    it takes minutes; the compiled path was checked by hand, see the benchmark notes)."""
    import torch

    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(type(self).__name__))
    args = cli_args(tiny_bert_dir, glue_dir, tmp_path, "--compile")
    args[args.index("--methods") + 1], args[args.index("--seeds") + 1] = "vanilla", "1"
    assert commands.main(args) == 0
    (rec,) = records(tmp_path).values()
    assert rec.ok and rec.config["train"]["compile"] is True
    assert compiled == ["BertForSequenceClassification"]


def test_gpu_runs_get_a_fresh_ray_worker_process_and_cpu_runs_may_share_one():
    ray = pytest.importorskip("ray")
    from suite.grid.executors.ray import TaskResources, declared_task

    def max_calls(task):  # what the RemoteFunction was declared with (Ray keeps it in _default_options)
        return task._default_options.get("max_calls")

    assert max_calls(declared_task(ray, TaskResources(1, 0.5))) == 1
    assert max_calls(declared_task(ray, TaskResources(1, 1))) == 1
    assert not max_calls(declared_task(ray, TaskResources(1, 0)))  # no limit


def test_the_stop_handlers_survive_a_library_that_replaces_them():
    """ray.init installs a SIGTERM handler of its own, which aborted the driver with 134 instead of stopping it."""
    import signal

    from suite.grid.executors.ray import kept_signal_handlers

    def ours(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        with kept_signal_handlers():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what ray.init does to the driver
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------------------------------------
# What a GPU worker meets: a broken CUDA context, outputs that must come home, retries to report
# ---------------------------------------------------------------------------------------------------------

def test_pool_worker_with_a_broken_cuda_context_is_replaced(tiny_bert_dir, glue_dir, tmp_path):
    """After an error that leaves CUDA unusable (faked on CPU) the worker exits; the job runs again on a fresh worker
    and the next job is not sent to the broken one."""
    import gpu_faults  # this folder is on sys.path under pytest (as conftest is); spawned workers inherit it

    if "test_cuda_breaks_once" not in METHODS:  # again, if an earlier run of this test removed it
        METHODS.add("test_cuda_breaks_once", gpu_faults.CudaBreaksOnce)
    try:
        marker = tmp_path / "cuda.attempts"
        jobs = build_grid([tiny_bert_dir], ["rte"], ["test_cuda_breaks_once"], [1, 2], SETTINGS,
                          [f"test_cuda_breaks_once.marker={marker}"])
        result = run_grid(jobs, Store(tmp_path / "out"), glue_dir, executor="local", quiet=True,
                          plan=LocalPlan(1, [{}], "cpu", 1))
    finally:
        METHODS.remove("test_cuda_breaks_once")  # keep it out of other tests' `--methods all`
    assert len(result.done) == 2 and not result.failed
    pids = marker.read_text().split()
    assert len(pids) == 3 and pids[0] != pids[1] == pids[2]  # broken worker replaced; the new one ran both
    attempts = sorted(rec.executor.attempts for _, rec in result.done)
    assert attempts == [1, 2]


@pytest.mark.starts_ray
def test_ray_ships_the_test_split_and_brings_every_output_home(ray_cluster, tiny_bert_dir, glue_dir, tmp_path):
    """--predict-test and --save-model on workers without the driver's folders (ship=True, as for --address): the
    test split travels with the data, and the model folder and test predictions come back into the driver's output
    folder before the record is written, so the record's artifacts name files that exist."""
    import dataclasses

    from suite.run.outputs import RunOutputs

    data = tmp_path / "glue"
    shutil.copytree(glue_dir, data)
    (data / "RTE" / "test.tsv").write_text("index\tsentence1\tsentence2\n"
                                           + "".join(f"{i}\tthe cat sat\ta dog ran\n" for i in range(5)))
    out = tmp_path / "out"
    outputs = RunOutputs(str(out), save_model=True, predict_test=True)
    job = dataclasses.replace(build_grid([tiny_bert_dir], ["rte"], ["vanilla"], [1], SETTINGS)[0], outputs=outputs)
    result = run_grid([job], Store(out), data, executor="ray", quiet=True, ship=True)
    (_, rec), = result.done
    stem = job.filename[:-len(".json")]
    assert rec.artifacts.model == f"{stem}.model" and rec.artifacts.test_sets_absent is None
    assert rec.artifacts.test_predictions == {"RTE": f"{stem}.test/RTE.tsv"}
    runs = out / "runs"
    assert (runs / f"{stem}.model" / "config.json").is_file()
    assert len((runs / f"{stem}.test" / "RTE.tsv").read_text().splitlines()) == 6
    assert rec.executor.outputs_returned == (f"runs/{stem}.model", f"runs/{stem}.test")
    assert json.loads((runs / job.filename).read_text())["artifacts"] == rec.artifacts.to_json()


def test_outputs_that_cannot_come_back_are_refused_before_running():
    from suite.grid.executors.returned import check_outputs_can_come_back
    from suite.run.outputs import RunOutputs

    jobs = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS)
    import dataclasses

    tracked = [dataclasses.replace(jobs[0], outputs=RunOutputs("out", report_to=("mlflow",)))]
    with pytest.raises(ExecutorError, match="MLFLOW_TRACKING_URI to a tracking server"):
        check_outputs_can_come_back(tracked, env={})
    with pytest.raises(ExecutorError, match="not a server"):
        check_outputs_can_come_back(tracked, env={"MLFLOW_TRACKING_URI": "sqlite:///x.db"})
    assert check_outputs_can_come_back(tracked, env={"MLFLOW_TRACKING_URI": "http://h:5000"}) == {
        "MLFLOW_TRACKING_URI": "http://h:5000"}
    assert check_outputs_can_come_back(jobs, env={}) == {}


def test_returned_outputs_replace_an_earlier_copy(tmp_path):
    from suite.grid.executors.returned import pack, unpack

    worker, driver = tmp_path / "worker", tmp_path / "driver"
    (worker / "runs" / "a.model").mkdir(parents=True)
    (worker / "runs" / "a.model" / "w.bin").write_bytes(b"new")
    (worker / "tracking" / "tensorboard" / "a").mkdir(parents=True)
    (worker / "tracking" / "tensorboard" / "a" / "events").write_bytes(b"e")
    (worker / "tracking" / "mlflow.db").write_bytes(b"one store for all runs: never copied over the driver's")
    (driver / "runs" / "a.model").mkdir(parents=True)
    (driver / "runs" / "a.model" / "stale.bin").write_bytes(b"old")
    blob = pack(worker)
    assert not worker.exists()
    assert unpack(blob, driver) == ["runs/a.model", "tracking/tensorboard/a"]
    assert (driver / "runs" / "a.model" / "w.bin").read_bytes() == b"new"
    assert not (driver / "runs" / "a.model" / "stale.bin").exists()
    assert not (driver / "tracking" / "mlflow.db").exists()


def test_workers_auto_packs_runs_by_cores_and_memory():
    from suite.grid.executors.local import AUTO_MAX_WORKERS, RUN_CPU_BYTES, RUN_GPU_BYTES

    h100 = local_plan("auto", workers="auto", gpu_count=1, cpu_count=16, env={}, memory=80 * 2**30)
    assert h100.workers == AUTO_MAX_WORKERS and h100.memory_fraction == 1 / AUTO_MAX_WORKERS
    assert all(e == {"CUDA_VISIBLE_DEVICES": "0"} for e in h100.envs) and h100.threads == 2
    assert local_plan("auto", workers="auto", gpu_count=1, cpu_count=16, env={},
                      memory=3 * RUN_GPU_BYTES).workers == 3                 # the GPU's memory bounds it
    assert local_plan("auto", workers="auto", gpu_count=2, cpu_count=6, env={},
                      memory=80 * 2**30).workers == 6                        # three cores per GPU: 3 + 3
    assert local_plan("auto", workers="auto", gpu_count=1, cpu_count=1, env={},
                      memory=80 * 2**30).workers == 0                        # one fits: in this process
    cpu = local_plan("cpu", workers="auto", gpu_count=0, cpu_count=2, memory=24 * 2**30)
    assert cpu.workers == 2 and cpu.threads == 1                            # this project's 2-core machine
    assert local_plan("cpu", workers="auto", gpu_count=0, cpu_count=32,
                      memory=4 * RUN_CPU_BYTES).workers == 4


def test_workers_flag_takes_auto_and_refuses_words(capsys):
    from suite.commands import main

    with pytest.raises(SystemExit) as exc:
        main(["run", "--workers", "many", "--dry-run"])
    assert exc.value.code == 2 and "give a number of worker processes or auto" in capsys.readouterr().err


def test_the_eta_learns_each_task_s_step_cost_from_the_folder_and_its_tuning_runs(tmp_path, monkeypatch):
    """A study's final stage weighs its steps by its tuning runs' and its own earlier records' seconds per step, per
    model, task and settings, the fastest run of each (the least disturbed), on the device kind most records ran on;
    failed runs stay out, and a large folder is read every n-th file, so that every task is sampled."""
    from test_report import make_record

    from suite.grid.executors import schedule
    from suite.grid.executors.status import step_kind
    from suite.grid.store import Store
    from suite.run.settings import RunConfig

    final, tuning = Store(tmp_path), Store(tmp_path / "tuning")
    metrics = {"mrpc": {"f1": 0.8, "accuracy": 0.8}, "cola": {"mcc": 0.3}}
    for store, task, seed, wall, extra in ((tuning, "mrpc", 1, 12.0, {}), (tuning, "mrpc", 2, 14.0, {}),
                                           (final, "cola", 3, 2.0, {}), (tuning, "cola", 1, 3.0, {}),
                                           (tuning, "cola", 2, 0.5, {"status": "failed"}),   # never the fastest
                                           (final, "mrpc", 5, 1.0, {"env": {"device": "cuda"}})):
        name, rec = make_record(task, "vanilla", seed, metrics[task], **{k: v for k, v in extra.items() if k == "env"})
        if extra.get("status") == "failed":
            rec = {**rec, "status": "failed", "error": "boom"}
        store.write(name, {**rec, "wall_s": wall})           # make_record: 10 steps
    jobs = {task: RunConfig.from_dict(make_record(task, "vanilla", 1, metrics[task])[1]["config"])
            for task in ("mrpc", "cola")}
    got = schedule.earlier_step_seconds(final)
    assert got == {step_kind(jobs["mrpc"]): 1.2, step_kind(jobs["cola"]): 0.2}   # the CPU's 4 against 1 GPU record
    assert schedule.earlier_step_seconds(Store(tmp_path / "empty")) == {}
    monkeypatch.setattr(schedule, "EARLIER_RECORDS", 2)   # tuning's 4 files: every 2nd by name, not the first 2
    assert set(schedule.earlier_step_seconds(final)) == {step_kind(jobs["mrpc"]), step_kind(jobs["cola"])}
