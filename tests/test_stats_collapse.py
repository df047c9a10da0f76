"""Collapse as its own endpoint (suite.stats.collapse, suite.stats.evidence): degenerate runs are told by their
behaviour, the score is compared among the seeds where neither run degenerated, and how often each method
degenerates has its own exact test. The level of the score test is checked where one arm collapses rarely, in a world
built from the quick-preset study's real STS-B runs, at the sequential design's own per-look levels."""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from suite.stats.collapse import degenerate, degenerate_test
from suite.stats.evidence import RunOutcome, compare_runs, evidence_arrays
from suite.stats.sequential import Design, family_alpha

RUNS = Path(__file__).resolve().parents[1] / "results" / "runs"
real_records = pytest.mark.skipif(not RUNS.is_dir(), reason="the quick-preset study's records are not in this checkout")


def _classifier(pred, gold):
    return {"": {"index": np.arange(len(gold)), "label": np.asarray(gold), "logits": np.eye(2)[np.asarray(pred)]}}


def _regressor(pred, gold):
    return {"": {"index": np.arange(len(gold)), "label": np.asarray(gold, dtype=float),
                 "logits": np.asarray(pred, dtype=float)[:, None]}}


def test_degenerate_is_a_behaviour_not_a_score():
    rng = np.random.default_rng(0)
    gold = (rng.random(400) < 0.68).astype(int)
    assert degenerate(_classifier(np.ones(400, dtype=int), gold), False)           # constant
    nearly = np.ones(400, dtype=int)
    nearly[:5] = 0                                                                 # 98.75% one class
    assert degenerate(_classifier(nearly, gold), False)
    # a poor MRPC-like run: 74% positive, some signal; not degenerate though its score is near the majority class
    poor = np.where(rng.random(400) < 0.6, gold, (rng.random(400) < 0.74).astype(int))
    assert not degenerate(_classifier(poor, gold), False)
    labels = rng.normal(size=1500)
    assert degenerate(_regressor(np.full(1500, 2.5), labels), True)               # constant
    assert degenerate(_regressor(rng.normal(size=1500), labels), True)            # correlation ~0
    assert not degenerate(_regressor(0.3 * labels + rng.normal(size=1500), labels), True)
    assert degenerate(None, False) is None


def test_degenerate_test_is_mcnemars_exact_test_and_holds_its_level():
    assert degenerate_test([True] * 7 + [False] * 13, [False] * 20) == pytest.approx(2 * 0.5 ** 7)
    assert degenerate_test([True, False], [True, False]) == 1.0                    # concordant seeds say nothing
    rng = np.random.default_rng(1)
    flags = rng.random((20000, 2, 20)) < 0.15                                      # equal rates
    p = np.array([degenerate_test(a, b) for a, b in flags[:4000]])
    assert np.mean(p < 0.05) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000)


def test_compare_runs_scores_healthy_seeds_and_tests_collapse_apart():
    rng = np.random.default_rng(2)
    gold = (rng.random(300) < 0.6).astype(int)
    method, reference = {}, {}
    for seed in range(1, 9):
        good = np.where(rng.random(300) < 0.8, gold, 1 - gold)
        if seed <= 3:  # the method labels everything with one class at seeds 1-3
            pred = np.ones(300, dtype=int)
        else:
            pred = np.where(rng.random(300) < 0.82, gold, 1 - gold)
        method[seed] = RunOutcome(100 * float((pred == gold).mean()), _classifier(pred, gold))
        reference[seed] = RunOutcome(100 * float((good == gold).mean()), _classifier(good, gold))
    ev = compare_runs("sst2", method, reference)
    assert (ev.n_paired, ev.n_seeds, ev.degenerate, ev.degenerate_reference) == (8, 5, 3, 0)
    healthy = [s for s in range(4, 9)]
    assert ev.diff == pytest.approx(np.mean([method[s].score - reference[s].score for s in healthy]))
    assert ev.collapse_p == pytest.approx(stats.binomtest(3, 3, 0.5).pvalue)
    vs_constant = compare_runs("sst2", method, reference, collapse_endpoint=False)
    assert vs_constant.n_seeds == 8 and vs_constant.degenerate == 0


