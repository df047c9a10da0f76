"""One suite command under two code versions, side by side on one machine: wall clock, runs per hour and dev scores.

    python lab/speed/side_by_side.py --old 5f3a526 --new HEAD --out results/throughput/main_job_cpu.json -- \
        run --methods vanilla,scores_dropout,uniform --tasks sst2,stsb,cola --data-dir ../shared/data/glue --workers 2

Each revision is checked out of this repository (`git worktree`) and installed, without dependencies, into a
temporary folder that is put first on PYTHONPATH (and the checkout's own folder taken off sys.path: each run checks
that it imports the revision installed for it), so both run in the same interpreter with the same packages; the
working tree's own uncommitted changes are in neither unless `--new worktree` (the checkout as it is). The two run
one after the other (`--rounds` alternates them: old, new, new, old, ...), each into a fresh output folder with an
empty data cache, as a new user's first command would. Scores are the records' final dev scores, averaged per task
and method, so a reader sees that the faster code gives the same results (within seed noise: several code changes
alter the arithmetic, such as the padding of batches on a GPU, never the protocol).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def install(rev: str, where: Path) -> Path:
    """`rev` installed (no dependencies) into `where/site`; `worktree` installs the checkout as it is."""
    src = ROOT
    if rev != "worktree":
        src = where / "src"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(src), rev], check=True,
                       capture_output=True)
    site = where / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-t", str(site),
                    str(src)], check=True, capture_output=True)
    return site


def scores(out: Path) -> dict[str, dict]:
    """Each task and method's final dev scores. The records are read as JSON, not through suite.run.record: this
    harness imports no suite (each side runs its own revision), and an older revision's records may predate the
    reader here."""
    found: dict[str, list[float]] = defaultdict(list)
    status: dict[str, int] = defaultdict(int)
    for f in sorted((out / "runs").glob("*.json")):
        rec = json.loads(f.read_text())
        status[rec["status"]] += 1
        if rec["status"] == "ok":
            found[f"{rec['config']['task']}/{rec['config']['method']}"].append(rec["final"]["score"])
    return {"status": dict(status), "scores": {k: v for k, v in sorted(found.items())}}


# `python -m` puts the working folder first on sys.path, where this checkout's own `suite` would shadow the installed
# revision: run the module with that entry removed (what `python -P -m` does on Python 3.11+)
RUN_MODULE = ("import runpy, sys; sys.path.pop(0); module = sys.argv.pop(1); "
              "runpy.run_module(module, run_name='__main__', alter_sys=True)")
WHICH_SUITE = "import sys; sys.path.pop(0); import suite; print(suite.__file__)"


def ran_from(site: Path) -> Path:
    """The `suite` package a run under `site` imports: it must be the installed revision's, not this checkout's."""
    env = dict(os.environ, PYTHONPATH=str(site))
    found = Path(subprocess.run([sys.executable, "-c", WHICH_SUITE], env=env, cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip())
    if site.resolve() not in found.resolve().parents:
        raise SystemExit(f"the run under {site} would import {found}, not the revision installed there")
    return found


def run(site: Path, args: list[str], out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(site), SUITE_CACHE_DIR=str(out / "cache"))
    ran_from(site)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RUN_MODULE, "suite", *args, "--out", str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    found = scores(out)
    runs = sum(found["status"].values())
    return {"wall_s": wall, "runs": runs, "runs_per_hour": 3600 * runs / wall, **found,
            "load_after": os.getloadavg()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="git revision of the code before")
    p.add_argument("--new", default="worktree", help="git revision after (default: the checkout as it is)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each version, alternated (default 1)")
    p.add_argument("--out", required=True, help="JSON file for the measurements")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the suite command (without --out)")
    a = p.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    tmp = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    new_code = f"{head}+worktree" if a.new == "worktree" else a.new  # what was installed, not what HEAD is later
    try:
        sites = {"old": install(a.old, tmp / "old"), "new": install(a.new, tmp / "new")}
        order = [v for r in range(a.rounds) for v in (("old", "new") if r % 2 == 0 else ("new", "old"))]
        results = []
        for i, version in enumerate(order):
            rev = a.old if version == "old" else a.new
            print(f"{version} ({rev}): round {i // 2 + 1}", file=sys.stderr, flush=True)
            results.append({"version": version, **run(sites[version], command, tmp / f"out{i}")})
            print(f"  {results[-1]['wall_s']:.0f} s, {results[-1]['runs_per_hour']:.1f} runs/hour", file=sys.stderr)
    finally:
        for v in ("old", "new"):
            if (tmp / v / "src").exists():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / v / "src")],
                               capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"command": "python -m suite " + " ".join(command), "old": a.old, "new": a.new,
           "new_code": new_code,
           "machine": _machine(), "results": results}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in results:
        print(f"{r['version']}: {r['wall_s']:.0f} s, {r['runs']} runs, {r['runs_per_hour']:.1f} runs/hour")


def _machine() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    main()
