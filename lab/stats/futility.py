"""How the futility stop behaves at the published design's own level (looks at 5, 10, 15, 20 seeds, O'Brien-Fleming
spending of 0.05 / 36 per comparison, futility 0.1) and at a true difference of 0, the equivalence question, with
each task's noise. docs/sequential.md quotes the table this prints (results/statistics_checks/futility.txt).

For each rule the same simulated comparisons run twice, with the futility stop and without it (the design as it
would run to the cap), so a comparison stopped for futility can be followed to what the cap would have said:

- `before`: predictive power with the seed sd taken as its estimate, a stop possible from the first look (5 seeds);
- `sd integrated`: predictive power averaged over the seed sd's posterior (`Design.predictive_power`), from the
  first look;
- `now`: averaged over the seed sd, and no stop before 10 compared seeds (`Design.futility_from`): the rule, at the
  published study's threshold (0.1);
- `default 0.07`: the same rule at its default threshold (`DEFAULT_FUTILITY`), which keeps the share of stopped
  comparisons that the cap would have decided under 10% where 0.1 let it reach 11-14% (SST-2's planner inputs).

    OMP_NUM_THREADS=1 nice -n 10 python -m lab.stats.futility [--sims 20000]
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time

import numpy as np

from suite.stats.design_power import Noise, decide_looks, draw_differences
from suite.stats.sequential import DEFAULT_FUTILITY, Design, family_alpha

LOOKS = (5, 10, 15, 20)
# each task's noise (seed_sd, example_se, points x100): the inputs `python -m suite plan --study
# studies/glue-minilm.yaml --until-decided` reads from the published records (docs/statistics.md), the median
# comparison's; and SST-2's at the low end of its comparisons' dev-set parts (0.02), where futility is least safe
NOISE = {"sst2": Noise(0.95, 0.09), "sst2 low": Noise(0.95, 0.02), "mrpc": Noise(1.16, 0.18),
         "cola": Noise(3.65, 0.33), "stsb": Noise(5.52, 0.13)}


@dataclasses.dataclass(frozen=True)
class PointSd(Design):
    """The rule before: the seed sd taken as known at its estimate."""

    def predictive_power(self, ev, n, sd_uncertainty: bool = False):
        return super().predictive_power(ev, n, sd_uncertainty=False)


def run(noise: Noise, design: Design, delta: float, sims: int, seed: int) -> dict[str, float]:
    diffs = draw_differences(noise, delta, sims, design.cap, seed)
    reason, verdict, used = decide_looks(diffs, noise, design, 1.0)
    _, to_cap, _ = decide_looks(diffs, noise, dataclasses.replace(design, futility=0.0), 1.0)
    stopped = reason == "futility"
    decided_later = stopped & (to_cap != "undecided")
    return {"futility": stopped.mean(), "first look": (stopped & (used == LOOKS[0])).mean(),
            "would decide": decided_later.sum() / max(stopped.sum(), 1), "stopped": int(stopped.sum()),
            "equivalent": (verdict == "equivalent").mean(), "equivalent to cap": (to_cap == "equivalent").mean(),
            "claims": np.isin(verdict, ("better", "worse")).mean(), "mean seeds": used.mean()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", type=int, default=20_000)
    args = parser.parse_args(argv)
    alpha = family_alpha(0.05, 36)
    started = time.time()
    print(f"# python -m lab.stats.futility --sims {args.sims}")
    print(f"# machine: {platform.machine()}, {os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.2f} at the start; "
          f"python {sys.version.split()[0]}, numpy {np.__version__}")
    print(f"# design: looks {LOOKS}, O'Brien-Fleming, alpha 0.05/36 = {alpha:.5f} per comparison, futility 0.1 "
          f"(the rule at its default: {DEFAULT_FUTILITY:g}), "
          f"margin 1; {args.sims:,} simulated comparisons per row (the same draws for both rules): Monte-Carlo se "
          f"of a probability at most {50 / math.sqrt(args.sims):.2f} points")
    print("# would decide: of the comparisons stopped for futility, the share the same draws decide by the cap")
    head = ["task", "true diff", "rule", "futility stops", "at 1st look", "would decide", "P(equivalent)",
            "without futility", "false claims", "mean seeds"]
    print(" | ".join(head))
    for task, noise in NOISE.items():
        for delta in (0.0, 1.0):
            for name, design in (("before", PointSd(LOOKS, alpha, futility=0.1, futility_from=0)),
                                 ("sd integrated", Design(LOOKS, alpha, futility=0.1, futility_from=0)),
                                 ("now", Design(LOOKS, alpha, futility=0.1)),
                                 (f"default {DEFAULT_FUTILITY:g}", Design(LOOKS, alpha))):
                r = run(noise, design, delta, args.sims, seed=7)
                mc = math.sqrt(max(r["would decide"] * (1 - r["would decide"]), 1e-12) / max(r["stopped"], 1))
                print(" | ".join([task, f"{delta:g}", name, f"{r['futility']:.1%}", f"{r['first look']:.1%}",
                                  f"{r['would decide']:.1%} ± {mc:.1%}", f"{r['equivalent']:.1%}",
                                  f"{r['equivalent to cap']:.1%}", f"{r['claims']:.2%}", f"{r['mean seeds']:.1f}"]),
                      flush=True)
    print(f"# {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
