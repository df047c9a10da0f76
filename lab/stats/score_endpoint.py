"""False difference claims of the score endpoint's rules where runs fail rarely: in nulls built from the published
study's real STS-B and CoLA pairs, in the least favourable of them for the rule (the median 0, the mean pushed up so
that the t agrees), and in a mixture where collapse is the low tail of how a run would have scored.
docs/statistics.md quotes the table this prints (results/statistics_checks/score_endpoint.txt).

Rules, each run as the whole sequential design of the published study (looks at 5, 10, 15, 20 seeds,
O'Brien-Fleming spending of 0.05 / 36, the information fraction by planned seeds, no futility stop: futility only
ever removes claims, so these are upper bounds), deciding with `suite.stats.sequential.Design`:

- `all-pair t`: the t over every paired seed (the suite before the collapse endpoint);
- `healthy t`: the t over the seeds where neither run degenerated (the suite before the sign test);
- `t + sign`: the healthy t, and at every look the exact sign test over every paired seed, a degenerate run losing
  its seed (`suite.stats.sign`: the sequential design's rule now);
- `sign from 10`: the same with the sign test only from 10 paired seeds on (the fixed-sample report's rule),
  which shows why the design needs it at every look;
- `sign alone`: the rule's sign test with a t that always agrees: what the rule would reach where the t never
  stands in its way (the sign test is exact given the dev set, but the dev-set offset its seeds share moves them
  together);
- `t + exact sign` (an alternative checked, not used): the sign test given boundaries of its own, exact on its
  binomial walk over the looks and spent by Pocock's function so that the lattice's sizes are used (0.85 of the
  level at 5, 10, 15, 20 seeds, against 0.31 at the t's O'Brien-Fleming levels).

Worlds (each simulated study draws 20 paired seeds, and one dev-set offset shared by its seeds, normal with the
comparison's published shared dev-example se):

- `real`: the published 20 paired seeds of a comparison (both runs of a seed, so the seed's shared training draw
  stays paired), resampled with replacement, each resampled difference jittered (normal, sd 10% of the healthy
  differences' sd: real runs never tie, and exact duplicates give a t of no spread at 5 seeds), every score of the
  method shifted so that a null holds: `median` (the sign test's: a resampled, jittered seed as likely won as lost,
  the dev-set offset aside; what `t + sign` claims against) or `mean` (the healthy-pair mean 0: the t's null, the
  audit's world). A shift moves only healthy runs: a degenerate run stays degenerate. The median is that of the
  jittered distribution: the plain median of the 20 points is off by how the jitter carries points across it.
- `skewed`: the `median` world with the healthy differences above their median pushed up by 1, 3 or 6 of their
  sd (the jitter kept at 10% of the unskewed sd), then shifted back to the median null: the median stays 0 while the
  mean grows, so the t agrees with the sign test's "better" more and more often. These are the worlds least
  favourable to the rule; its size is its largest rate over the nulls.
- `mixture`: paired latent scores (a shared seed effect, sd 1.5, and each run's own, sd 3: CoLA's vanilla spread),
  the two methods identical, except that the method's run collapses (a constant predictor, score 0 against ~13)
  whenever its latent score falls in its lowest `q`. A "better" claim is false there under any reading (the
  method is never better); rates are of "better" only, against the level's one-sided half.

    OMP_NUM_THREADS=1 nice -n 10 python -m lab.stats.score_endpoint [--sims 100000]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy import optimize, stats

from suite.stats.evidence import evidence_arrays
from suite.stats.sequential import Design, family_alpha, spent
from suite.stats.sign import SIGN_GUARD_SEEDS, sign_p

ROOT = Path(__file__).resolve().parents[2]
LOOKS = (5, 10, 15, 20)
ALPHA = family_alpha(0.05, 36)
WORLDS = [("stsb", "attendout"), ("stsb", "drophead"), ("stsb", "scores_dropout_naive"),
          ("cola", "scores_dropout_naive"), ("cola", "scores_dropout_layerwise"), ("cola", "topk")]
RULES = ("all-pair t", "healthy t", "t + sign", "sign from 10", "sign alone", "t + exact sign")
SKEWS = (1, 3, 6)   # the skewed worlds: the healthy differences above the median pushed up by these sds
JITTER = 0.1   # of the healthy differences' sd: resampled seeds never tie exactly, as real runs never do


def published_pairs(task: str, method: str, reference: str = "vanilla"):
    """(paired differences x100, the method's and the reference's degenerate flags, the shared dev-example se) of
    a primary comparison's 20 published paired seeds, each run as every verdict scores it (`RunOutcome.of`); the se
    is its last look's (results/until_decided.json)."""
    from suite.grid.power_table import pilot_outcomes
    from suite.run.record import load_predictions
    from suite.stats.collapse import degenerate

    runs = pilot_outcomes(ROOT / "results")
    a, b = runs["dev", task, method], runs["dev", task, reference]
    seeds = sorted(set(a) & set(b))

    def flag(outcome):
        predictions = outcome.predictions
        if isinstance(predictions, (str, Path)):
            predictions = load_predictions(predictions)
        return bool(degenerate(predictions, task == "stsb"))

    d = np.array([a[s].score - b[s].score for s in seeds])
    state = json.loads((ROOT / "results" / "until_decided.json").read_text())
    look = next(c for c in state["comparisons"] if (c["task"], c["method"]) == (task, method))["looks"][-1]
    return d, np.array([flag(a[s]) for s in seeds]), np.array([flag(b[s]) for s in seeds]), look["example_se"]


