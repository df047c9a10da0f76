"""How often a training budget fails, read on the tuning split (never dev): for each training setting among a folder's
records, the tuning-split scores over seeds and how many runs fell below a threshold.

    python lab/speed/budget_check.py results/stsb_budget --below 0.5

Used to choose a task's budget before a study (docs/results.md, "Choosing STS-B's budget"): the runs need
`train.holdout`, and the records' dev scores are not read.
"""
from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from tabulate import tabulate

from suite.grid.store import iter_records

# settings every run of a budget check shares, or that do not change what is trained: left out of the row names
QUIET = {"holdout", "holdout_seed", "analyses", "train_eval_samples", "eval_batch_size", "precision"}


def setting_name(train: dict, shared: dict) -> str:
    differs = {k: v for k, v in train.items() if k not in QUIET and shared.get(k, object()) != v}
    return ", ".join(f"{k}={v}" for k, v in sorted(differs.items())) or "(as the others)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="a run folder (its runs/ holds the records)")
    p.add_argument("--below", type=float, required=True, help="a run whose tuning-split score is below this failed")
    args = p.parse_args(argv)
    records = [rec for _, rec in iter_records(Path(args.out, "runs"))]
    records = [r for r in records if r.ok and not math.isnan(r.tune_score)]
    if not records:
        raise SystemExit(f"{args.out}: no ok record with a tuning-split score (the runs need train.holdout)")
    trains = [r.train for r in records]
    shared = {k: v for k, v in trains[0].items() if all(t.get(k) == v for t in trains)}
    groups: dict[str, list[dict]] = defaultdict(list)
    for rec, train in zip(records, trains):
        groups[f"{rec.task}/{rec.method} " + setting_name(train, shared)].append(rec)
    rows = []
    for name, recs in groups.items():
        recs = sorted(recs, key=lambda r: r.seed)
        tune = np.array([r.tune_score for r in recs])
        steps = {r.timing.steps for r in recs}
        rows.append([name, len(recs), f"{tune.mean():.3f}", f"{np.median(tune):.3f}", f"{tune.min():.3f}",
                     f"{int((tune < args.below).sum())}/{len(recs)}", "/".join(map(str, sorted(steps))),
                     f"{np.mean([r.wall_s for r in recs]):.0f}",
                     " ".join(f"{r.seed}:{s:.2f}" for r, s in zip(recs, tune))])
    print(f"{len(records)} records in {args.out}; shared settings: "
          + ", ".join(f"{k}={v}" for k, v in sorted(shared.items()) if k not in QUIET) + "\n")
    print(tabulate(rows, headers=["setting", "runs", "tuning mean", "median", "min", f"below {args.below}",
                                  "optimizer steps", "wall s", "per seed"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
