"""A failed CUDA graph capture never fails a grid (issue 63), checked on the CPU with a capture failure injected
($SUITE_CAPTURE_FAULT makes every capture raise as CUDA's can, and lets a CPU run reach one): the failing process
takes no more jobs, its job runs again eagerly in a fresh one and its record says why; a failed self-test at the
grid's start turns capture off for the whole grid, with one line; the graphs of a run share one memory pool."""
from __future__ import annotations

import contextlib
import json

import pytest
import torch

from suite.grid.executors import run_grid, schedule, workers
from suite.grid.executors.local import LocalPlan
from suite.grid.plan import build_grid
from suite.grid.store import Store
from suite.run.capture import CAPTURE_FAULT_ENV, CaptureFailed, Steps
from suite.run.device import is_capture_failure
from suite.run.settings import TrainSettings

pytestmark = pytest.mark.slow  # the slow tier: `python -m pytest -m slow` (README, Tests)

# 24 rows cut to 8 tokens, batches of 8: every batch has one shape, so the second step captures
SETTINGS = TrainSettings(epochs=1, batch_size=8, max_length=8, precision="fp32")


def _jobs(tiny_bert_dir: str, seeds=(1, 2)):
    return build_grid([tiny_bert_dir], ["rte"], ["vanilla"], list(seeds), SETTINGS)


@pytest.fixture
def capture_fails(monkeypatch, tmp_path):
    monkeypatch.setenv(CAPTURE_FAULT_ENV, "1")
    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("plan", [LocalPlan(1, [{}], "cpu", 1), LocalPlan(0, [], "cpu", 1)],
                         ids=["pool", "in-process"])
def test_a_failed_capture_runs_its_job_again_eagerly_in_a_fresh_process(plan, capture_fails, tiny_bert_dir,
                                                                         glue_dir, tmp_path, monkeypatch, capsys):
    from suite.grid.executors import local

    monkeypatch.setattr(schedule, "capture_self_test", lambda *a, **k: None)  # the self-test passed: runs capture
    monkeypatch.setattr(local, "_CAPTURE_FAILED_HERE", [])  # this test's own: other tests run in this process
    result = run_grid(_jobs(tiny_bert_dir), Store(tmp_path / "out"), glue_dir, executor="local", quiet=True,
                      plan=plan)
    assert result.ok and len(result.done) == 2 and not result.failed
    pids = set()
    for _, rec in result.done:
        assert rec.status == "ok" and rec.timing.mode == "eager"
        reason = rec.timing.step_mode.reason
        assert "CUDA graph capture failed at step 2" in reason and "injected" in reason, reason
        assert "run again in a fresh process with train.capture=off" in reason
        assert rec.config["train"]["capture"] == "off" and rec.executor.attempts in (None, 2)
        pids.add(rec.executor.pid)
    assert len(pids) == 2  # each job's failed capture retired its process: the next job ran in a fresh one
    stored = [json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*.json")]
    assert len(stored) == 2 and all(r["status"] == "ok" and r["timing"]["step_mode"]["mode"] == "eager"
                                    for r in stored)
    retries = [line for line in capsys.readouterr().err.splitlines() if "RETRY" in line]
    assert len(retries) == 2 and all("CUDA graph capture failed" in line for line in retries), retries
    assert local._CAPTURE_FAILED_HERE == ([True] if plan.workers == 0 else [])  # later grids here: in a worker


def test_a_failed_self_test_runs_the_whole_grid_eagerly_with_one_line(capture_fails, tiny_bert_dir, glue_dir,
                                                                      tmp_path, capsys, monkeypatch):
    result = run_grid(_jobs(tiny_bert_dir), Store(tmp_path / "out"), glue_dir, executor="local", quiet=True,
                      plan=LocalPlan(0, [], "cpu", 1))
    assert result.ok and len(result.done) == 2 and not result.failed
    lines = [line for line in capsys.readouterr().err.splitlines() if "self-test" in line]
    assert len(lines) == 1 and "every run of this grid trains eagerly" in lines[0], lines
    for _, rec in result.done:
        assert rec.timing.mode == "eager" and rec.timing.step_mode.reason.startswith("the capture self-test failed")
        assert "injected" in rec.timing.step_mode.reason and rec.executor.attempts in (None, 1)
    entries = list((tmp_path / "cache" / "capture").glob("*.json"))
    assert len(entries) == 1 and json.loads(entries[0].read_text())["ok"] is False
    # the answer is kept: the next grid asks no subprocess
    monkeypatch.setattr(workers, "run_self_test", lambda device: pytest.fail("the cached answer was not used"))
    assert workers.capture_self_test(_jobs(tiny_bert_dir), "cpu").startswith("the capture self-test failed")


def test_the_self_test_runs_only_where_a_job_may_capture_on_a_gpu_here(tiny_bert_dir, monkeypatch):
    monkeypatch.setattr(workers, "run_self_test", lambda device: pytest.fail("no self-test was needed"))
    assert workers.capture_self_test(_jobs(tiny_bert_dir), "cpu") is None  # no GPU, no fault injected
    monkeypatch.setenv(CAPTURE_FAULT_ENV, "1")
    off = [workers.without_capture(j) for j in _jobs(tiny_bert_dir)]
    assert workers.capture_self_test(off, "cpu") is None  # nothing asks for capture
    assert workers.capture_self_test(_jobs(tiny_bert_dir), "cuda", "ray", "10.0.0.5:6379") is None  # not this GPU


def test_the_self_test_captures_a_step_and_fails_as_a_capture_does(monkeypatch):
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        workers.self_test("cpu")
    monkeypatch.setenv(CAPTURE_FAULT_ENV, "1")
    with pytest.raises(CaptureFailed, match="capture failed at step 2") as failed:
        workers.self_test("cpu")
    assert is_capture_failure(f"{type(failed.value).__name__}: {failed.value}")
    assert not is_capture_failure("RuntimeError: CUDA graph capture failed") and not is_capture_failure(None)


def test_a_rerun_is_eager_once_and_only_after_a_failed_capture(tiny_bert_dir):
    job = _jobs(tiny_bert_dir, [1])[0]
    assert workers.rerun_eagerly(job, "CaptureFailed: CUDA graph capture failed at step 2 (x); a grid runs ...")
    assert workers.rerun_eagerly(workers.without_capture(job), "CaptureFailed: CUDA graph capture failed") is None
    assert workers.rerun_eagerly(job, "RuntimeError: boom") is None and workers.rerun_eagerly(job, None) is None
    assert workers.without_capture(job).filename == job.filename  # capture is never hashed: the same record file


class _FakeGraph:
    def replay(self) -> None:
        pass


def test_the_graphs_of_a_run_share_one_memory_pool_and_the_record_counts_it(monkeypatch):
    """Every capture of a run gets the run's one pool handle (so graph memory is the largest shape's, not the sum
    over shapes), and the step facts say what the pool grew by. torch.cuda's calls are stand-ins on the CPU."""
    from test_capture import _batches, _method  # this folder is on sys.path under pytest

    from suite.run.training import build_context
    from suite.testing import tiny_model

    pools, reserved = [], [0]

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None):
        pools.append(pool)
        reserved[0] += 3 * 2**20  # the pool grows by 3 MiB per capture
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved[0])
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    model = tiny_model()
    method = _method("vanilla")
    method.attach(model)
    ctx = build_context(model, method, TrainSettings(lr=1e-3), 40, torch.device("cpu"), None, graphs=True)
    steps = Steps(ctx, None)
    steps.emulate = False  # the real capture path, with the stand-ins above
    for batch in _batches(model.config.vocab_size):
        ctx.step += 1
        steps(batch, None)
    facts = steps.facts()
    assert facts["graphs"] == 3 and len(pools) == 3 and pools[0] is not None
    assert all(p is pools[0] for p in pools)
    assert facts["graph_pool_mb"] == 9.0