def _look_evidence(d, healthy, score_sign, n, example_se) -> dict[str, np.ndarray]:
    """Every simulated study's evidence at a look of n seeds: the t over its healthy pairs, the sign test over all."""
    sims = d.shape[0]
    h = healthy[:, :n]
    count = h.sum(axis=1)
    keys = ("diff", "se", "df", "low", "high", "p", "p_equiv", "seed_sd")
    ev = {k: np.full(sims, np.nan) for k in keys}
    for c in np.unique(count[count >= 2]):
        rows = np.flatnonzero(count == c)
        found = evidence_arrays(d[rows, :n][h[rows]].reshape(-1, c), example_se ** 2)
        for k in keys:
            ev[k][rows] = found[k]
    signs = score_sign[:, :n]
    ev["p_sign"] = sign_p((signs > 0).sum(1), (signs < 0).sum(1))
    ev["sign_excess"] = (signs > 0).sum(1) - (signs < 0).sum(1)
    return ev


@lru_cache(maxsize=None)
def exact_sign_bounds(counts: tuple[int, ...], alpha: float, cap: int) -> tuple[float, ...]:
    """The `t + exact sign` alternative's boundaries: per look, the smallest |wins - losses| whose exact probability
    of a first crossing, on the null's binomial walk over the looks' untied seed counts, keeps the crossings so far
    within Pocock's spending of alpha (the last look: all of it); inf where no count may cross."""
    walk, before, spent_so_far, out = np.ones(1), 0, 0.0, []   # walk: P(wins = w, no crossing yet)
    for k, n in enumerate(counts):
        if n > before:
            walk = np.convolve(walk, stats.binom.pmf(np.arange(n - before + 1), n - before, 0.5))
        allowed = alpha if k == len(counts) - 1 else spent(min(n / cap, 1.0), alpha, "pocock")
        excess = np.abs(2 * np.arange(n + 1) - n)
        fits = [e for e in sorted(set(excess.tolist()) - {0})
                if spent_so_far + walk[excess >= e].sum() <= allowed + 1e-15]
        bound = min(fits) if fits else math.inf
        if fits:
            spent_so_far += walk[excess >= bound].sum()
            walk = np.where(excess >= bound, 0.0, walk)
        out.append(bound)
        before = n
    return tuple(out)


def decide(d: np.ndarray, gone_m: np.ndarray, gone_r: np.ndarray, example_se: float,
           design: Design) -> dict[str, tuple[float, float]]:
    """{rule: (P(a "better" claim), P(a "worse" claim))} over the looks of `design`, for simulated paired
    differences d (sims, cap) with degenerate flags per arm."""
    sims = d.shape[0]
    # the sign test's paired outcome: a degenerate run loses its seed, both degenerate ties
    score_sign = np.where(gone_m & ~gone_r, -1.0, np.where(gone_r & ~gone_m, 1.0, np.sign(d)))
    score_sign = np.where(gone_m & gone_r, 0.0, score_sign)
    untied = np.stack([(score_sign[:, :n] != 0).sum(1) for n in design.looks], axis=1)
    masks = {"all": np.ones_like(gone_m), "healthy": ~(gone_m | gone_r)}
    state = {rule: (np.ones(sims, bool), np.zeros(sims, bool), np.zeros(sims, bool)) for rule in RULES}
    for k, n in enumerate(design.looks):
        evidence = {name: _look_evidence(d, mask, score_sign, n, example_se) for name, mask in masks.items()}
        crossed = np.zeros(sims)   # the exact sign boundary's crossing at this look: +1 wins, -1 losses, 0 none
        for counts in {tuple(row) for row in untied[:, :k + 1].tolist()}:
            rows = np.all(untied[:, :k + 1] == counts, axis=1)
            bound = exact_sign_bounds(counts, ALPHA, design.cap)[k]
            excess = evidence["healthy"]["sign_excess"][rows]
            crossed[rows] = np.where(np.abs(excess) >= bound, np.sign(excess), 0.0)
        for rule, (open_, better, worse) in state.items():
            ev = dict(evidence["all" if rule == "all-pair t" else "healthy"])
            if rule in ("all-pair t", "healthy t") or (rule == "sign from 10" and n < SIGN_GUARD_SEEDS):
                ev.update(p_sign=np.zeros(sims), sign_excess=np.sign(ev["diff"]))   # no sign test: one that agrees
            elif rule == "sign alone":   # a t that always agrees: the claim is the sign test's
                ev.update(p=np.zeros(sims), diff=ev["sign_excess"].astype(float))
            elif rule == "t + exact sign":
                ev.update(p_sign=np.where(crossed != 0, 0.0, 1.0), sign_excess=crossed)
            idx = np.flatnonzero(open_)
            look = SimpleNamespace(**{key: v[idx] for key, v in ev.items()}, margin=1.0, example_se=example_se,
                                   higher_is_better=True)
            reason, verdict = design.decide(look, list(design.looks[:k + 1]))
            better[idx] |= verdict == "better"
            worse[idx] |= verdict == "worse"
            open_[idx] = reason == "continue"
    return {rule: (float(b.mean()), float(w.mean())) for rule, (_, b, w) in state.items()}


