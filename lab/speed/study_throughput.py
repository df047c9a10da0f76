"""A study's throughput on this machine: runs per device-hour at the standard budget, beside the arithmetic limit.

    python lab/speed/study_throughput.py --data-dir ../shared/data/glue --tasks rte,mrpc,stsb,cola \
        --methods vanilla --seeds 4 --workers 1,8,auto --capture auto,off --out throughput.json

For each (capture, workers) pair, one `python -m suite run` of the grid (methods x tasks x seeds) at the standard
budget (`--preset paper` with MiniLM: full training sets, 3 epochs, batch 32, lr 2e-5) into a fresh output
folder, timed as a whole command (start-up, tokenising, training, evaluation, records). Tokenised data is made once
first (the disk cache), so no configuration pays it. Reported per configuration: wall time, runs per hour of the
device (runs / wall), the median step time and the runs' median start-up (wall less train and eval time), MFU over
the grid (training and evaluation FLOPs / wall / the device's dense bf16 peak), and beside it the arithmetic limit:
runs per hour if every run's FLOPs ran at the peak. FLOPs count the real tokens of every training example per epoch
(6 x parameters per token, `suite.profiling.loop.flops_per_token`) and of every evaluated example (a third of that),
so padding and any method's extra work count as overhead.

On the CPU it rehearses the script (`--max-train-samples 64 --epochs 1`); numbers there are no GPU's.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def grid_flops(tasks: list[str], data_dir: str, epochs: int, max_train: int | None, max_length: int,
               seeds: int) -> dict:
    """FLOPs of one run of each task (training at 6 x parameters per real token, evaluation of dev and the train
    subset at 2 x), from the task's tokenised rows; also tokenises every seed's draw into the disk cache, as the
    grid's first run of it would."""
    from transformers import AutoConfig, AutoTokenizer

    from suite.api.tasks import get_task
    from suite.profiling.loop import flops_per_token
    from suite.run.runner import TokenizedCache
    from suite.run.settings import RunConfig, preset_train, resolve_model

    config = AutoConfig.from_pretrained(resolve_model("minilm"))
    tok = AutoTokenizer.from_pretrained(resolve_model("minilm"))
    out = {}
    for task in tasks:
        spec = get_task(task)
        config.num_labels = spec.num_labels
        t = dataclasses.replace(preset_train("paper", task), max_train_samples=max_train, max_length=max_length,
                                epochs=epochs)
        for seed in range(seeds, 0, -1):  # each seed draws (and caches) its own rows; seed 1's are counted
            data = TokenizedCache().get(RunConfig("minilm", task, "vanilla", {}, seed, t), spec, tok, data_dir)
        train = sum(data.train.lengths())
        evaluated = sum(sum(d.lengths()) for d in data.devs.values()) + sum(data.train_subset.lengths())
        mean = max(1, round(train / max(1, len(data.train))))
        per_token = flops_per_token(config, mean)
        out[task] = {"train_rows": len(data.train), "train_tokens": train,
                     "flops": epochs * (train * per_token + evaluated * per_token / 3)}
    return out


def run_grid(args, capture: str, workers: str, out: Path) -> dict:
    command = [sys.executable, "-m", "suite", "run", "--preset", "paper", "--model", "minilm",
               "--methods", args.methods, "--tasks", args.tasks,
               "--seeds", ",".join(str(s) for s in range(1, args.seeds + 1)), "--data-dir", args.data_dir,
               "--out", str(out), "--epochs", str(args.epochs), "--set", f"train.capture={capture}",
               "--set", f"train.max_train_samples={args.max_train_samples or 'none'}", "--set",
               "train.stats_batches=0"]
    if workers != "1":
        command += ["--workers", workers]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    from suite.grid.store import iter_records

    records = [rec for _, rec in iter_records(out / "runs")]
    ok = [r for r in records if r.ok]
    return {"capture": capture, "workers": workers, "wall_s": wall, "exit": done.returncode, "runs": len(records),
            "ok": len(ok), "tail": (done.stdout + done.stderr)[-1500:] if done.returncode else "",
            "step_ms": 1e3 * statistics.median(r.timing.step_s for r in ok) if ok else None,
            "startup_s": statistics.median(r.wall_s - r.timing.train_s - r.timing.eval_s for r in ok) if ok else None,
            "step_modes": sorted({getattr(r.timing.step_mode, "mode", None) or "?" for r in ok}),
            "tasks": sorted({r.task for r in ok})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--tasks", default="rte,mrpc,stsb,cola")
    p.add_argument("--methods", default="vanilla")
    p.add_argument("--seeds", type=int, default=4, help="seeds 1..N of each method and task")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-train-samples", type=int, help="default: the full training sets (the standard budget)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--workers", default="1,auto", help="comma list of --workers values to compare")
    p.add_argument("--capture", default="auto,off", help="comma list of train.capture values to compare")
    p.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak (default: by GPU name)")
    p.add_argument("--out", help="write the report as JSON here")
    args = p.parse_args(argv)

    import torch

    from suite.profiling.loop import peak_tflops
    from suite.run.device import git_commit, machine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peak = args.peak_tflops or (peak_tflops(torch.cuda.get_device_name()) if device.type == "cuda" else None)
    tasks = args.tasks.split(",")
    flops = grid_flops(tasks, args.data_dir, args.epochs, args.max_train_samples, args.max_length, args.seeds)
    per_run = statistics.fmean(flops[t]["flops"] for t in tasks)  # the grid holds each task equally often
    report = {"device": machine(device), "torch": torch.__version__, "code": git_commit(), "peak_tflops": peak,
              "tasks": flops, "methods": args.methods, "seeds": args.seeds, "epochs": args.epochs,
              "arithmetic_limit_runs_per_hour": 3600 * peak * 1e12 / per_run if peak else None, "rows": []}
    for capture in args.capture.split(","):
        for workers in args.workers.split(","):
            with tempfile.TemporaryDirectory() as folder:
                row = run_grid(args, capture, workers, Path(folder) / "out")
            row["runs_per_hour"] = 3600 * row["ok"] / row["wall_s"]
            row["mfu"] = row["ok"] * per_run / row["wall_s"] / (peak * 1e12) if peak else None
            report["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "tail"}), flush=True)
            if row["tail"]:
                print(row["tail"], file=sys.stderr, flush=True)
    print(table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r["exit"] == 0 for r in report["rows"]) else 1


def table(report: dict) -> str:
    from tabulate import tabulate

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    rows = [[r["capture"], r["workers"], f"{r['ok']}/{r['runs']}", num(r["wall_s"], ".1f"),
             num(r["runs_per_hour"], ",.0f"), num(r["step_ms"], ".1f"), num(r["startup_s"], ".2f"),
             num(r["mfu"], ".2%"), "/".join(r["step_modes"])] for r in report["rows"]]
    limit = report["arithmetic_limit_runs_per_hour"]
    return (f"{report['device']}; torch {report['torch']}; code {report['code']}; tasks "
            f"{', '.join(report['tasks'])}; {report['epochs']} epochs; arithmetic limit "
            f"{num(limit, ',.0f')} runs/hour\n\n"
            + tabulate(rows, headers=["capture", "workers", "ok", "wall s", "runs/hour", "step ms (median)",
                                      "start-up s (median)", "MFU", "steps"], tablefmt="github",
                       disable_numparse=True))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