class _FakeRay:
    """Ray's calls that `_collect` makes, answered at once: each submitted job's record comes back from `answer`."""

    class exceptions:
        RayError = RuntimeError

    def __init__(self, answer):
        self.answer, self.results = answer, {}

    def cluster_resources(self):
        return {"CPU": 2}

    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:1], refs[1:]

    def get(self, ref):
        return self.results[ref], None

    def submit(self, job):
        ref = object()
        self.results[ref] = self.answer(job)
        return ref


def test_ray_submits_a_job_whose_capture_failed_once_more_with_capture_off(tiny_bert_dir):
    """Ray's collector (stand-ins for Ray's calls): the failed capture's record is not kept; the job is submitted again
    with capture off, and that record, eager with the reason, is the one written."""
    from conftest import fake_ok_record

    from suite.grid.executors.ray import TaskResources, _collect
    from suite.grid.executors.status import GridStatus
    from suite.run.record import RunRecord
    from suite.run.record_parts import Timing

    def answer(job):
        if job.train.capture == "auto":
            return RunRecord.failed(job, "CaptureFailed: CUDA graph capture failed at step 2 (CUDA error: x); a grid "
                                         "runs the job again eagerly")
        rec = fake_ok_record(job)
        rec.timing = Timing.from_json({"step_mode": {"mode": "eager", "reason": "train.capture=off"}})
        return rec

    ray, written = _FakeRay(answer), []
    jobs = _jobs(tiny_bert_dir)
    refs = {ray.submit(job): job for job in jobs}
    _collect(ray, refs, lambda job, rec: written.append((job, rec)), GridStatus(2, quiet=True),
             TaskResources(1, 0), ray.submit)
    assert sorted(job.seed for job, _ in written) == [1, 2]
    for job, rec in written:
        assert rec.ok and job.train.capture == "off" and rec.timing.mode == "eager"
        assert rec.timing.step_mode.reason == ("CUDA graph capture failed at step 2 (CUDA error: x); run again in a "
                                               "fresh process with train.capture=off")


def test_a_cuda_record_keeps_the_peak_memory_its_process_held(monkeypatch):
    """timing.peak_reserved_mb (the graphs' pool and the allocator's cache included) on CUDA only: CPU records keep
    their keys, and an older record without it reads as NaN and is written back without it."""
    import math

    from suite.run import device
    from suite.run.record_parts import Timing

    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 3 * 2**30)
    assert device.peak_reserved_mb(torch.device("cuda")) == {"peak_reserved_mb": 3072.0}
    assert device.peak_reserved_mb(torch.device("cpu")) == {}
    old = Timing.from_json({"train_s": 1.0, "peak_memory_mb": 10.0}, "timing")
    assert math.isnan(old.peak_reserved_mb) and old.to_json() == {"train_s": 1.0, "peak_memory_mb": 10.0}
