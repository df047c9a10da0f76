"""A grid's wall-clock: methods x seeds on one task run as one suite grid, against the same runs done with HF Trainer
one after another, in one invocation; prints a markdown table with wall-clock, CPU time and dev scores per method.

    nice -n 10 python lab/speed/grid_throughput.py --task sst2 --data-dir ../shared/data/glue \
        --methods vanilla,scores_dropout,sparsemax --seeds 1,2,3 --max-train-samples 200 --epochs 1

The suite side is `suite.grid.executors.run_grid` in this process (the local executor's sequential path): the task is
read
and tokenised once for the grid (the in-process cache, with the cross-process disk cache pointed at an empty temporary
folder so nothing is carried over from earlier invocations), and records are written as a grid writes them. The
Trainer side runs `lab/speed/trainer_vs_suite.py`'s Trainer recipe once per run, each reading and tokenising its
data and loading the model, as separate fine-tuning scripts do; the method is attached to the loaded model the same
way the suite does (transformers' attention interface), so both sides train the same nine models. Both sides skip
what only the suite does (train-subset scoring, attention statistics, end-of-run analyses). Trainer runs first, then
the grid; the load average is printed before, between and after.

Those two rows compare runners inside one warm Python process. Users run Trainer recipes as scripts, one process per
run (imports, model and data loading each time), and the suite as one command, so two more rows time whole commands:
each Trainer run as its own `python` process, and the grid as one `python -m suite run` (both with an empty cache).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_vs_suite import machine, run_trainer, welch  # noqa: E402

from suite.api.tasks import get_task  # noqa: E402
from suite.grid.plan import build_grid
from suite.grid.store import iter_records  # noqa: E402
from suite.run.settings import DEFAULT_MODEL, RunConfig, TrainSettings  # noqa: E402


@contextlib.contextmanager
def attaching(job):
    """While active, models loaded by AutoModelForSequenceClassification.from_pretrained get `job`'s method."""
    from transformers import AutoModelForSequenceClassification as Auto

    from suite.run.models import build_method

    saved, load = Auto.__dict__.get("from_pretrained"), Auto.from_pretrained

    def load_and_attach(*args, **kwargs):
        model = load(*args, **kwargs)
        build_method(job).attach(model)
        return model

    Auto.from_pretrained = load_and_attach
    try:
        yield
    finally:
        if saved is None:
            del Auto.from_pretrained
        else:
            Auto.from_pretrained = saved


def trainer_side(jobs, data_dir: str, device: str) -> tuple[float, float, list[dict]]:
    """(wall s, CPU s, per-run results) of the runs done with Trainer one after another."""
    from suite.run.models import quiet_transformers

    runs, wall, cpu = [], time.perf_counter(), time.process_time()
    for job in jobs:
        with attaching(job), quiet_transformers():
            res = run_trainer(job, data_dir, device)
        runs.append({"method": job.method, "seed": job.seed, **res})
        print(f"Trainer {job.label}: {res['wall_s']:.1f}s, dev score {res['score']:.4f}", file=sys.stderr, flush=True)
    return time.perf_counter() - wall, time.process_time() - cpu, runs


def suite_side(jobs, data_dir: str, device: str) -> tuple[float, float, list[dict]]:
    """(wall s, CPU s, per-run results) of the same runs as one suite grid."""
    from suite.grid.executors import run_grid
    from suite.grid.store import Store
    from suite.run.runner import WORKER_CACHE

    WORKER_CACHE.clear()
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as cache:
        os.environ["SUITE_CACHE_DIR"] = cache
        wall, cpu = time.perf_counter(), time.process_time()
        result = run_grid(jobs, Store(out), data_dir, executor="local", quiet=True, device=device)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if result.failed:
        raise RuntimeError(f"suite runs failed: {[r.error for _, r in result.failed]}")
    runs = [{"method": job.method, "seed": job.seed, "wall_s": rec.wall_s, "score": rec.final.score}
            for job, rec in result.done]
    return wall, cpu, runs


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trainer_scripts(jobs, data_dir: str, device: str) -> tuple[float, float, list[dict]]:
    """(wall s, CPU s, per-run results) of the runs as separate Trainer scripts, one process after another."""
    runs, wall, cpu = [], time.perf_counter(), _children_cpu()
    for job in jobs:
        out = subprocess.run([sys.executable, __file__, "--one-trainer-run", json.dumps(job.to_dict()),
                              "--data-dir", data_dir, "--device", device], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"Trainer script for {job.label} failed:\n{out.stderr[-2000:]}")
        runs.append({"method": job.method, "seed": job.seed, **json.loads(out.stdout.splitlines()[-1])})
    return time.perf_counter() - wall, _children_cpu() - cpu, runs


