"""Power of a study's design before anything runs: the probability of each verdict a primary comparison can end in
(a difference claim, equivalence, undecided, and for a sequential design a stop for futility) at a given true
difference, by simulating the design exactly.

One simulated comparison draws what the real one would measure: a dev-set offset that every seed shares (normal, sd
`example_se`: which examples the dev set happens to hold, the part more seeds never shrink) and, per seed, the paired
difference's own noise (normal, sd `seed_sd`: initialisation, batch order, training subset, and each run's own luck
on the dev examples). Each look computes the comparison's evidence from its seeds with the report's own statistics
(`suite.stats.evidence.evidence_arrays`: the seed sd estimated from the simulated seeds, so it varies from simulation
to simulation as it would in the study; the shared example variance as the jackknife gives it, a known number) and
decides it with `suite.stats.sequential.Design`, look by look, futility and the sign test included. A fixed-seed
study is the design with one look at its seeds: one look spends its whole level, so it decides as the report does
at that level.

Public names (what `suite.grid.power_table` calls):

- `Noise(seed_sd, example_se)`: a comparison's two noise sources, points x100.
- `simulate(noise, design, delta, margin, sims, seed) -> Chances`: each verdict's probability at true difference
  `delta` (method - reference, x100) and the mean number of seeds a comparison uses.
- `seeds_to_decide(noise, design, margin, target, ...)`: the fewest seeds (a fixed design's seeds, or a sequential
  design's cap with its start and step) with which a true difference of 0 is decided with probability `target`.
- `equivalence_limit(noise, design, margin)`: the probability of equivalence at a true difference of 0 with
  unlimited seeds: the dev set's shared offset alone decides it, so below `target` no number of seeds will do.
- `margin_to_decide(noise, design, target, ...)`: the smallest equivalence margin with which the design decides a
  true difference of 0 with probability `target`.
- `SIMULATIONS`: simulated comparisons per probability, enough for a Monte-Carlo error below 1 point.
- `draw_differences`, `decide_looks`: the simulation's two steps, the draws and each one's verdict look by look (the
  lab's futility study, lab/stats/futility.py, counts what the stops would have decided).
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
from scipy import stats

from suite.stats.evidence import evidence_arrays
from suite.stats.sequential import Design

# what the rest of the suite uses; other names are this module's own
__all__ = ["Chances", "MOST_SEEDS", "Noise", "SIMULATIONS", "equivalence_limit", "monte_carlo_error",
           "margin_to_decide", "seeds_to_decide", "simulate"]

SIMULATIONS = 4000    # the standard error of a probability is at most 0.5 / sqrt(4000) = 0.79 points
SEARCH_SIMULATIONS = 1000   # per step of the searches for seeds or a margin (their answers are rounded anyway)
MOST_SEEDS = 500      # the search for seeds gives up beyond this many


@dataclasses.dataclass(frozen=True)
class Noise:
    """A comparison's noise, points x100: the sd of one seed's paired difference, and the sd of the dev-set offset
    that all its seeds share (the square root of v_shared; 0 when unknown)."""

    seed_sd: float
    example_se: float = 0.0

    def __post_init__(self):
        if not (self.seed_sd >= 0 and self.example_se >= 0 and self.seed_sd + self.example_se > 0):
            raise ValueError(f"a comparison needs seed_sd >= 0 and example_se >= 0, not both 0 (got {self})")


@dataclasses.dataclass(frozen=True)
class Chances:
    """Each verdict's probability (they add up to 1), the part of `undecided` that a sequential design stopped for
    futility before its cap, and the mean number of seeds per comparison."""

    difference: float   # better or worse (p below the look's level)
    equivalent: float
    undecided: float
    futility: float
    mean_seeds: float
    sims: int

    @property
    def decided(self) -> float:
        return self.difference + self.equivalent


def monte_carlo_error(p: float, sims: int) -> float:
    """The standard error of a simulated probability."""
    return math.sqrt(max(p * (1 - p), 0.0) / sims)


def draw_differences(noise: Noise, delta: float, sims: int, seeds: int, seed: int) -> np.ndarray:
    """Simulated paired differences (sims, seeds): the true difference, the dev-set offset each simulated study
    shares over its seeds, and each seed's own noise. The same `seed` gives the same numbers (a repeatable table)."""
    rng = np.random.default_rng(seed)
    offset = rng.normal(0.0, noise.example_se, size=(sims, 1))
    return delta + offset + rng.normal(0.0, noise.seed_sd, size=(sims, seeds))