@lru_cache(maxsize=None)
def stsb_pools() -> tuple[np.ndarray, np.ndarray]:
    """(vanilla's STS-B scores at the study's main setting, the scores of every STS-B run that degenerated)."""
    from suite.run.record import load_predictions

    healthy, degenerated = [], []
    for path in sorted(RUNS.glob("stsb__*.json")):
        rec = json.loads(path.read_text())
        cfg, score = rec["config"], 100 * rec["final"]["score"]
        if cfg["method"] == "vanilla" and cfg["train"]["max_train_samples"] == 1000:
            healthy.append(score)
        elif rec.get("predictions") and degenerate(load_predictions(RUNS / rec["predictions"]), True):
            degenerated.append(score)
    return np.array(healthy), np.array(degenerated)


def _healthy_pairs_rate(rng, sims: int, n: int, q: float, level: float) -> float:
    """Null rejection rate of the test among healthy pairs: both arms' healthy runs come from vanilla's real scores;
    the method's run degenerates with probability q (dropped with its pair)."""
    healthy, _ = stsb_pools()
    d = rng.choice(healthy, (sims, n)) - rng.choice(healthy, (sims, n))
    down = rng.random((sims, n)) < q
    kept = (~down).sum(axis=1)
    hits = 0
    for k in np.unique(kept[kept >= 2]):
        rows = kept == k
        p = evidence_arrays(d[rows][~down[rows]].reshape(-1, k), 0.0)["p"]
        hits += int(np.sum(np.nan_to_num(p, nan=1.0) < level))
    return hits / sims


def _all_pairs_rate(rng, sims: int, n: int, q: float, level: float) -> float:
    """The test over all pairs (before the collapse endpoint) where the method's mean equals the reference's: its
    healthy runs are raised by what its rare collapses cost it."""
    healthy, degenerated = stsb_pools()
    down = rng.random((sims, n)) < q
    method = np.where(down, rng.choice(degenerated, (sims, n)), rng.choice(healthy, (sims, n)))
    method = method + q * (healthy.mean() - degenerated.mean())
    p = evidence_arrays(method - rng.choice(healthy, (sims, n)), 0.0)["p"]
    return float(np.mean(np.nan_to_num(p, nan=1.0) < level))


@real_records
@pytest.mark.parametrize("q", [0.1, 0.35])     # 2 of 20 seeds (AttendOut on STS-B), 7 of 20 (the naive form on CoLA)
def test_score_test_holds_the_per_look_levels_when_one_arm_collapses_rarely(q):
    """At the published design's own levels (36 primary comparisons, looks at 5-20 seeds, O'Brien-Fleming: 0.00018
    at 15 seeds, 0.0013 at 20), the test among healthy pairs rejects a true null at most at the level (it is
    conservative there, 0.2-0.45 of it: the real scores are bounded, so the t's far tail overstates their tails). The
    test over all pairs, which the quick-preset study used, makes false claims tens to hundreds of times the level."""
    healthy, degenerated = stsb_pools()
    assert len(healthy) >= 20 and len(degenerated) >= 5
    design = Design((5, 10, 15, 20), family_alpha(0.05, 36))
    rng = np.random.default_rng(int(q * 100))
    sims = 100_000
    for look, n in ((3, 15), (4, 20)):
        level = design.levels((5, 10, 15, 20)[:look])[0]
        mc = 3 * math.sqrt(level / sims)
        assert _healthy_pairs_rate(rng, sims, n, q, level) <= level + mc, (q, n, level)
        assert _all_pairs_rate(rng, sims, n, q, level) > 3 * level, (q, n, level)


