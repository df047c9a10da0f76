"""The dev-example part of a comparison's noise: how much the mean paired difference moves when the dev examples are
resampled, from the per-example predictions a run keeps next to its record (the `.npz` sidecar).

Every replicate leaves out (or draws) the same dev examples for both methods and all seeds (they were scored on the
same examples) and re-scores each run with the task's official metric, so metrics that are not means over examples
(F1, Matthews correlation, Pearson/Spearman) are resampled as they are computed.

The variance is the delete-one jackknife's (Efron & Stein 1981): N replicates, each leaving one of the N dev examples
out, v = (N - 1) / N * sum (theta_(i) - mean)^2. It is what the bootstrap estimates (for accuracy it equals the ideal
bootstrap's variance times N / (N - 1)), with no Monte-Carlo error: the same records give the same numbers whatever
seed, so a verdict cannot move with one. Accuracy, binary F1 and MCC (from the confusion counts), Pearson (from
weighted moments) and Spearman (Pearson of each replicate's ranks) are computed for all replicates at once, in blocks
of leave-one-out weights. Metrics without such a form (plugin metrics, multi-class F1 / MCC) fall back to a seeded
bootstrap of `BOOTSTRAP_RESAMPLES` resamples, the metric computed on each (its seed is the comparison's identity:
`suite.stats.evidence.bootstrap_seed`).

Where a split's rows share sources (a held-out test split carved by sentence: on SST-2 a sentence and its phrases,
1,090 groups with a label intra-class correlation of about 0.58), examples are not independent draws and the
delete-one-row jackknife understates the variance (docs/statistics.md measures by how much). There the unit is the
source: each replicate leaves out one group's rows (the delete-a-group jackknife, v = (G - 1) / G sum over the G
groups), and the bootstrap draws whole groups. The groups come with the predictions (`group`, `sources`); dev rows
have none and are resampled one by one, as are held-out predictions written before version 3 of the record.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

from suite.api import metrics

# what the rest of the suite uses; other names are this module's own
__all__ = ["example_replicates", "example_variance", "shared_interval", "sources", "split_variance",
           "task_spec"]

SCALE = 100.0
BOOTSTRAP_RESAMPLES = 2000   # the fallback's resamples: the variance's relative Monte-Carlo error sqrt(2/B) = 3%
JACKKNIFE_BLOCK = 256        # leave-one-out weight rows at a time: (256, N) floats, whatever the dev set's size


def task_spec(task: str):
    """The task's spec; None for a task from an uninstalled plugin (no metric to re-score with)."""
    from suite.api.tasks import get_task

    try:
        return get_task(task)
    except Exception:  # noqa: BLE001  whatever an uninstalled plugin's name makes get_task raise
        return None


def _weighted(name: str, pred: np.ndarray, gold: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """A built-in metric on every resample at once: w (resamples, examples) counts how often each example was drawn.
    None where no closed form applies here (plugin metrics, multi-class F1 / MCC)."""
    n = w.sum(axis=1)
    if name == "accuracy":
        return w @ (pred == gold).astype(float) / n
    binary = set(np.unique(gold)) <= {0, 1} and set(np.unique(pred)) <= {0, 1}
    if name in ("f1", "mcc") and binary:
        p, g = pred.astype(bool), gold.astype(bool)
        tp, fp, fn = w @ (p & g).astype(float), w @ (p & ~g).astype(float), w @ (~p & g).astype(float)
        tn = n - tp - fp - fn
        with np.errstate(invalid="ignore", divide="ignore"):
            if name == "f1":    # scikit-learn's zero_division=0
                return np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0)
            denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
            return np.where(denominator > 0, (tp * tn - fp * fn) / denominator, 0.0)   # scikit-learn: 0
    if name in ("pearson", "spearman"):
        x, y = pred.astype(float), gold.astype(float)
        if name == "spearman":  # Pearson of the ranks each resample gives its examples (ties averaged, as scipy)
            x, y = _resample_ranks(x, w), _resample_ranks(y, w)
        mx, my = (w * x).sum(axis=1) / n, (w * y).sum(axis=1) / n
        cov = (w * x * y).sum(axis=1) / n - mx * my
        vx, vy = (w * x * x).sum(axis=1) / n - mx ** 2, (w * y * y).sum(axis=1) / n - my ** 2
        with np.errstate(invalid="ignore", divide="ignore"):
            # ranks' moments are ~n^2: the floor that tells a constant resample is relative to them
            tiny = 1e-12 * (np.maximum(mx ** 2, my ** 2) if name == "spearman" else 1.0)
            return np.where((vx > tiny) & (vy > tiny), cov / np.sqrt(np.maximum(vx * vy, 0.0)), np.nan)
    return None


