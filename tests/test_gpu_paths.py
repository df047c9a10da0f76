"""CUDA code paths checked on CPU: precision `auto` resolved before hashing, native-bf16 detection, TF32 and the
deterministic setting, the memory cap of runs sharing a GPU, an out-of-memory error run once more, a sticky CUDA error
recognised, host syncs gone from the step, the MFU peak table. CUDA calls are stand-ins (no GPU here)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import set_cpu_bf16
from torch.cuda._utils import _get_device_index

import suite
from suite.api.errors import BadInput
from suite.grid.plan import build_grid
from suite.run import device as dev
from suite.run.settings import TrainSettings

SETTINGS = TrainSettings(epochs=1, batch_size=8)


def _fake_gpus(monkeypatch, capability=(8, 0), count=1):
    monkeypatch.setattr(dev, "pick_device", lambda name="auto": torch.device("cpu" if name == "cpu" else "cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: capability)


def test_auto_precision_is_resolved_before_the_hash(monkeypatch, capsys):
    auto = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS)  # precision auto (the default)
    # padding `auto` is resolved with it: the longest row on a CPU, buckets on a GPU
    fp32 = build_grid(["m"], ["rte"], ["vanilla"], [1], dataclasses.replace(SETTINGS, precision="fp32",
                                                                           pad_to="longest"))
    bf16 = build_grid(["m"], ["rte"], ["vanilla"], [1], dataclasses.replace(SETTINGS, precision="bf16",
                                                                           pad_to="buckets"))
    (on_cpu,) = dev.resolve_jobs_precision(auto, "cpu")
    assert on_cpu.train.precision == "fp32" and on_cpu.filename == fp32[0].filename
    _fake_gpus(monkeypatch, capability=(9, 0))
    (on_gpu,) = dev.resolve_jobs_precision(auto, "auto")
    assert on_gpu.train.precision == "bf16" and on_gpu.filename == bf16[0].filename != on_cpu.filename
    assert dev.resolve_jobs_precision(fp32, "auto") == fp32  # explicit precisions stay as they are


def test_auto_precision_avoids_emulated_bf16(monkeypatch, capsys):
    """A V100 or T4 (compute capability 7.x) would emulate bf16: auto trains in fp32 there, and says so."""
    _fake_gpus(monkeypatch, capability=(7, 5), count=2)
    (job,) = dev.resolve_jobs_precision(build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS), "auto")
    assert job.train.precision == "fp32"
    assert "no native bf16" in capsys.readouterr().err
    assert dev.resolve_precision("auto", "cuda", bf16_ok=False)[0] == "fp32"
    assert dev.resolve_precision("auto", "cuda", bf16_ok=True) == ("bf16", None)
    assert dev.autocast_dtype("auto", torch.device("cpu")) is None  # conftest: a CPU without bf16 instructions


@pytest.mark.parametrize("native", [True, False], ids=["amx-or-avx512-bf16", "avx2"])
def test_auto_precision_on_cpu_is_bf16_only_where_native(monkeypatch, capsys, native):
    """Emulated bf16 (no AVX512-BF16 or AMX) made a MiniLM-sized matmul 8-95x slower than fp32 on an AVX2 CPU: `auto`
    (the quick preset's precision) trains in bf16 only where the CPU computes it natively, and says nothing."""
    set_cpu_bf16(monkeypatch, native)
    want = "bf16" if native else "fp32"
    (job,) = dev.resolve_jobs_precision(build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS), "cpu")
    assert job.train.precision == want and capsys.readouterr().err == ""
    assert dev.autocast_dtype("auto", torch.device("cpu")) == dev.AUTOCAST_DTYPES[want]
    # the CPUs of a remote Ray cluster cannot be seen from the driver: fp32 there, whatever the driver has
    (remote,) = dev.resolve_jobs_precision(build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS), "cpu",
                                           executor="ray", address="10.0.0.1:6379")
    assert remote.train.precision == "fp32"
    from suite.run.settings import PRESETS

    assert PRESETS.get("quick").train["precision"] == "auto"


def test_auto_precision_on_a_remote_ray_cluster_must_be_explicit():
    jobs = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS)
    with pytest.raises(BadInput, match="--precision bf16"):
        dev.resolve_jobs_precision(jobs, "auto", executor="ray", address="10.0.0.1:6379")
    (job,) = dev.resolve_jobs_precision(jobs, "cpu", executor="ray", address="10.0.0.1:6379")
    assert job.train.precision == "fp32"