def decide_looks(diffs: np.ndarray, noise: Noise, design: Design, margin: float) -> tuple[np.ndarray, ...]:
    """(reason, verdict, seeds used) of every simulated comparison, deciding look by look the ones still open."""
    sims = diffs.shape[0]
    reason = np.full(sims, "continue", dtype=object)
    verdict = np.full(sims, "undecided", dtype=object)
    used = np.zeros(sims, dtype=int)
    open_ = np.ones(sims, dtype=bool)
    shared = noise.example_se ** 2
    for k, n in enumerate(design.looks):
        idx = np.flatnonzero(open_)
        if not len(idx):
            break
        ev = evidence_arrays(diffs[idx, :n], shared, margin)
        look = SimpleNamespace(**ev, margin=margin, example_se=noise.example_se, higher_is_better=True)
        r, v = design.decide(look, list(design.looks[:k + 1]))
        reason[idx], verdict[idx], used[idx] = r, v, n
        open_[idx] = np.asarray(r) == "continue"
    return reason, verdict, used


def simulate(noise: Noise, design: Design, delta: float, margin: float, sims: int = SIMULATIONS,
             seed: int = 0) -> Chances:
    """Each verdict's probability for a comparison with this noise under `design` (a fixed-seed study: one look)
    when the true difference is `delta` and the equivalence margin `margin` (both x100)."""
    diffs = draw_differences(noise, delta, sims, design.cap, seed)
    reason, verdict, used = decide_looks(diffs, noise, design, margin)
    claim = np.isin(verdict, ("better", "worse"))
    equivalent = verdict == "equivalent"
    return Chances(float(claim.mean()), float(equivalent.mean()), float(1 - claim.mean() - equivalent.mean()),
                   float((reason == "futility").mean()), float(used.mean()), sims)


def _scaled(design: Design) -> list[Design]:
    """The designs the search for seeds tries, fewest seeds first: a fixed design at 2, 3, ... seeds; a sequential
    design with its looks at the same fractions of a larger or smaller cap (looks at 5, 10, 15, 20 seeds: 2, 4, 6, 8;
    3, 6, 9, 12; ...), whose boundaries are the planned design's."""
    if len(design.looks) == 1:
        return [dataclasses.replace(design, looks=(n,)) for n in range(2, MOST_SEEDS + 1)]
    unit = math.gcd(*design.looks)
    base = [n // unit for n in design.looks]
    first = max(1, math.ceil(2 / base[0]))
    return [dataclasses.replace(design, looks=tuple(m * b for b in base))
            for m in range(first, MOST_SEEDS // base[-1] + 1)]


def equivalence_limit(noise: Noise, design: Design, margin: float) -> float:
    """P(equivalence | true difference 0) as the seeds grow without bound under the design's last-look level: the
    seed part of se vanishes, and the TOST needs |offset| + z * example_se < margin for the shared dev-set offset."""
    if noise.example_se == 0:
        return 1.0
    z = stats.norm.isf(design.levels(design.looks)[1])
    room = margin - z * noise.example_se
    return float(max(2 * stats.norm.cdf(room / noise.example_se) - 1, 0.0))


def seeds_to_decide(noise: Noise, design: Design, margin: float, target: float = 0.8,
                    sims: int = SEARCH_SIMULATIONS, seed: int = 0) -> float:
    """The fewest seeds (a sequential design: the cap, its looks at the planned fractions of it) with which a true
    difference of 0 ends in a decision with probability `target`; inf when MOST_SEEDS do not (the dev set's shared
    noise can keep equivalence out of reach). The decision probability grows with seeds: the search bisects."""
    if equivalence_limit(noise, design, margin) + design.alpha < target:
        return math.inf   # the shared dev-set noise alone keeps a decision below the target
    designs = _scaled(design)

    def enough(k: int) -> bool:
        return simulate(noise, designs[k], 0.0, margin, sims, seed).decided >= target

    if not designs or not enough(len(designs) - 1):
        return math.inf
    lo, hi = 0, len(designs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if not enough(mid) else (lo, mid)
    return float(designs[lo].cap)


def margin_to_decide(noise: Noise, design: Design, target: float = 0.8, sims: int = SEARCH_SIMULATIONS,
                     seed: int = 0, tolerance: float = 0.02) -> float:
    """The smallest equivalence margin (x100) with which the design decides a true difference of 0 with probability
    `target` (to `tolerance` relative); the decision probability grows with the margin."""
    hi = max(noise.seed_sd, noise.example_se, 1e-6)
    while simulate(noise, design, 0.0, hi, sims, seed).decided < target:
        hi *= 2
        if hi > 1e6:
            return math.inf
    lo = 0.0
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if simulate(noise, design, 0.0, mid, sims, seed).decided < target else (lo, mid)
    return hi