def shift_to_null(d, gone_m, gone_r, null: str, jitter: float) -> np.ndarray:
    """The method's healthy scores moved so that the world's null holds over its published pairs, each resampled
    difference jittered by normal noise of sd `jitter`."""
    healthy = ~(gone_m | gone_r)
    if null == "mean":
        return d - d[healthy].mean()
    # the median of the jittered distribution: a resampled seed as likely won as lost (a degenerate method run
    # always loses, a degenerate reference run always wins, both degenerate tie)
    wins, losses = (gone_r & ~gone_m).sum(), (gone_m & ~gone_r).sum()

    def excess(shift: float) -> float:
        won = stats.norm.sf((shift - d[healthy]) / jitter)
        return float(won.sum() + wins - (1 - won).sum() - losses)

    reach = np.abs(d).max() + 20 * jitter
    return d - optimize.brentq(excess, -reach, reach, xtol=1e-12)


def real_world(task, method, null, sims, rng, design, skew: float = 0.0):
    """Simulated studies from a published comparison's pairs (see the module docstring); `skew`: the healthy
    differences above their median pushed up by that many of their sd before the shift to the null."""
    d, gone_m, gone_r, example_se = published_pairs(task, method)
    healthy = ~(gone_m | gone_r)
    sd = d[healthy].std(ddof=1)
    d = np.where(healthy & (d > np.median(d[healthy])), d + skew * sd, d)
    jitter = JITTER * sd
    d = shift_to_null(d, gone_m, gone_r, null, jitter)
    pick = rng.integers(0, len(d), (sims, design.cap))
    offset = rng.normal(0.0, example_se, (sims, 1))
    return d[pick] + offset + rng.normal(0.0, jitter, (sims, design.cap)), gone_m[pick], gone_r[pick], example_se


def mixture_world(q, sims, rng, design, shared=1.5, own=3.0, level=13.0, example_se=0.5):
    """Identical methods, except that the method's run collapses (scores 0) in the lowest q of its latent score."""
    seed = rng.normal(0.0, shared, (sims, design.cap))
    method = level + seed + rng.normal(0.0, own, (sims, design.cap))
    reference = level + seed + rng.normal(0.0, own, (sims, design.cap))
    gone = method < level + stats.norm.ppf(q) * math.hypot(shared, own)
    method = np.where(gone, 0.0, method)
    offset = rng.normal(0.0, example_se, (sims, 1))
    return method - reference + offset, gone, np.zeros_like(gone), example_se


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", type=int, default=100_000)
    args = parser.parse_args(argv)
    design = Design(LOOKS, ALPHA, futility=0.0)
    mc = math.sqrt(ALPHA / args.sims)
    started = time.time()
    print(f"# python -m lab.stats.score_endpoint --sims {args.sims}")
    print(f"# machine: {platform.machine()}, {os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.2f} at the start; "
          f"python {sys.version.split()[0]}, numpy {np.__version__}")
    print(f"# design: looks {LOOKS}, O'Brien-Fleming, alpha 0.05/36 = {ALPHA:.5f} per comparison, no futility stop; "
          f"{args.sims:,} simulated studies per world: Monte-Carlo se of a rate at the level {mc:.1e} "
          f"({mc / ALPHA:.0%} of it)")
    print("# false claims as a multiple of the level (better + worse; in the mixture, better against level / 2)")
    print(f"{'world':48} " + "  ".join(f"{r:>14}" for r in RULES))
    rng = np.random.default_rng(20260512)
    worlds = [(task, method, null, 0.0) for task, method in WORLDS for null in ("median", "mean")]
    worlds += [(task, method, "median", skew) for skew in SKEWS for task, method in WORLDS]
    for task, method, null, skew in worlds:
        found = decide(*real_world(task, method, null, args.sims, rng, design, skew), design)
        cells = [f"{(b + w) / ALPHA:7.2f} ({b / ALPHA:.1f}b)" for b, w in found.values()]
        name = f"real {task} {method}, {null} null" + (f", skewed {skew:g} sd" if skew else "")
        print(f"{name:48} " + "  ".join(f"{c:>14}" for c in cells), flush=True)
    for q in (0.1, 0.35):
        found = decide(*mixture_world(q, args.sims, rng, design), design)
        cells = [f"{b / (ALPHA / 2):7.2f}" for b, _ in found.values()]
        print(f"{f'mixture, collapse in the lowest {q:.0%}':48} " + "  ".join(f"{c:>14}" for c in cells), flush=True)
    print(f"# exact sign boundaries at looks {LOOKS}: |wins - losses| >= "
          f"{exact_sign_bounds(LOOKS, ALPHA, LOOKS[-1])} (inf: none)")
    print(f"# {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
