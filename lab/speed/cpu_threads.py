"""Training steps per second and CPU per step for 1 vs 2 torch threads x OpenMP waits passive vs libgomp's default,
on the machine as it is and beside N busy processes, side by side in one run.

    python lab/speed/cpu_threads.py --data-dir ../shared/data/glue --busy 2 \
        --out results/throughput/cpu_threads.json --md results/throughput/cpu_threads.md

Each configuration is one `python -m suite bench --loop` (the real training loop; its timed epoch gives steps/s and
every thread's CPU seconds per step) in a fresh process, since libgomp reads its wait policy once, when torch loads
it. Passive is the suite's default; libgomp's own default (spin about 3 ms, then sleep) is asked for with
GOMP_SPINCOUNT=300000, its documented spin count when OMP_WAIT_POLICY is unset, which the suite leaves alone as a
user's own setting. libgomp's own account of what it read (OMP_DISPLAY_ENV=verbose) is kept with each row. "Busy"
processes are pure-Python loops, one core each, started before and stopped after their configurations.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [(1, "default"), (1, "passive"), (2, "default"), (2, "passive")]  # (torch threads, OpenMP waits)
LIBGOMP_DEFAULT_SPIN = "300000"  # libgomp's spin count when OMP_WAIT_POLICY is unset (its manual, GOMP_SPINCOUNT)


def child_env(waits: str) -> dict[str, str]:
    """The environment of one configuration: the thread and wait settings of this shell taken out, then its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["OMP_DISPLAY_ENV"] = "verbose"  # libgomp prints what it read when it loads: the row keeps it
    if waits == "default":
        env["GOMP_SPINCOUNT"] = LIBGOMP_DEFAULT_SPIN
    return env


def measure(threads: int, waits: str, args) -> dict:
    """One configuration's row: the bench's own numbers, what libgomp read, the load average around it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "loop.json"
        command = [sys.executable, "-m", "suite", "bench", "--loop", "--tasks", args.task, "--methods", "vanilla",
                   "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--threads", str(threads),
                   "--json", str(out)] + (["--data-dir", args.data_dir] if args.data_dir else [])
        load_before, start = os.getloadavg()[0], time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=child_env(waits), capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        row = json.loads(out.read_text())["rows"][0]
    read = dict(re.findall(r"^\s*(OMP_WAIT_POLICY|GOMP_SPINCOUNT|OMP_NUM_THREADS) = '([^']*)'", done.stderr, re.M))
    return {"threads": threads, "waits": waits, "steps_per_s": row["steps_per_s"],
            "cpu_s_per_step": row["cpu_s_per_step"], "torch_threads": row["threads"],
            "recorded_wait_policy": row["omp_wait_policy"], "libgomp_read": read,
            "process_wall_s": round(time.perf_counter() - start, 1),
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def table(rows: list[dict]) -> str:
    """Each load's configurations with their ratios to one thread under libgomp's default at the same load."""
    lines = ["| load | threads | waits | steps/s | x steps/s | CPU s/step | x CPU/step | libgomp read | load avg |",
             "|------|---------|-------|---------|-----------|------------|------------|--------------|----------|"]
    for load in dict.fromkeys(r["load"] for r in rows):
        here = [r for r in rows if r["load"] == load]
        base = next(r for r in here if (r["threads"], r["waits"]) == (1, "default"))
        for r in here:
            read = r["libgomp_read"]
            lines.append(f"| {load} | {r['threads']} | {r['waits']} | {r['steps_per_s']:.2f} | "
                         f"{r['steps_per_s'] / base['steps_per_s']:.2f} | {r['cpu_s_per_step']:.3f} | "
                         f"{r['cpu_s_per_step'] / base['cpu_s_per_step']:.2f} | "
                         f"{read.get('OMP_WAIT_POLICY', '?')}, spin {read.get('GOMP_SPINCOUNT', '?')} | "
                         f"{r['load_before']:.1f}-{r['load_after']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="mrpc", help="GLUE task whose training rows are used (default mrpc)")
    p.add_argument("--steps", type=int, default=4, help="batches per epoch: one counted, one timed (default 4)")
    p.add_argument("--batch-size", type=int, default=8, help="default 8")
    p.add_argument("--busy", type=int, default=os.cpu_count() or 2,
                   help="busy processes beside the second pass (default: one per core); 0: no second pass")
    p.add_argument("--data-dir", help="folder of GLUE TSVs (default: $SUITE_DATA_DIR, else the hub)")
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--md", help="write the table as markdown here")
    args = p.parse_args()
    loads = ["as found"] + ([f"beside {args.busy} busy"] if args.busy else [])
    rows = []
    for load in loads:
        procs = busy(args.busy) if load != "as found" else []
        try:
            time.sleep(2 if procs else 0)
            for threads, waits in CONFIGS:
                print(f"{load}: {threads} thread(s), {waits} waits", file=sys.stderr, flush=True)
                rows.append({"load": load, **measure(threads, waits, args)})
        finally:
            stop(procs)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    command = "python lab/speed/cpu_threads.py " + " ".join(sys.argv[1:])
    text = "\n".join([f"Command: `{command}`", "",
                      f"Code {commit}; {platform.node()}, {os.cpu_count()} cores; task {args.task}, batch "
                      f"{args.batch_size}, {args.steps} timed steps per configuration; x: the ratio to 1 thread "
                      "with libgomp's default waits at the same load", "", table(rows)]) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": command, "code": commit, "host": platform.node(),
                                              "cores": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