def test_auto_padding_on_a_remote_ray_cluster_needs_its_device_named():
    """A remote cluster's padding was guessed as a GPU's (buckets), so `--replay --executor ray --address` of a grid
    run on CPUs renamed every job, found none of its records and rewrote a decided state as open."""
    import dataclasses

    jobs = build_grid(["m"], ["rte"], ["vanilla"], [1], dataclasses.replace(SETTINGS, precision="fp32"))
    with pytest.raises(BadInput, match="Give --device cuda or --device cpu"):
        dev.resolve_jobs_precision(jobs, "auto", executor="ray", address="10.0.0.1:6379")
    (local,) = dev.resolve_jobs_precision(jobs, "cpu")
    (remote_cpu,) = dev.resolve_jobs_precision(jobs, "cpu", executor="ray", address="10.0.0.1:6379")
    (remote_gpu,) = dev.resolve_jobs_precision(jobs, "cuda", executor="ray", address="10.0.0.1:6379")
    assert remote_cpu.filename == local.filename and remote_cpu.train.pad_to == "longest"
    assert remote_gpu.train.pad_to == "buckets" and remote_gpu.filename != local.filename


def test_tf32_deterministic_and_memory_cap_on_cuda_only(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    caps = []

    def set_fraction(fraction, device=None):  # torch's own rule: an index, or a device that names one
        caps.append((fraction, _get_device_index(device)))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        assert dev.enable_tf32(cpu) is False and torch.backends.cuda.matmul.allow_tf32 is saved[0]
        assert dev.enable_tf32(cuda) is True and torch.backends.cuda.matmul.allow_tf32
        assert dev.make_deterministic(cpu, True) is None and not torch.are_deterministic_algorithms_enabled()
        facts = dev.make_deterministic(cuda, True)
        assert facts["cublas_workspace_config"] == ":4096:8" and torch.are_deterministic_algorithms_enabled()
        assert dev.make_deterministic(cuda, False) is None and not torch.are_deterministic_algorithms_enabled()
        assert dev.limit_gpu_memory(cuda, 0.5) == 0.5 and caps == [(0.5, 0)]
        # a pool worker's device is a bare `cuda` (no index): on a real GPU that raised ValueError in every worker
        assert dev.limit_gpu_memory(torch.device("cuda"), 0.5) == 0.5 and caps[-1] == (0.5, 0)
        assert dev.limit_gpu_memory(cuda, None) is None and dev.limit_gpu_memory(cpu, 0.5) is None
        assert dev.limit_gpu_memory(cuda, 1.0) is None and len(caps) == 2  # a whole GPU: no cap
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.use_deterministic_algorithms(saved[2])
        torch.backends.cudnn.deterministic = saved[3]


def test_deterministic_is_a_setting_that_keeps_old_hashes():
    base = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS)[0]
    det = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS, ["train.deterministic=true"])[0]
    assert det.train.deterministic is True and det.hash != base.hash
    from suite.run.settings import unhashed_at_default

    assert "deterministic" in unhashed_at_default()  # at its default it stays out of the hash (old records)


def test_shared_gpus_get_a_memory_cap():
    from suite.grid.executors import local_plan
    from suite.grid.executors.ray import TaskResources

    assert local_plan("cuda", workers=4, gpu_count=2, cpu_count=8, env={}).memory_fraction == 0.5
    assert local_plan("cuda", workers=3, gpu_count=2, cpu_count=8, env={}).memory_fraction == 0.5
    assert local_plan("cuda", workers=2, gpu_count=2, cpu_count=8, env={}).memory_fraction is None
    assert TaskResources(1, 0.5).memory_fraction == 0.5 and TaskResources(1, 1).memory_fraction is None


def test_sticky_cuda_errors_and_out_of_memory_are_recognised():
    assert dev.is_sticky_cuda_error("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert dev.is_sticky_cuda_error("RuntimeError: CUDA error: device-side assert triggered")
    assert not dev.is_sticky_cuda_error("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not dev.is_sticky_cuda_error(None) and not dev.is_sticky_cuda_error("ValueError: boom")
    assert dev.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))


