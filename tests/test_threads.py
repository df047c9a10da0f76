"""No CPU run spin-waits: torch threads per process follow cores and workers, OpenMP's idle threads sleep (passive
waits, before torch loads) in the command's process and in every worker unless the user chose otherwise, and the
record says both (docs/cost.md#threads-and-waiting)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from suite.grid.executors import LocalPlan, local_plan, run_grid
from suite.grid.plan import build_grid
from suite.grid.store import Store
from suite.run.device import torch_threads, wait_env, wait_policy
from suite.run.settings import TrainSettings

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = TrainSettings(epochs=1, batch_size=8)
WAITS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def test_threads_follow_cores_and_workers_unless_the_user_set_them():
    assert torch_threads(1, cores=2, env={}) == 2          # a single run on an idle machine takes both cores
    assert torch_threads(2, cores=2, env={}) == 1          # two workers: one core each
    assert torch_threads(4, cores=16, env={}) == 4
    assert torch_threads(3, cores=2, env={}) == 1          # more workers than cores: never 0
    assert torch_threads(1, cores=2, env={"OMP_NUM_THREADS": "1"}) == 1   # the user's own count wins
    assert torch_threads(2, cores=16, env={"OMP_NUM_THREADS": "3,2"}) == 3  # OpenMP's nested form: the top level
    for junk in ("0", "abc", "", "-2"):                    # no count torch would use: the rule's
        assert torch_threads(1, cores=2, env={"OMP_NUM_THREADS": junk}) == 2, junk


def test_the_local_plan_gives_every_training_process_its_threads():
    single = local_plan("cpu", gpu_count=0, cpu_count=2, env={})
    assert (single.workers, single.threads) == (0, 2)       # the in-process default (--workers 1) says so too
    assert local_plan("cpu", workers=2, gpu_count=0, cpu_count=2, env={}).threads == 1
    assert local_plan("cpu", gpu_count=0, cpu_count=2, env={"OMP_NUM_THREADS": "1"}).threads == 1
    assert local_plan("auto", gpu_count=2, cpu_count=16, env={}).threads == 8
    assert local_plan("auto", gpu_count=1, cpu_count=16, env={}).threads == 16


def test_waits_are_passive_unless_the_user_chose_how_threads_wait():
    assert wait_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_env({"OMP_WAIT_POLICY": " "}) == {"OMP_WAIT_POLICY": "PASSIVE"}   # blank: not a choice
    assert wait_env({"OMP_WAIT_POLICY": "active"}) == {"OMP_WAIT_POLICY": "active"}
    assert wait_env({"GOMP_SPINCOUNT": "300000"}) == {"GOMP_SPINCOUNT": "300000"}  # libgomp's default, asked for
    assert wait_policy({}) == "default"
    assert wait_policy({"OMP_WAIT_POLICY": "passive"}) == "PASSIVE"
    assert wait_policy({"GOMP_SPINCOUNT": "300000"}) == "default, GOMP_SPINCOUNT=300000"


def _libgomp_read(extra: dict[str, str]) -> dict[str, str]:
    """What torch's OpenMP read when a command's process loaded it (`bench --help` imports torch), in its own words
    (OMP_DISPLAY_ENV), with this environment's wait settings replaced by `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in WAITS}
    env.update({"OMP_DISPLAY_ENV": "verbose", "PYTHONPATH": str(ROOT), **extra})
    done = subprocess.run([sys.executable, "-m", "suite", "bench", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(re.findall(r"^\s*(OMP_WAIT_POLICY|GOMP_SPINCOUNT) = '([^']*)'", done.stderr, re.M))


def test_the_command_process_has_passive_waits_before_torch_loads():
    # spin count 0 is libgomp's passive; its default (policy unset) spins 300000 and shows the same policy line
    assert _libgomp_read({}) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}


def test_a_users_own_wait_settings_are_left_alone():
    assert _libgomp_read({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    assert _libgomp_read({"GOMP_SPINCOUNT": "300000"})["GOMP_SPINCOUNT"] == "300000"


def test_the_passive_setting_comes_before_the_first_torch_import():
    """`suite` as a program, watched from inside: the environment at the moment torch is first imported."""
    script = ("import os, runpy, sys\n"
              "seen = []\n"
              "def hook(event, args):\n"
              "    if event == 'import' and args[0] == 'torch' and not seen:\n"
              "        seen.append(os.environ.get('OMP_WAIT_POLICY'))\n"
              "sys.addaudithook(hook)\n"
              "sys.argv = ['suite', 'check', '--help']\n"
              "try:\n"
              "    runpy.run_module('suite', run_name='__main__')\n"
              "except SystemExit:\n"
              "    pass\n"
              "print('SEEN', seen)\n")
    env = {k: v for k, v in os.environ.items() if k not in WAITS}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert "SEEN ['PASSIVE']" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_pool_worker_starts_with_passive_waits_and_its_threads_and_the_record_says_so(tiny_bert_dir, glue_dir,
                                                                                         tmp_path, monkeypatch):
    """A driver without a wait setting (a script that loaded torch first): its spawned worker still gets passive
    waits, runs its plan's threads, and the record carries both."""
    for key in WAITS:
        monkeypatch.delenv(key, raising=False)
    jobs = build_grid([tiny_bert_dir], ["rte"], ["vanilla"], [1], SETTINGS)
    result = run_grid(jobs, Store(tmp_path / "out"), glue_dir, executor="local", quiet=True,
                      plan=LocalPlan(1, [{}], "cpu", 2))
    (_, rec), = result.done
    assert (rec.environment["omp_wait_policy"], rec.environment["cpu_threads"]) == ("PASSIVE", 2)
    assert (rec.env.omp_wait_policy, rec.env.cpu_threads) == ("PASSIVE", "2")
    assert "OMP_WAIT_POLICY" not in os.environ            # the driver's own environment untouched


def test_the_in_process_run_uses_its_plans_threads(tiny_bert_dir, glue_dir, tmp_path):
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        jobs = build_grid([tiny_bert_dir], ["rte"], ["vanilla"], [1], SETTINGS)
        result = run_grid(jobs, Store(tmp_path / "out"), glue_dir, executor="local", quiet=True,
                          plan=LocalPlan(0, [], "cpu", 2))
    finally:
        torch.set_num_threads(before)
    (_, rec), = result.done
    assert rec.environment["cpu_threads"] == 2


def test_ray_workers_get_the_wait_setting_with_the_drivers_other_variables(monkeypatch):
    from suite.grid.executors.ray import TaskResources, remote_task

    class Task:
        def options(self, **kwargs):
            return kwargs

    class FakeRay:
        def remote(self, *args, **kwargs):
            return Task() if args else lambda f: Task()

    for key in WAITS:
        monkeypatch.delenv(key, raising=False)
    cpu = TaskResources(1, 0)
    assert remote_task(FakeRay(), cpu, 0)["runtime_env"] == {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    options = remote_task(FakeRay(), cpu, 0, {"MLFLOW_TRACKING_URI": "http://h:5000"})
    assert options["runtime_env"] == {"env_vars": {"OMP_WAIT_POLICY": "ACTIVE", "MLFLOW_TRACKING_URI": "http://h:5000"}}


def test_an_older_record_without_the_wait_policy_reads_and_writes_back_unchanged(tmp_path):
    from suite.grid.store import record_json
    from suite.run.record import read_record
    from suite.run.settings import RunConfig, TrainSettings

    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())  # a reader holds a record against its own hash
    base = {"config": job.to_dict(), "hash": job.hash, "label": "rte/vanilla/seed1",
            "status": "ok", "final": {"score": 0.6}, "history": [{"epoch": 1}]}
    for environment, policy in (({"cpu_threads": 2, "device": "cpu"}, "?"),
                                ({"cpu_threads": 1, "omp_wait_policy": "PASSIVE", "device": "cpu"}, "PASSIVE")):
        path = tmp_path / "r.json"
        path.write_bytes(json.dumps({**base, "environment": environment}, indent=1).encode())
        rec = read_record(path)
        assert rec.env.omp_wait_policy == policy
        assert record_json(rec.to_dict()) == path.read_bytes()


def test_every_run_records_its_threads_and_wait_policy(monkeypatch):
    import torch

    from suite.run.device import environment

    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    env = environment(torch.device("cpu"))
    assert (env["cpu_threads"], env["omp_wait_policy"]) == (torch.get_num_threads(), "PASSIVE")


def test_every_run_records_its_cpu_and_whether_it_computes_bf16_in_hardware():
    """Seconds per step and what `--precision auto` picks depend on these."""
    import torch

    from suite.run.device import cpu_bf16_native, cpu_model, environment
    from suite.run.record_parts import Environment

    env = environment(torch.device("cpu"))
    assert (env["cpu"], env["cpu_bf16"]) == (cpu_model(), cpu_bf16_native()) and env["cpu"]
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    found = dict(re.findall(r"^(model name|cpu family|model)\s*: (.*)$", cpuinfo, re.M)[:3])
    if len(found) == 3:  # x86 Linux: a VM may call every EPYC "AMD EPYC"; the family and model numbers differ
        assert env["cpu"] == f"{found['model name']} (cpu family {found['cpu family']}, model {found['model']})"
    assert Environment.of(env).cpu_text == env["cpu"] + (", bf16 in hardware" if env["cpu_bf16"] else ", bf16 emulated")