def suite_command(jobs, args) -> tuple[float, float, list[dict]]:
    """(wall s, CPU s, per-run results) of the same grid as one `python -m suite run` command."""
    t = jobs[0].train
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as cache:
        cmd = [sys.executable, "-m", "suite", "run", "--methods", args.methods, "--tasks", args.task,
               "--seeds", args.seeds, "--model", args.model, "--data-dir", args.data_dir, "--device", args.device,
               "--out", out, "--quiet", "--epochs", str(t.epochs), "--lr", str(t.lr), "--batch-size",
               str(t.batch_size), "--max-train-samples", str(t.max_train_samples), "--max-eval-samples",
               str(t.max_eval_samples), "--precision", t.precision, "--set", "train.train_eval_samples=0",
               "--set", "train.stats_batches=0", "--set", "train.analyses=none"]
        wall, cpu = time.perf_counter(), _children_cpu()
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "SUITE_CACHE_DIR": cache})
        wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
        if done.returncode:
            raise RuntimeError(f"suite command failed:\n{done.stderr[-2000:]}")
        records = [rec for _, rec in iter_records(Path(out, "runs"))]
    if {r.hash for r in records} != {j.hash for j in jobs}:  # same settings, hyper-parameters and seeds
        raise RuntimeError("the suite command ran other jobs than the in-process grid")
    runs = [{"method": r.method, "seed": r.seed, "score": r.final.score} for r in records]
    return wall, cpu, runs


def per_method(runs: list[dict], methods: list[str]) -> list[str]:
    return [f"{np.mean(s):.4f} ± {np.std(s, ddof=1) if len(s) > 1 else 0:.4f}"
            for s in ([r["score"] for r in runs if r["method"] == m] for m in methods)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="sst2", help="one task (default sst2)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model (default: the offline MiniLM)")
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"),
                   help="folder of GLUE TSVs")
    p.add_argument("--methods", default="vanilla,scores_dropout,sparsemax",
                   help="comma list of methods that use the standard training step (Trainer runs them too)")
    p.add_argument("--seeds", default="1,2,3", help="comma list of seeds")
    p.add_argument("--max-train-samples", type=int, default=200, help="seeded train subset")
    p.add_argument("--max-eval-samples", type=int, default=200, help="seeded dev subset")
    p.add_argument("--epochs", type=int, default=1, help="epochs per run")
    p.add_argument("--batch-size", type=int, default=16, help="training batch size")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--one-trainer-run", metavar="JOB_JSON", help=argparse.SUPPRESS)  # a Trainer script's process
    args = p.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one_trainer_run:
        from suite.run.models import quiet_transformers

        job = RunConfig.from_dict(json.loads(args.one_trainer_run))
        with attaching(job), quiet_transformers():
            print(json.dumps(run_trainer(job, args.data_dir, args.device)))
        return 0
    methods, seeds = args.methods.split(","), [int(s) for s in args.seeds.split(",")]
    # like for like: none of the suite's extra per-run work (train-subset scoring, attention statistics, analyses)
    t = TrainSettings(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, train_eval_samples=0,
                      stats_batches=0, analyses="none", max_train_samples=args.max_train_samples,
                      max_eval_samples=args.max_eval_samples)
    jobs = build_grid([args.model], [args.task], methods, seeds, t)

    loads = [os.getloadavg()[0]]
    trainer = trainer_side(jobs, args.data_dir, args.device)
    loads.append(os.getloadavg()[0])
    grid = suite_side(jobs, args.data_dir, args.device)
    loads.append(os.getloadavg()[0])
    scripts = trainer_scripts(jobs, args.data_dir, args.device)
    loads.append(os.getloadavg()[0])
    command = suite_command(jobs, args)
    loads.append(os.getloadavg()[0])

    rows = [[name, f"{wall:.1f}", f"{base[0] / wall:.2f}x", f"{cpu:.1f}", f"{base[1] / cpu:.2f}x",
             *per_method(runs, methods)]
            for name, (wall, cpu, runs), base in (
                ("in one process: HF Trainer, one run after another", trainer, trainer),
                ("in one process: suite grid", grid, trainer),
                ("whole commands: one Trainer script per run", scripts, scripts),
                ("whole commands: one `python -m suite run`", command, scripts))]
    print(f"**{get_task(args.task).display}, {args.model}, {len(methods)} methods x {len(seeds)} seeds = {len(jobs)} "
          f"runs, {args.max_train_samples} train / {args.max_eval_samples} dev examples, {args.epochs} epoch(s), "
          f"batch {args.batch_size}, lr {args.lr}**  ")
    print("command: `python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]) + "`  ")
    print(f"machine: {machine(args.device)}; load average (1 min) before and after each row: "
          f"{' / '.join(f'{x:.1f}' for x in loads)}  \n")
    print(tabulate(rows, headers=["runner", "wall s (all runs)", "wall speed-up", "CPU s", "CPU speed-up",
                                  *[f"dev score {m} (mean ± sd)" for m in methods]], tablefmt="github"))
    print("\nin one process: " + score_agreement(trainer[2], grid[2], methods))
    print("\nwhole commands: " + score_agreement(scripts[2], command[2], methods))
    return 0


def score_agreement(trainer: list[dict], grid: list[dict], methods: list[str]) -> str:
    """Whether the two sides' dev scores differ beyond seed noise, per method and over all runs (Welch's t-test: the
    sides draw batches in different orders, so runs are not paired by seed)."""
    parts = [f"{name}: {welch([r for r in grid if r['method'] in keep], [r for r in trainer if r['method'] in keep])}"
             for name, keep in [*((m, [m]) for m in methods), ("all runs", methods)]]
    return "dev score, suite minus Trainer: " + "; ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
