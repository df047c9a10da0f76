"""`python -m lab.attendout reassess [RESULTS.json]`: what the long-horizon runs can and cannot say,
recomputed from their results file (default lab/attendout/results/longhorizon/results.json), as markdown.

- Whether the model learned the task at all (training loss over the first and last 100 steps, every arm): a model
  near chance has nothing to overfit, so its look-ahead reward has little to tell G.
- The real reward's correlation with a layer's drop share, pooled over the real-reward runs and both layers, with
  its standard error; the bound at two standard errors against the planted control's correlation, and the updates
  that bound needs by the control's own 1/c² scaling.
- A paired reading the placebo-band rule cannot see: each layer's drop-rate change over the run, real reward against
  placebo at each g_lr (t-test, Holm over the layers x g_lrs).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "lab" / "attendout" / "results" / "longhorizon" / "results.json"


def _change(run: dict, layer: int) -> float:
    """A layer's drop rate on the fixed reference batch, last probe minus first."""
    probes = [p for p in run["probes"] if p.get("reference") is not None]
    return probes[-1]["reference"][layer] - probes[0]["reference"][layer]


def reassess(results: dict) -> list[str]:
    runs = results["runs"]
    lines = ["## Training loss: did the model learn the task?", "",
             "| arm | runs | first 100 steps | last 100 steps |", "|---|---:|---|---|"]
    for arm in ("real", "placebo", "planted"):
        mine = [r for r in runs if r["arm"] == arm]
        first, last = [r["loss_first100"] for r in mine], [r["loss_last100"] for r in mine]
        lines.append(f"| {arm} | {len(mine)} | {min(first):.3f}-{max(first):.3f} | {min(last):.3f}-{max(last):.3f} |")
    lines += ["", f"Chance on two balanced classes is ln 2 = {math.log(2):.3f}.", ""]

    real = np.array([r["share_reward_corr"] for r in runs if r["arm"] == "real"])
    flat = real.ravel()
    mean, se = flat.mean(), flat.std(ddof=1) / math.sqrt(flat.size)
    bound = abs(mean) + 2 * se
    planted = [r for r in runs if r["arm"] == "planted" and r["g_lr"] == min(r["g_lr"] for r in runs)]
    c_planted = float(np.mean([r["share_reward_corr"][0] for r in planted]))
    lines += ["## How much the real reward says about a layer's drop rate", "",
              f"Correlation of the reward difference with the drop-share difference, pooled over the {len(real)} "
              f"real-reward runs and both layers ({flat.size} values): mean {mean:+.4f}, standard error {se:.4f}, "
              f"so |c| <= {bound:.4f} at two standard errors. The planted control's correlation at the smallest "
              f"g_lr is {c_planted:.4f}, {c_planted / bound:.1f}x that bound; it left the placebo band by update 100, "
              f"so by its 1/c² scaling the bound needs about {100 * (c_planted / bound) ** 2:,.0f} updates (the runs "
              f"had {runs[0]['g_updates']:,}).", ""]

    lines += ["## Drop-rate change over the run, real reward against placebo (two-sample t-test over seeds)", "",
              "| g_lr | layer | real (per seed) | placebo (per seed) | p | p, Holm over the table |",
              "|---:|---:|---|---|---:|---:|"]
    rows = []
    for g in sorted({r["g_lr"] for r in runs}):
        for layer in range(real.shape[1]):
            a = [_change(r, layer) for r in runs if r["arm"] == "real" and r["g_lr"] == g]
            b = [_change(r, layer) for r in runs if r["arm"] == "placebo" and r["g_lr"] == g]
            rows.append((g, layer, a, b, stats.ttest_ind(a, b).pvalue))
    holm = multipletests([row[4] for row in rows], method="holm")[1]
    for (g, layer, a, b, p), q in zip(rows, holm):
        lines.append(f"| {g:g} | {layer} | {', '.join(f'{x:+.3f}' for x in a)} | {', '.join(f'{x:+.3f}' for x in b)} "
                     f"| {p:.3f} | {q:.3f} |")
    return lines


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    shown = path.resolve().relative_to(ROOT) if ROOT in path.resolve().parents else path
    print("\n".join([f"# Reassessment of `{shown}`", "",
                     f"Computed by `python -m lab.attendout reassess {shown}`.", "",
                     *reassess(json.loads(path.read_text()))]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