def _resample_ranks(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(resamples, examples): the average rank an example's copies get in each resample (w: how often each example
    was drawn), i.e. what ranking the resampled array would give it; examples not drawn get a rank nobody weighs."""
    order = np.argsort(v, kind="stable")
    sv = v[order]
    first = np.r_[True, sv[1:] != sv[:-1]]                          # a sorted position that starts a new value
    starts = np.flatnonzero(first)
    group = np.cumsum(first) - 1                                    # distinct-value index of each sorted position
    ws = w[:, order]
    total = np.add.reduceat(ws, starts, axis=1)                     # copies of each distinct value
    below = np.cumsum(total, axis=1) - total                        # copies of smaller values
    ranks = np.empty_like(w, dtype=float)
    ranks[:, order] = (below + (total + 1) / 2)[:, group]
    return ranks


def _left_out_correlation(name: str, pred: np.ndarray, gold: np.ndarray, left_out: np.ndarray) -> np.ndarray:
    """Pearson or Spearman with each example of `left_out` left out in turn: what `_weighted` gives for those
    leave-one-out weights, from the whole sample's sums less the example's part. For Spearman, the ranks left are
    r_j - [v_j > v_i] - [v_j == v_i] / 2 (j != i): their sum and sum of squares follow from the tie groups, and only
    the cross products need the (left out, examples) comparisons, as booleans, instead of ranking every replicate."""
    x, y = pred.astype(float), gold.astype(float)
    n = len(x) - 1
    if name == "spearman":
        sx, sxx = _left_out_rank_sums(x, left_out)
        sy, syy = _left_out_rank_sums(y, left_out)
        sxy = _left_out_rank_products(x, y, left_out)
    else:
        sx, sy = x.sum() - x[left_out], y.sum() - y[left_out]
        sxx, syy, sxy = (x @ x - x[left_out] ** 2, y @ y - y[left_out] ** 2, x @ y - x[left_out] * y[left_out])
    mx, my = sx / n, sy / n
    cov = sxy / n - mx * my
    vx, vy = sxx / n - mx ** 2, syy / n - my ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        tiny = 1e-12 * (np.maximum(mx ** 2, my ** 2) if name == "spearman" else 1.0)  # as `_weighted`
        return np.where((vx > tiny) & (vy > tiny), cov / np.sqrt(np.maximum(vx * vy, 0.0)), np.nan)


def _left_out_rank_sums(v: np.ndarray, left_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum and sum of squares of the average ranks of the n examples left: 1..n, less each tie group's
    (t^3 - t) / 12 (the group of the example left out has one member fewer)."""
    n = len(v) - 1
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    ties = float((counts ** 3 - counts).sum())
    t = counts[inverse[left_out]].astype(float)
    groups = ties - (t ** 3 - t) + ((t - 1) ** 3 - (t - 1))
    return np.full(len(left_out), n * (n + 1) / 2), n * (n + 1) * (2 * n + 1) / 6 - groups / 12


def _left_out_rank_products(x: np.ndarray, y: np.ndarray, left_out: np.ndarray) -> np.ndarray:
    """sum over j != i of r'x_j r'y_j for each i in `left_out` (r' = the ranks left, as in `_left_out_correlation`)."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x), rankdata(y)
    rows = np.arange(len(left_out))

    def falls(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # v_j above v_i; tied with it, j != i
        above, tied = v[None, :] > v[left_out, None], v[None, :] == v[left_out, None]
        tied[rows, left_out] = False
        return above, tied

    gx, ex = falls(x)
    gy, ey = falls(y)
    count = np.count_nonzero
    both = (count(gx & gy, axis=1) + (count(gx & ey, axis=1) + count(ex & gy, axis=1)) / 2
            + count(ex & ey, axis=1) / 4)
    return (rx @ ry - rx[left_out] * ry[left_out] - (gy @ rx + ey @ rx / 2) - (gx @ ry + ex @ ry / 2) + both)


def resampled_headline(spec, preds: dict, weights: dict[str, np.ndarray],
                       left_out: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The task's headline score (0-1) of one run on each resample of its dev examples (weights per eval suffix).
    `left_out`: the weights of that split leave out one example per row, these (the jackknife's blocks), which
    the correlations use to skip re-ranking."""
    columns = {}
    for suffix, w in weights.items():
        p = preds[suffix]
        pred = metrics.predictions(p["logits"], spec.is_regression)
        for name in spec.metrics:
            key = f"{name}_{suffix}" if suffix else name
            if left_out and suffix in left_out and name in ("pearson", "spearman"):
                columns[key] = _left_out_correlation(name, pred, p["label"], left_out[suffix])
                continue
            fast = _weighted(name, pred, p["label"], w)
            if fast is None:    # the metric itself on each resample, drawn as the weights say
                fast = np.array([metrics.METRICS.get(name)(np.repeat(pred, row), np.repeat(p["label"], row))
                                 for row in w.astype(int)])
            columns[key] = fast
    return np.mean(np.stack([columns[k] for k in spec.metric_keys()]), axis=0)


