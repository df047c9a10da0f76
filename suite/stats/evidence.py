"""The evidence of one comparison (a method against the reference on one task) over both noise sources: the seeds a
study ran and the dev examples it was scored on.

Public names (what `suite.stats.sequential`, `suite.grid` and `suite.report` call):

- `RunOutcome(score, predictions=None)`: one run; `score` on the x100 display scale (the headline of the split the
  run is scored on, times 100), `predictions` the run's per-example predictions on that split (the `.npz` sidecar:
  a path, or the loaded `{suffix: {"index", "label", "logits"}}` of `suite.run.record.load_predictions`), None when
  the run kept none. `RunOutcome.of(record, folder)` is the one rule that reads them from a record.
- `Evidence`: n_seeds, diff (method - reference, x100, positive = method's score higher), se, df, low, high, p
  (two-sided test of no difference), p_equiv (TOST of |diff| < margin), margin, and the parts behind se: seed_sd
  (sd of the per-seed paired differences), example_se (the dev-example part of se: the part all seeds share, 0
  without predictions) with its interval example_se_interval (`suite.stats.examples.shared_interval`; NaNs below 3
  seeds), example_run_se (each run's own dev-example luck, which s_d already holds: shown, never
  added) and higher_is_better (the task's metric direction: "better" means higher only when it is True); and what
  the sign test decides about (`suite.stats.sign`): median (the median paired difference over every paired seed, a
  degenerate run's difference the worst there is), median_low and median_high (its order-statistic interval at the
  test's level), wins and losses (the seeds where the method's score is higher and lower), p_sign.
- `compare_runs(task, method, reference, margin, level=0.95, seed=None) -> Evidence`, runs keyed by seed; `seed`
  only matters for metrics without a closed form (see below): `bootstrap_seed(task, method, reference)`.
- `bootstrap_seed(*identity) -> int`: the seed a comparison's identity gives (the one place that rule is written).
- `averaged_evidence(method, reference, tasks, margin) -> Evidence`: the same on a benchmark average, from each
  seed's average over the tasks and the tasks' own evidence.
- `paired(a, b)`: two {seed: value} at the seeds both have; `paired_t_p(diffs)`: the paired t-test over seeds.
- `verdict(ev, alpha, alpha_equiv=None) -> "better" | "worse" | "equivalent" | "undecided"`.
- `seeds_needed(ev, alpha, power=0.8) -> float` (`suite.stats.power`): total seeds with which the comparison would
  be decided with that power if the true difference were the observed one (inf: no number of seeds, since the dev
  set's own noise does not shrink with seeds; NaN: not estimable).
- `evidence_arrays(diffs, example_var, margin, level)`: the same statistics vectorised (the simulation tests use it).

The procedure. Runs are paired by seed (same classifier initialisation and batch order); d_s is the paired
difference at seed s. The variance of the mean difference over both noise sources (which seeds, which dev examples)
is, by the law of total variance, the seeds' part given the dev set plus the dev set's part that every seed shares:

- seeds: s_d^2 / n, the sample variance of the d_s over n seeds (n - 1 degrees of freedom). It holds each run's own
  luck on the dev examples as well: a seed's difference is measured on the dev set, so that luck is part of how the
  d_s scatter.
- dev examples: v_shared, the part of the examples' variance that no number of seeds would shrink, because it is
  which examples the dev set happens to hold (`suite.stats.examples.split_variance`: from delete-one replicates that
  leave the same example out for every seed and both methods and re-score each run with the task's official metric).

se^2 = s_d^2 / n + v_shared. Adding the whole example variance instead (v_shared + v_run / n) counts each run's own
luck twice, once in s_d and once in v_run: the test then rejected a true null 2-3% of the time at alpha 5% in a null
built from real predictions (tests/test_stats_real_null.py), where the formula above rejects at the nominal rate.

The reference distribution is a t whose degrees of freedom make its quantile equal to Cochran & Cox's (1950)
weighted critical value w t_{n-1} + (1 - w) z with w = (s_d^2 / n) / se^2: the seed part is known to n - 1 degrees
of freedom, the shared example part (hundreds of examples) as good as exactly. Welch-Satterthwaite degrees of freedom
were tried first and rejected: at 3 seeds, when the seed part dominates, a small s_d^2 also makes the estimated df
large, and the test rejected a true null 6-7.5% of the time at alpha 5%. A hierarchical bootstrap was not used:
resampling 3-5 seeds gives percentile intervals that cover 76-84%.

Without predictions for the paired seeds (old records, missing sidecars) the example part is unknown and left
out: the evidence is over seeds only (example_se == 0), which the report says. Where only some paired seeds kept
predictions, the shared part is estimated from those seeds.

The jackknife behind v_shared has no Monte-Carlo error; plugin metrics without a closed form use a bootstrap whose
seed is the comparison's identity (`bootstrap_seed`), the same in every table and in every look of
`run --until-decided`.

Equivalence: two one-sided tests (Schuirmann 1987) of diff <= -margin and diff >= margin on the same t; p_equiv is
the larger p. A comparison is better/worse when p < alpha (the direction from the task's metric), else equivalent
when p_equiv < alpha_equiv, else undecided. Family corrections adjust p and p_equiv before `verdict` sees them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats

from suite.run.record import RunRecord
from suite.stats import collapse
from suite.stats.cochran_cox import cochran_cox_df
from suite.stats.examples import example_replicates, shared_interval, split_variance, task_spec
from suite.stats.power import seeds_needed  # noqa: F401  part of this module's public names (see above)
from suite.stats.sign import agrees, median_interval, sign_counts, sign_p

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_MARGIN", "Evidence", "RunOutcome", "averaged_evidence", "bootstrap_seed", "compare_runs",
           "evidence_arrays", "loaded_predictions", "paired_t_p", "per_task", "verdict"]

DEFAULT_MARGIN = 1.0      # equivalence margin, points of the task's score (x100)
LEVEL = 0.95
VERDICTS = ("better", "worse", "equivalent", "undecided")


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    score: float                                        # the scored split's headline, x100
    predictions: str | Path | Mapping[str, Any] | None = None

    @classmethod
    def of(cls, record: RunRecord, folder: str | Path) -> "RunOutcome":
        """The one outcome rule: a run as every verdict scores it (the looks, the power table, the report), on the
        split it is scored on (`RunRecord.scored`: its held-out test split when it kept one, else dev), with that
        split's predictions in its sidecar in `folder` (the record's own)."""
        scored = record.scored
        sidecar = scored.predictions(Path(folder) / record.predictions) if record.predictions else None
        return cls(scored.metrics.score * 100, sidecar)


@dataclasses.dataclass(frozen=True)
class Evidence:
    n_seeds: int
    diff: float
    se: float
    df: float
    low: float
    high: float
    p: float
    p_equiv: float
    margin: float
    seed_sd: float = math.nan
    example_se: float = 0.0          # dev-example part of se: what all seeds share (0: no predictions)
    example_run_se: float = 0.0      # each run's own dev-example luck: already in seed_sd, so never added to se
    example_se_interval: tuple = (math.nan, math.nan)   # example_se's interval at the level (shared_interval)
    higher_is_better: bool = True
    # the collapse endpoint (`suite.stats.collapse.degenerate`): the score is compared at the n_seeds of the
    # n_paired seeds where neither run degenerated; how often each degenerated is tested on its own (McNemar)
    n_paired: int = -1               # paired seeds in all (-1: as n_seeds)
    degenerate: int = 0              # the method's degenerate runs among them
    degenerate_reference: int = 0    # the reference's
    collapse_p: float = math.nan     # exact two-sided test of equal rates (NaN: no run could be judged)
    compared: tuple = ()             # the seeds the score was compared at (those where neither run degenerated)
    collapse_excess: int = 0         # among seeds where both runs were judged: the method's degenerate runs minus
    #                                  the reference's (McNemar's discordant counts' difference: its direction)
    # the paired sign test over every paired seed (`suite.stats.sign`: a degenerate run loses its seed), which a
    # difference claim needs too from SIGN_GUARD_SEEDS paired seeds on; excess = seeds where the method's score is
    # higher minus seeds where it is lower (the score's orientation, as diff)
    p_sign: float = math.nan
    sign_excess: int = 0
    # what the sign test decides about: the median paired difference over every paired seed (a degenerate run's
    # difference the worst there is) with its order-statistic interval at the test's level, and the seeds won and
    # lost (ties, both runs degenerate included, count as neither)
    median: float = math.nan
    median_low: float = math.nan
    median_high: float = math.nan
    wins: int = 0
    losses: int = 0

    @property
    def tested(self) -> bool:
        return math.isfinite(self.p)

    @property
    def p_rope(self) -> float:
        """P(|true difference| < margin): the posterior of a Bayesian t-test with a flat prior (the correlated
        Bayesian t-test of Benavoli et al. 2017, whose posterior is the Student t of the frequentist test: here
        centred at diff with scale se and the test's degrees of freedom). NaN without a test."""
        if not (self.tested and math.isfinite(self.se) and self.se > 0 and math.isfinite(self.df)):
            return math.nan
        t = stats.t(self.df, loc=self.diff, scale=self.se)
        return float(t.cdf(self.margin) - t.cdf(-self.margin))

    @property
    def has_examples(self) -> bool:
        """The dev examples were resampled (a shared part estimated at 0 still counts: it was estimated)."""
        return self.example_se > 0 or self.example_run_se > 0


def per_task(value: float | Mapping[str, float] | None, task: str, default: float = DEFAULT_MARGIN) -> float:
    """A study value given as one number or as task -> number with an optional `default` entry (a margin, a collapse
    floor), for `task`; `default` where it gives none. The one rule the report, the looks and the power table read."""
    if isinstance(value, Mapping):
        value = value.get(task, value.get("default"))
    return default if value is None else float(value)


def evidence_arrays(diffs: np.ndarray, example_var: np.ndarray | float = 0.0, margin: float = DEFAULT_MARGIN,
                    level: float = LEVEL) -> dict[str, np.ndarray]:
    """diff, se, df, low, high, p, p_equiv, seed_sd for paired differences `diffs` (..., n_seeds) and the
    dev-example variance of their mean (..., or a scalar), with the sign test over the same seeds (p_sign,
    sign_excess, n_paired). Fewer than 2 seeds: no test (NaNs)."""
    d = np.asarray(diffs, dtype=float)
    n = d.shape[-1]
    diff = d.mean(axis=-1) if n else np.full(d.shape[:-1], np.nan)
    wins, losses = sign_counts(d)
    signs = {"p_sign": sign_p(wins, losses), "sign_excess": wins - losses, "n_paired": np.full(np.shape(diff), n)}
    if n < 2:
        nan = np.full(np.shape(diff), np.nan)
        return {"diff": diff, "se": nan, "df": nan, "low": nan, "high": nan, "p": nan, "p_equiv": nan,
                "seed_sd": nan, **signs}
    seed_sd = d.std(axis=-1, ddof=1)
    seed_var = seed_sd ** 2 / n
    ex = np.broadcast_to(np.asarray(example_var, dtype=float), seed_var.shape)
    se = np.sqrt(seed_var + ex)
    df = cochran_cox_df(seed_var, ex, n, level)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = diff / se
        p = 2 * stats.t.sf(np.abs(t), df)
        p_equiv = np.maximum(stats.t.sf((diff + margin) / se, df), stats.t.sf((margin - diff) / se, df))
    half = stats.t.ppf(0.5 + level / 2, df) * se
    # no variance at all: identical differences say nothing about noise (a few seeds of accuracy on a small dev set
    # without prediction sidecars can tie exactly), so only an exact 0 is "no difference", and nothing is shown to
    # be equivalent: a zero standard error would make any difference inside the margin "equivalent" by fiat
    # (a tolerance, not == 0: differences that tie exactly leave a floating-point sd of ~1e-17, which read as
    # p ~ 1e-32)
    none = ~(se > 1e-9 * np.maximum(1.0, np.abs(diff)))
    p = np.where(none, np.where(np.abs(diff) <= 1e-9, 1.0, np.nan), p)
    p_equiv = np.where(none, np.nan, p_equiv)
    low, high = np.where(none, diff, diff - half), np.where(none, diff, diff + half)
    return {"diff": diff, "se": se, "df": df, "low": low, "high": high, "p": p, "p_equiv": p_equiv,
            "seed_sd": seed_sd, **signs}


def loaded_predictions(predictions):
    """A run's predictions: a sidecar path loaded, a mapping as it is; None for none or a missing or damaged file."""
    from suite.run.record import load_predictions

    if predictions is None or isinstance(predictions, Mapping):
        return predictions
    try:
        return load_predictions(predictions)
    except (OSError, ValueError, KeyError):
        return None   # a missing or damaged sidecar: that seed has seed-level evidence only


def bootstrap_seed(*identity: object) -> int:
    """The seed of one comparison's dev-example bootstrap (metrics without a closed form only), from what the
    comparison is (task, method, reference, ...), so that the same records give the same numbers in every table and
    in every look of `run --until-decided`."""
    text = "\x1f".join(str(part) for part in identity)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def compare_runs(task: str, method: Mapping[int, RunOutcome], reference: Mapping[int, RunOutcome],
                 margin: float = DEFAULT_MARGIN, level: float = LEVEL, seed: int | None = None,
                 higher_is_better: bool | None = None, collapse_endpoint: bool = True,
                 jackknife: bool = True) -> Evidence:
    """The evidence that `method` differs from `reference` on `task` (runs keyed by seed, paired by seed): the score
    at the seeds where neither run degenerated, and how often each degenerated (`Evidence.collapse_p`; without
    `collapse_endpoint`, every paired seed is scored: a constant predictor as the reference degenerates by design).
    `seed`: of the dev-example bootstrap where a metric has no closed form (default `bootstrap_seed(task)`);
    `higher_is_better` defaults to the task's metric direction (True for an unknown task); `jackknife=False`: the
    dev-example part from a `BOOTSTRAP_RESAMPLES` bootstrap even where the jackknife applies (the report's
    alternative for a fragile verdict)."""
    if seed is None:
        seed = bootstrap_seed(task)
    if higher_is_better is None:
        higher_is_better = _higher_is_better(task)
    paired_seeds = sorted(set(method) & set(reference))
    a = {s: loaded_predictions(method[s].predictions) for s in paired_seeds}
    b = {s: loaded_predictions(reference[s].predictions) for s in paired_seeds}
    regression = bool(getattr(task_spec(task), "is_regression", False))   # an unknown task: judged as a classifier
    flags = {s: (collapse.degenerate(a[s], regression), collapse.degenerate(b[s], regression))
             if collapse_endpoint else (None, None) for s in paired_seeds}
    judged = [s for s in paired_seeds if None not in flags[s]]
    seeds = [s for s in paired_seeds if not any(flags[s])]   # a run that could not be judged counts as healthy
    d = np.array([method[s].score - reference[s].score for s in seeds], dtype=float)
    total = shared = 0.0
    interval = (math.nan, math.nan)
    # one seed with predictions cannot tell the shared part from its own luck: the evidence is then over seeds only
    kept = [s for s in seeds if a[s] is not None and b[s] is not None] if len(seeds) > 1 else []
    if len(kept) >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            replicates = example_replicates(task, {s: a[s] for s in kept}, {s: b[s] for s in kept}, seed=seed,
                                            jackknife=jackknife)
            found = split_variance(replicates)
        if math.isfinite(found[0]):
            total, shared = found
            interval = shared_interval(replicates, level)
    arr = evidence_arrays(d, shared, margin, level)
    over_pairs = _over_pairs(method, reference, paired_seeds, flags, higher_is_better)
    wins, losses = (int(x) for x in sign_counts(over_pairs))
    # each run's own luck: one seed's part of the example variance beyond the shared part (v_1 - v_shared)
    run = max(len(kept) * (total - shared), 0.0)
    return Evidence(len(seeds), *(float(arr[k]) for k in ("diff", "se", "df", "low", "high", "p", "p_equiv")),
                    margin=float(margin), seed_sd=float(arr["seed_sd"]), example_se=math.sqrt(shared),
                    example_se_interval=tuple(math.sqrt(v) for v in interval), example_run_se=math.sqrt(run),
                    higher_is_better=bool(higher_is_better), n_paired=len(paired_seeds),
                    degenerate=sum(bool(flags[s][0]) for s in paired_seeds),
                    degenerate_reference=sum(bool(flags[s][1]) for s in paired_seeds),
                    collapse_p=collapse.degenerate_test([flags[s][0] for s in judged], [flags[s][1] for s in judged])
                    if judged else math.nan, compared=tuple(seeds),
                    collapse_excess=sum(int(bool(flags[s][0])) - int(bool(flags[s][1])) for s in judged),
                    p_sign=float(sign_p(wins, losses)), sign_excess=wins - losses,
                    **_median_fields(over_pairs, level), wins=wins, losses=losses)


def _over_pairs(method, reference, seeds, flags, higher_is_better: bool) -> np.ndarray:
    """The paired differences (method - reference, x100) over every paired seed, as the sign test counts them: a
    degenerate run's score is the worst there is in the metric's direction (an infinite difference), both
    degenerate a tie (0)."""
    worst = -math.inf if higher_is_better else math.inf
    out = []
    for s in seeds:
        gone_m, gone_r = bool(flags[s][0]), bool(flags[s][1])
        out.append(0.0 if gone_m and gone_r else worst if gone_m else -worst if gone_r
                   else method[s].score - reference[s].score)
    return np.array(out, dtype=float)


def _median_fields(diffs: np.ndarray, level: float) -> dict[str, float]:
    middle, low, high = median_interval(diffs, level)
    return {"median": middle, "median_low": low, "median_high": high}


def _higher_is_better(task: str) -> bool:
    """The task's metric direction; GLUE's (higher) for a task from an uninstalled plugin."""
    return bool(getattr(task_spec(task), "higher_is_better", True))


def verdict(ev: Evidence, alpha: float, alpha_equiv: float | None = None) -> str:
    """better / worse (the difference is significant, and from SIGN_GUARD_SEEDS paired seeds on the sign test
    agrees: `suite.stats.sign`; direction from the metric), equivalent (TOST rejects a difference of the margin or
    more), or undecided (neither, including no test)."""
    alpha_equiv = alpha if alpha_equiv is None else alpha_equiv
    n_paired = ev.n_paired if ev.n_paired >= 0 else ev.n_seeds
    if math.isfinite(ev.p) and ev.p < alpha and bool(agrees(ev.diff, ev.p_sign, ev.sign_excess, n_paired, alpha)):
        return "better" if (ev.diff > 0) == ev.higher_is_better else "worse"
    if math.isfinite(ev.p_equiv) and ev.p_equiv < alpha_equiv:
        return "equivalent"
    return "undecided"


def paired(a: Mapping[float, float], b: Mapping[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Values of two cells {seed: value} at the seeds both have, in seed order: runs with the same seed share the
    classifier initialisation and the batch order, so they are compared seed by seed."""
    seeds = sorted(set(a) & set(b))
    return np.array([a[s] for s in seeds], dtype=float), np.array([b[s] for s in seeds], dtype=float)


def averaged_evidence(method: Mapping[float, float], reference: Mapping[float, float], tasks: Sequence[Evidence],
                      margin: float = DEFAULT_MARGIN) -> Evidence:
    """The evidence on a benchmark average: `method` and `reference` are {seed: average over the averaged tasks}
    (seeds that ran all of them), `tasks` each averaged task's own evidence. The dev-example variance of the average
    is the sum of the tasks' over the number of tasks squared: the tasks' dev sets are independent."""
    a, b = paired(method, reference)
    k = max(len(tasks), 1) ** 2
    example_var = sum(ev.example_se ** 2 for ev in tasks) / k
    run = sum(ev.example_run_se ** 2 for ev in tasks) / k   # shown, never added: so the average says it resampled
    arr = evidence_arrays(a - b, example_var, margin)
    wins, losses = (int(x) for x in sign_counts(a - b))
    return Evidence(len(a), *(float(arr[k]) for k in ("diff", "se", "df", "low", "high", "p", "p_equiv")),
                    margin=margin, seed_sd=float(arr["seed_sd"]), example_se=math.sqrt(example_var),
                    example_run_se=math.sqrt(run), p_sign=float(arr["p_sign"]), sign_excess=int(arr["sign_excess"]),
                    **_median_fields(a - b, LEVEL), wins=wins, losses=losses)


def paired_t_p(diffs: np.ndarray) -> np.ndarray:
    """Two-sided paired t-test p-values of differences (..., n_seeds) against 0 (scipy's one-sample t-test of the
    differences, vectorised over leading axes), for comparisons without per-example predictions.

    n < 2: NaN (no test). Differences all equal have zero variance, where the t statistic is undefined (scipy gives
    NaN or inf): all 0 gives p = 1 (no difference at all); equal and non-zero gives NaN (no test, not marked), since
    a handful of seeds agreeing exactly says more about the setup (e.g. a deterministic tie) than about noise.
    """
    d = np.asarray(diffs, dtype=float)
    if d.shape[-1] < 2:
        return np.full(d.shape[:-1], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zero variance: scipy warns and returns NaN or inf
        p = np.asarray(stats.ttest_1samp(d, 0.0, axis=-1).pvalue, dtype=float)
    constant = np.all(d == d[..., :1], axis=-1)
    return np.where(constant, np.where(d[..., 0] == 0, 1.0, np.nan), p)