@real_records
def test_score_test_is_nominal_at_the_per_look_levels_where_healthy_scores_are_normal():
    """The same world with healthy scores drawn from a normal of vanilla's real STS-B mean and spread (the t's own
    assumption) and the method's runs degenerating in 35% of seeds: the healthy-pair test rejects a true null at the
    per-look level itself (0.0013 at 20 seeds), within three binomial standard errors."""
    healthy, _ = stsb_pools()
    design = Design((5, 10, 15, 20), family_alpha(0.05, 36))
    level = design.levels((5, 10, 15, 20))[0]
    rng = np.random.default_rng(11)
    sims, n = 400_000, 20
    d = rng.normal(0, healthy.std(ddof=1), (sims, n)) - rng.normal(0, healthy.std(ddof=1), (sims, n))
    down = rng.random((sims, n)) < 0.35
    kept = (~down).sum(axis=1)
    hits = 0
    for k in np.unique(kept[kept >= 2]):
        rows = kept == k
        p = evidence_arrays(d[rows][~down[rows]].reshape(-1, k), 0.0)["p"]
        hits += int(np.sum(p < level))
    assert abs(hits / sims - level) <= 3 * math.sqrt(level / sims), (hits / sims, level)


@real_records
def test_the_published_colas_degenerate_runs_are_its_constant_predictors():
    """On the committed records, the runs called degenerate are exactly CoLA's 17 (nearly) constant predictors
    (MCC 0 to 0.6) and STS-B's runs with no correlation; no MRPC or SST-2 run degenerates."""
    from suite.run.record import load_predictions

    found: dict[str, list[float]] = {}
    for path in sorted(RUNS.glob("*.json")):
        rec = json.loads(path.read_text())
        task = rec["config"]["task"]
        if rec.get("predictions") and degenerate(load_predictions(RUNS / rec["predictions"]), task == "stsb"):
            found.setdefault(task, []).append(100 * rec["final"]["score"])
    assert set(found) == {"cola", "stsb"}
    assert len(found["cola"]) == 17 and max(found["cola"]) < 1.0
    assert max(found["stsb"]) < 10.0


def test_a_comparison_where_every_seed_degenerated_still_reports_its_collapse_endpoint():
    from suite.report.comparisons import Comparison, difference_text

    c = Comparison("topk", "cola", 0, n_paired=6, degenerate=6, collapse_verdict="degenerates more")
    assert difference_text(c) == "– (0 of 6 seeds; degenerate 6 vs 0: degenerates more)"
    assert difference_text(Comparison("topk", "cola", 0)) == "–"


def test_no_posterior_and_no_dev_part_where_the_data_cannot_give_them():
    """Identical differences give no test, so no P(Δ within ±m); one seed's predictions cannot tell the dev set's
    shared part from that run's own luck, so the evidence stays over seeds only."""
    same = {s: RunOutcome(80.3) for s in (1, 2, 3)}
    base = {s: RunOutcome(80.0) for s in (1, 2, 3)}
    ev = compare_runs("sst2", same, base)
    assert not ev.tested and math.isnan(ev.p_rope)
    rng = np.random.default_rng(4)
    gold = (rng.random(200) < 0.5).astype(int)
    method = {s: RunOutcome(80.0 + s, _classifier(np.where(rng.random(200) < 0.8, gold, 1 - gold), gold) if s == 1
                            else None) for s in (1, 2, 3)}
    reference = {s: RunOutcome(79.0, _classifier(np.where(rng.random(200) < 0.8, gold, 1 - gold), gold))
                 for s in (1, 2, 3)}
    one = compare_runs("sst2", method, reference)
    assert not one.has_examples and one.example_se == 0 and one.n_seeds == 3


def test_a_benchmark_average_of_resampled_tasks_is_not_marked_seeds_only():
    """Tasks whose shared dev-set part was estimated at 0 still resampled their examples; their average says so."""
    from suite.stats.evidence import Evidence, averaged_evidence

    task = Evidence(3, 0.1, 0.5, 2.0, -1.0, 1.0, 0.8, 0.5, 1.0, seed_sd=0.8, example_se=0.0, example_run_se=0.7)
    ev = averaged_evidence({1: 80.0, 2: 81.0, 3: 79.5}, {1: 79.0, 2: 80.5, 3: 80.0}, [task, task])
    assert ev.has_examples and ev.example_se == 0.0