def same_examples(a: dict, b: dict) -> bool:
    runs = [*a.values(), *b.values()]
    return all(set(r) == set(runs[0]) and all(np.array_equal(r[s]["index"], runs[0][s]["index"]) for s in r)
               for r in runs)


def _counts(rng, n: int, resamples: int) -> np.ndarray:
    """(resamples, n): how often each of n examples is drawn in each bootstrap resample."""
    draws = rng.integers(0, n, (resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(draws.ravel(), minlength=resamples * n).reshape(resamples, n).astype(float)


def _counts_by(rng, n: int, source: np.ndarray | None, resamples: int) -> np.ndarray:
    """(resamples, n): `_counts` of whole sources where rows share them (each row drawn as often as its source)."""
    if source is None:
        return _counts(rng, n, resamples)
    _, of_row = np.unique(source, return_inverse=True)
    return _counts(rng, int(of_row.max()) + 1, resamples)[:, of_row]


@dataclasses.dataclass(frozen=True)
class Replicates:
    """Replicates (R, seeds), x100, of each seed's difference a - b, and how their spread becomes a variance:
    `groups` (R,) names the eval split each delete-one replicate left an example out of (a jackknife, stratified
    by split: splits are independent samples), None for bootstrap resamples."""

    values: np.ndarray
    groups: np.ndarray | None = None

    def variance(self, x: np.ndarray) -> np.ndarray:
        """The variance over replicates (axis 0) of a statistic x (R, ...) computed on each."""
        x = np.asarray(x, dtype=float)
        if self.groups is None:
            return np.var(x, axis=0, ddof=1)
        total = np.zeros(x.shape[1:])
        for g in np.unique(self.groups):
            part = x[self.groups == g]
            total = total + (len(part) - 1) / len(part) * ((part - part.mean(axis=0)) ** 2).sum(axis=0)
        return total


def _closed_form(spec, run: dict) -> bool:
    """Every metric of the task has an all-replicates-at-once form for this run's predictions."""
    for p in run.values():
        pred = metrics.predictions(p["logits"], spec.is_regression)
        if any(_weighted(name, pred, p["label"], np.ones((1, len(pred)))) is None for name in spec.metrics):
            return False
    return True


def sources(a: dict, b: dict, seeds: list, suffix: str) -> np.ndarray | None:
    """Each example's source on split `suffix` where its rows share sources (the held-out split's sentence groups,
    `group` in the predictions of the runs that record it, the same in all), else None: each example its own. The
    runs were scored on the same examples (`same_examples`), so a run from before groups were recorded (record
    version 2) takes them from the others: a campaign that gains seeds after an upgrade keeps one unit of resampling
    across its looks."""
    found = [g for run in (a, b) for s in seeds if (g := run[s][suffix].get("group")) is not None]
    if not found or not all(np.array_equal(g, found[0]) for g in found):
        return None
    return np.asarray(found[0])


def _jackknife(spec, a: dict, b: dict, seeds: list) -> Replicates:
    """Delete-one replicates over every eval split's examples, in blocks of leave-one-out weights; where the split's
    rows share sources, delete-a-group replicates (one source's rows left out together)."""
    sizes = {suffix: len(arrays["label"]) for suffix, arrays in a[seeds[0]].items()}
    rows, groups = [], []
    for suffix, n in sizes.items():
        source = sources(a, b, seeds, suffix)
        of_row = np.arange(n) if source is None else source
        units = np.arange(n) if source is None else np.unique(source)
        for start in range(0, len(units), JACKKNIFE_BLOCK):
            left_out = units[start:start + JACKKNIFE_BLOCK]
            w = (of_row[None, :] != left_out[:, None]).astype(float)
            weights = {s: (w if s == suffix else np.ones((len(left_out), m))) for s, m in sizes.items()}
            dropped = {suffix: left_out} if source is None else None   # the correlations' one-row shortcut
            rows.append(np.stack([resampled_headline(spec, a[s], weights, dropped)
                                  - resampled_headline(spec, b[s], weights, dropped) for s in seeds], axis=1))
            groups.append(np.full(len(left_out), suffix, dtype=object))
    return Replicates(np.concatenate(rows) * SCALE, np.concatenate(groups))


def example_replicates(task: str, a: dict, b: dict, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                       jackknife: bool = True) -> Replicates:
    """Replicates of each shared seed's difference a - b (runs' predictions keyed by seed): the jackknife where
    every metric has a closed form (and `jackknife`), else `resamples` bootstrap resamples drawn from `seed`. Empty
    when the two share no seed with predictions or were scored on different examples. A replicate whose metric is
    undefined (a constant correlation) is dropped."""
    spec = task_spec(task)
    seeds = sorted(set(a) & set(b))
    if spec is None or not seeds or not same_examples({s: a[s] for s in seeds}, {s: b[s] for s in seeds}):
        return Replicates(np.empty((0, 0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if jackknife and all(_closed_form(spec, run[s]) for run in (a, b) for s in seeds):
            found = _jackknife(spec, a, b, seeds)
        else:
            rng = np.random.default_rng(seed)
            weights = {suffix: _counts_by(rng, len(arrays["label"]), sources(a, b, seeds, suffix), resamples)
                       for suffix, arrays in a[seeds[0]].items()}
            found = Replicates(np.stack([resampled_headline(spec, a[s], weights)
                                         - resampled_headline(spec, b[s], weights) for s in seeds], axis=1) * SCALE)
    keep = np.all(np.isfinite(found.values), axis=1)
    return Replicates(found.values[keep], None if found.groups is None else found.groups[keep])


def split_variance(replicates: Replicates | np.ndarray) -> tuple[float, float]:
    """(variance of the mean over seeds, the part of it that seeds share) from replicates (R, seeds) (an array:
    bootstrap resamples).

    Over resampled examples the mean of k seeds' differences varies by v_k = v_shared + v_run / k: v_run is each
    run's own luck on the examples (the seeds' spread already shows it, and it shrinks with more seeds), v_shared
    is which examples the dev set happens to hold (every run shares it; it does not shrink). With one seed's
    variance v_1 = v_shared + v_run: v_shared = (k v_k - v_1) / (k - 1), clipped at 0. One seed: all of it shared.
    """
    if not isinstance(replicates, Replicates):
        replicates = Replicates(np.asarray(replicates, dtype=float))
    r = replicates.values
    k = r.shape[-1]
    if r.shape[-2] < 2 or k < 1:
        return math.nan, math.nan
    v_k = float(replicates.variance(r.mean(axis=-1)))
    if k == 1:
        return v_k, v_k
    return v_k, float(np.clip(_unclipped_shared(replicates), 0.0, v_k))


def _unclipped_shared(replicates: Replicates) -> float:
    """(k v_k - v_1) / (k - 1) before clipping (k >= 2 seeds): negative where the seeds' differences do not repeat."""
    r, k = replicates.values, replicates.values.shape[-1]
    v_k, v_1 = float(replicates.variance(r.mean(axis=-1))), float(replicates.variance(r).mean())
    return (k * v_k - v_1) / (k - 1)


def shared_interval(replicates: Replicates, level: float = 0.95) -> tuple[float, float]:
    """An interval for `split_variance`'s shared part (x100 squared): the delete-a-seed jackknife of the estimate
    before it is clipped (a clipped estimate's jackknife would read [0, 0]), with a t on k - 1 degrees of freedom,
    its ends clipped at 0. Its uncertainty is mostly how few seeds tell the shared part from each run's own luck; in
    simulation at 5-20 seeds it covered the shared part 96-100% of the time at 95% (tests/test_stats_simulation.py).
    NaNs below 3 seeds."""
    from scipy import stats

    r = replicates.values
    k = r.shape[-1] if r.ndim == 2 else 0
    if k < 3 or r.shape[0] < 2:
        return math.nan, math.nan
    estimate = _unclipped_shared(replicates)
    left = np.array([_unclipped_shared(Replicates(np.delete(r, j, axis=1), replicates.groups)) for j in range(k)])
    se = math.sqrt((k - 1) / k * float(np.sum((left - left.mean()) ** 2)))
    half = float(stats.t.isf((1 - level) / 2, k - 1)) * se
    return max(estimate - half, 0.0), max(estimate + half, 0.0)


def example_variance(task: str, a: dict, b: dict, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                     jackknife: bool = True) -> tuple[float, float]:
    """(variance of the mean paired difference over resampled dev examples, the part shared by all seeds), x100
    squared; NaNs when not estimable. `jackknife=False`: the bootstrap even where a closed form exists."""
    return split_variance(example_replicates(task, a, b, seed, resamples, jackknife))