@pytest.mark.parametrize("fails", [1, 2], ids=["once", "twice"])
def test_out_of_memory_runs_once_more(fails, tiny_bert_dir, glue_dir, monkeypatch):
    """An OOM (a neighbour on a shared GPU may have held the memory) is run again once after freeing memory; a
    second one is recorded as failed, named as out of memory, saying a rerun retries it."""
    from suite.run import runner

    real, calls = runner.train_and_record, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) <= fails:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_and_record", flaky)
    job = build_grid([tiny_bert_dir], ["rte"], ["vanilla"], [1],
                     dataclasses.replace(SETTINGS, max_train_samples=16, train_eval_samples=0, stats_batches=0,
                                         analyses="none", max_eval_samples=16))[0]
    rec = runner.run_one(job, glue_dir, device="cpu", quiet=True)
    assert len(calls) == 2 and rec.executor.oom_retries == 1
    if fails == 1:
        assert rec.ok
    else:
        assert rec.status == "failed" and rec.error.startswith("OutOfMemoryError: CUDA out of memory")
        assert "run again when the same command is given again" in rec.error


def test_a_device_set_up_error_is_recorded_with_its_reason(monkeypatch):
    """The GPU set-up before a run (TF32, the memory cap of a shared GPU) failing is that run's failure, named: in a
    pool worker it used to end the process, and the record said only that the worker died."""
    from suite.run import runner

    def broken(device, fraction):
        raise ValueError("Expected a torch.device with a specified index or an integer, but got:cuda")

    monkeypatch.setattr(runner, "limit_gpu_memory", broken)
    job = build_grid(["m"], ["rte"], ["vanilla"], [1], SETTINGS)[0]
    rec = runner.run_one(job, device="cpu", quiet=True, memory_fraction=0.5)
    assert rec.status == "failed" and rec.error.startswith("ValueError while setting up cpu: Expected a torch.device")
    assert "limit_gpu_memory" not in rec.error and "broken" in rec.traceback


def test_drophead_keeps_all_heads_of_a_sample_without_a_host_sync():
    method = suite.METHODS.get("drophead")()
    torch.manual_seed(0)
    factors = method.head_factors(64, 4, 0.9, torch.device("cpu"))  # rate 0.9: many samples lose every head
    assert torch.allclose(factors.sum(dim=1), torch.full((64,), 4.0))
    assert ((factors == 0).sum(dim=1) < 4).all()
    assert (factors == 1).all(dim=1).any()  # some sample lost all and kept all


def test_topk_k_frac_threshold_matches_topk():
    from suite.methods.topk import topk_mask

    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 5, 9, generator=g)
    valid = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    valid[0, ..., 6:] = False
    s = s.masked_fill(~valid, torch.finfo(s.dtype).min)
    drop = topk_mask(s, valid, None, 0.5)
    n = valid.sum(-1, keepdim=True).expand(*s.shape[:-1], 1)
    k = torch.ceil(n.double() * 0.5 - 1e-9).long()
    for idx in [(0, 0, 0), (1, 2, 4), (0, 1, 3)]:
        kth = torch.topk(s[idx], int(k[idx]), dim=-1).values[-1]
        assert torch.equal(drop[idx], s[idx] < kth)


def test_attendout_syncs_only_on_timed_steps(monkeypatch):
    """The cost meter times a step (host syncs on CUDA) only every cost_every-th step; the others run unsynced."""
    from test_attendout import _attach, _batch, _ctx

    from suite.methods.attendout import cost
    from suite.methods.attendout import method as attendout

    syncs = []
    for module in (attendout, cost):  # the step's own edges, and the vanilla pass timed beside it
        monkeypatch.setattr(module, "sync", lambda device: syncs.append(len(steps)))
    model, method = _attach(cost_every=3)
    ctx, steps = _ctx(model, method), []
    batches = [_batch(seed=i) for i in range(7)]
    for i in range(6):
        steps.append(i)
        method.training_step(ctx, batches[i], batches[i + 1])
    assert set(syncs) == {1, 4}  # steps 1 and 4 (of 6) are timed
    cost = method.cost.summary()
    assert cost["steps"] == 6 and cost["timed_steps"] == cost["paired_steps"] == 2
