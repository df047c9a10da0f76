"""Why design A's placebo runs log the real reward's correlation with layer 1's drop share at about +0.019 (K = 1)
while the K = 8 runs log about 0 (issue 66, item 1): on the same steps, the logged statistic at K = 8 and at K = 1,
split into the part G's update can use and the part it cannot.

    OMP_NUM_THREADS=1 python -m lab.attendout placebo-log --data-dir ../shared/data/glue \\
        --out lab/attendout/results/decisive/placebo_log --steps 150 --minutes 62
    python -m lab.attendout placebo-log-report lab/attendout/results/decisive/placebo_log \
        --decisive lab/attendout/results/decisive           # the table again, and what designs A, kappa and B logged

One run in design A's setting (`decisive.longhorizon_argv`: MiniLM, MRPC, lr 1e-4, the Defender baseline, g_lr 1e-3,
the placebo arm, seed 0) but with K = 8 masks per step, so that every step gives both forms on identical draws: mask 1
is the training forward's mask, the one a K = 1 run rewards and logs (`--mask-samples 1` runs A's form itself: the
statistics that need K >= 2 are then left out). Per reward step and layer, with adv the reward
minus the Defender's (K, B), share each (mask, sample)'s drop share and expected its expectation under G (the mean of
pi over the sample's valid pairs), correlations over units:

- logged: adv with share over all K x B units (`longhorizon.ShareLog`'s statistic, as the K = 8 runs logged it);
- logged_k1: the same over each mask's B units alone, averaged over the K masks (as a K = 1 run logs it); mask1: mask
  1's alone;
- centred (and centred_k1): adv with share - expected, the share's deviation from what G expected: the only part of the
  share that moves G's REINFORCE step (d log p / d logit is proportional to drop - pi, so a reward that follows the
  sample's expected share moves G by nothing on average);
- expected (and expected_k1): adv with expected, the between-sample part (G's content-dependent rate);
- within: adv with share, each centred on its sample's mean over the K masks; between: over the B samples, the masks'
  mean adv with their mean share.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from suite.methods.attendout import PolicyUpdate

STATISTICS = ("logged", "logged_k1", "mask1", "centred", "centred_k1", "expected", "expected_k1", "within", "between")


def corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of the flattened arrays over the units where both are numbers (NaN pads a smaller batch);
    NaN when either is constant."""
    x, y = np.ravel(x), np.ravel(y)
    kept = ~(np.isnan(x) | np.isnan(y))
    x, y = x[kept] - np.mean(x[kept]), y[kept] - np.mean(y[kept])
    denom = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y / denom) if denom > 0 else math.nan


def step_statistics(adv: np.ndarray, share: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """The module docstring's statistics for one reward step and layer; each argument (K, B)."""
    k = adv.shape[0]
    deviation = share - expected

    def per_mask(y: np.ndarray) -> float:
        return float(np.nanmean([corr(adv[j], y[j]) for j in range(k)]))

    out = {"logged": corr(adv, share), "logged_k1": per_mask(share), "mask1": corr(adv[0], share[0]),
           "centred": corr(adv, deviation), "centred_k1": per_mask(deviation),
           "expected": corr(adv, expected), "expected_k1": per_mask(expected)}
    if k > 1:
        out["within"] = corr(adv - adv.mean(0), share - share.mean(0))
        out["between"] = corr(adv.mean(0), share.mean(0))
    return out


class UnitLog:
    """A reward hook of an AttendOut instance that only looks: per reward step, the (K, B) advantages against the
    Defender, and per layer each unit's drop share and G's expected share."""

    def __init__(self, method):
        from .planted import baseline_advantage, layer_drop_share

        self.method, self._advantage, self._share = method, baseline_advantage, layer_drop_share
        self.adv: list[np.ndarray] = []
        self.share: list[np.ndarray] = []      # per step (layers, K, B)
        self.expected: list[np.ndarray] = []   # per step (layers, K, B)
        method.reward_hooks.append(self)

    def __call__(self, update: PolicyUpdate) -> None:
        rewards, defender, samples = update.rewards, update.defender, update.samples
        self.adv.append(self._advantage(rewards, defender, "defender").cpu().numpy())
        layers = range(len(samples[0]))
        self.share.append(np.array([[self._share(s, layer).double().cpu().numpy() for s in samples]
                                    for layer in layers]))
        self.expected.append(np.array([[expected_share(s[layer], self.method.cfg.p_max) for s in samples]
                                       for layer in layers]))


def stack_ragged(arrays: list[np.ndarray]) -> np.ndarray:
    """Per-step arrays whose last axis, the batch, may differ (an epoch's last batch is smaller), stacked with NaN
    after each step's own rows; `units.npz` keeps each step's batch size beside them (`batch`)."""
    width = max(a.shape[-1] for a in arrays)
    out = np.full((len(arrays), *np.shape(arrays[0])[:-1], width), np.nan)
    for i, a in enumerate(arrays):
        out[i, ..., :a.shape[-1]] = a
    return out


@torch.no_grad()
def expected_share(sample, p_max: float) -> np.ndarray:
    """(B,): G's expected drop share of each sample's valid pairs in the sample's layer (mean pi over them)."""
    valid = sample.valid.expand_as(sample.drop)
    pi = p_max * torch.sigmoid(sample.logits.detach().float())
    return ((pi * valid).sum((-1, -2)) / valid.sum((-1, -2)).clamp_min(1)).double().cpu().numpy()


def summarise(adv: np.ndarray, share: np.ndarray, expected: np.ndarray) -> dict:
    """Per statistic and layer, the mean over reward steps, its standard error and the number of steps; and the paired
    difference logged_k1 - logged (same steps). adv (steps, K, B); share, expected (steps, layers, K, B)."""
    layers = share.shape[1]
    per_step = [[step_statistics(adv[t], share[t, layer], expected[t, layer]) for layer in range(layers)]
                for t in range(adv.shape[0])]
    out: dict = {"steps": int(adv.shape[0]), "K": int(adv.shape[1]), "B": int(adv.shape[2])}
    names = [n for n in STATISTICS if n in per_step[0][0]] + (["k1_minus_k8"] if adv.shape[1] > 1 else [])
    for name in names:
        x = np.array([[(s["logged_k1"] - s["logged"]) if name == "k1_minus_k8" else s[name] for s in row]
                      for row in per_step])
        n = (~np.isnan(x)).sum(0)
        out[name] = {"mean": np.nanmean(x, 0).tolist(), "se": (np.nanstd(x, 0, ddof=1) / np.sqrt(n)).tolist()}
    # the spreads behind the split: G's expected share across samples against the mask's deviation from it
    with warnings.catch_warnings():  # a padded row is NaN in every mask: its mean is NaN, left out by nanstd
        warnings.simplefilter("ignore", RuntimeWarning)
        spread = np.nanstd(np.nanmean(expected, 2), 2, ddof=1)  # (steps, layers)
    out["sd_expected_between_samples"] = spread.mean(0).tolist()
    fifth = max(1, adv.shape[0] // 5)  # does G's content dependence grow over the run?
    out["sd_expected_first_fifth"], out["sd_expected_last_fifth"] = (spread[:fifth].mean(0).tolist(),
                                                                      spread[-fifth:].mean(0).tolist())
    out["sd_deviation"] = np.nanmean(np.nanstd(share - expected, 3, ddof=1), (0, 2)).tolist()
    return out


def additive_split(adv: np.ndarray, share: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step and layer, `logged` split into two terms that add up to it exactly: cov(adv, share - expected) and
    cov(adv, expected), each over the step's sd(adv) sd(share) (covariances add where correlations do not): the part
    G can learn from and the between-sample part. adv (steps, K, B); share, expected (steps, layers, K, B); returns
    two (steps, layers) arrays, NaN where the advantage or the share is constant. NaN units (the padding after a
    smaller batch's rows) are left out."""
    a = (adv - np.nanmean(adv, (1, 2), keepdims=True))[:, None]
    s = share - np.nanmean(share, (2, 3), keepdims=True)
    e = expected - np.nanmean(expected, (2, 3), keepdims=True)
    denom = np.sqrt(np.nansum(a ** 2, (2, 3)) * np.nansum(s ** 2, (2, 3)))
    denom = np.where(denom > 0, denom, np.nan)
    return np.nansum(a * (s - e), (2, 3)) / denom, np.nansum(a * e, (2, 3)) / denom


def seeds_summary(folders: list[Path], layer: int) -> list[dict]:
    """Per folder (one run each): its seed, arm, K and steps, and per part (logged, learnable, between) the mean over
    its reward steps in `layer`."""
    rows = []
    for folder in folders:
        meta, units = json.loads((folder / "meta.json").read_text()), np.load(folder / "units.npz")
        adv, share, expected = (units[k].astype(np.float64) for k in ("adv", "share", "expected"))
        learnable, between = additive_split(adv, share, expected)
        logged = [corr(adv[t], share[t, layer]) for t in range(adv.shape[0])]  # as step_statistics, not the sum
        rows.append({"folder": folder.name, "seed": meta["seed"], "arm": meta["arm"], "K": int(adv.shape[1]),
                     "steps": int(adv.shape[0]), "logged": float(np.nanmean(logged)),
                     "learnable": float(np.nanmean(learnable[:, layer])),
                     "between": float(np.nanmean(between[:, layer]))})
    return rows


def seeds_report(folders: list[Path], decisive: Path | None, layer: int = 1) -> str:
    """Several runs (one folder each, e.g. A's placebo seeds at K = 1): per run the logged statistic in `layer` split
    exactly into its learnable and between-sample parts, beside what design A's run of that arm and seed logged where
    it ran the same K over the same reward steps (the same trajectory when it reproduces); then across runs each
    part's mean, standard error, 95% t interval and the two-sided one-sample t-test's p against 0. Written to
    `seeds_summary.json` in the folders' common parent too."""
    from scipy import stats

    from .longhorizon_report import read_runs

    rows = seeds_summary(folders, layer)
    design_a = {}  # (arm, seed, K, reward steps) -> A's logged value: beside a run only over the same steps and K
    if decisive is not None and (decisive / "A" / "runs.jsonl").is_file():
        design_a = {(r["arm"], r["seed"], r["mask_samples"], r["g_updates"]): r["adv_share_corr"]["mean"][layer]
                    for r in read_runs(decisive / "A" / "runs.jsonl")}
    lines = [f"Layer {layer}; per run the mean over its reward steps. logged = learnable + between exactly "
             "(`additive_split`).", "",
             "| run | arm | seed | K | steps | logged | learnable | between | design A logged |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        a = design_a.get((r["arm"], r["seed"], r["K"], r["steps"]))
        r["design_a_logged"] = a
        lines.append(f"| {r['folder']} | {r['arm']} | {r['seed']} | {r['K']} | {r['steps']} | {r['logged']:+.4f} | "
                     f"{r['learnable']:+.4f} | {r['between']:+.4f} | " + ("-" if a is None else f"{a:+.4f}") + " |")
    across = {}
    if len(rows) > 1:
        lines += ["", f"Across the {len(rows)} runs (t on {len(rows) - 1} df):", "",
                  "| part | mean | SE | 95% interval | p (vs 0) |", "|---|---:|---:|---|---:|"]
        for part in ("logged", "learnable", "between"):
            x = np.array([r[part] for r in rows])
            mean, se = float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))
            half = float(stats.t.ppf(0.975, len(x) - 1)) * se
            p = float(stats.ttest_1samp(x, 0.0).pvalue)
            across[part] = {"mean": mean, "se": se, "low": mean - half, "high": mean + half, "p": p}
            lines.append(f"| {part} | {mean:+.4f} | {se:.4f} | {mean - half:+.4f} to {mean + half:+.4f} | {p:.3f} |")
    parent = Path(os.path.commonpath([f.resolve().parent for f in folders]))
    (parent / "seeds_summary.json").write_text(json.dumps({"layer": layer, "runs": rows, "across": across},
                                                          indent=1) + "\n")
    return "\n".join(lines)


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m lab.attendout placebo-log",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=150, help="reward steps at most")
    p.add_argument("--minutes", type=float, default=25.0, help="stop after this many minutes of steps")
    p.add_argument("--mask-samples", type=int, default=8)
    p.add_argument("--arm", choices=("placebo", "real"), default="placebo")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 2 or args.mask_samples < 1:
        p.error("--steps must be >= 2 and --mask-samples >= 1 (at K = 1: no within, between or k1_minus_k8)")
    return args


def main(argv: list[str]) -> int:
    from suite.run.models import quiet_transformers

    from . import decisive, longhorizon
    from .common import load_data, train_step

    args = parse(argv)
    design = dataclasses.replace(decisive.DESIGNS["A"], mask_samples=args.mask_samples)
    lh = longhorizon.parse(decisive.longhorizon_argv(design, decisive.DESIGNS["A"].updates, args.data_dir, args.out))
    torch.set_num_threads(1)
    import suite  # noqa: F401  registers the methods

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began, meta = time.perf_counter(), longhorizon.meta(lh, argv)  # the load at the start
    with quiet_transformers():
        spec, tokenizer, train, _ = load_data(lh)
        model, method, ctx = longhorizon.build(lh, spec, args.seed, args.arm, 1e-3)
        log = UnitLog(method)
        batches = longhorizon.training_batches(lh, spec, train, tokenizer.pad_token_id or 0, args.seed, args.steps + 2)
        steps_began = time.perf_counter()
        for step in range(args.steps + 1):  # the warm-up's first step has learning rate 0 and no reward
            train_step(ctx, batches, step)
            if (step + 1) % 10 == 0:
                print(f"step {step + 1}: {(time.perf_counter() - steps_began) / (step + 1):.2f} s per step, load "
                      f"{os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
            if time.perf_counter() - steps_began > 60 * args.minutes:
                break
    adv, share, expected = (stack_ragged(x) for x in (log.adv, log.share, log.expected))
    np.savez_compressed(out / "units.npz", adv=adv.astype(np.float32), share=share.astype(np.float32),
                        expected=expected.astype(np.float32), batch=np.array([a.shape[-1] for a in log.adv]))
    meta |= {
        "command": "python -m lab.attendout placebo-log " + " ".join(argv), "arm": args.arm,
        "seed": args.seed, "mask_samples": args.mask_samples, "reward_steps": len(log.adv),
        "s_per_step": (time.perf_counter() - steps_began) / max(1, len(log.adv) + 1),
        "minutes": (time.perf_counter() - began) / 60, "load_at_end": " ".join(f"{v:.2f}" for v in os.getloadavg())}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(report(out))
    return 0


def report(out: Path) -> str:
    """The summary of `<out>/units.npz` as a markdown table (written to `<out>/summary.json` too)."""
    units = np.load(out / "units.npz")
    s = summarise(*(units[k].astype(np.float64) for k in ("adv", "share", "expected")))
    (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    layers = len(s["logged"]["mean"])
    lines = [f"{s['steps']} reward steps, K = {s['K']}, B = {s['B']}; mean over steps +- its standard error", "",
             "| statistic | " + " | ".join(f"layer {i}" for i in range(layers)) + " |",
             "|---|" + "---:|" * layers]
    for name in [n for n in (*STATISTICS, "k1_minus_k8") if n in s]:
        cells = [f"{m:+.4f} ± {e:.4f}" for m, e in zip(s[name]["mean"], s[name]["se"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name in ("sd_expected_between_samples", "sd_expected_first_fifth", "sd_expected_last_fifth", "sd_deviation"):
        lines.append(f"| {name} | " + " | ".join(f"{v:.4f}" for v in s[name]) + " |")
    return "\n".join(lines)


def committed_logs(decisive: Path, layer: int = 1) -> str:
    """What the decisive designs' runs logged (`adv_share_corr`, per run the mean over its steps and that mean's
    standard error): per design and arm, the mean over runs per layer, its standard error from the runs' own, and
    the p of a chi-square test that the runs agree within those errors; then `layer` at K = 1 (A's placebo runs)
    against K = 8 (every placebo and real run of the calibration and B), by Welch's t on the runs' values."""
    from scipy import stats

    from .decisive import DESIGNS
    from .longhorizon_report import read_runs

    lines = ["| design | arm | K | runs | per layer: mean ± SE (z; heterogeneity p) |", "|---|---|---:|---:|---|"]
    k1, k8 = [], []
    for name in ("A", "kappa", "B"):
        runs = read_runs(decisive / name / "runs.jsonl")
        for arm in dict.fromkeys(r["arm"] for r in runs):
            mine = [r for r in runs if r["arm"] == arm]
            m = np.array([r["adv_share_corr"]["mean"] for r in mine])
            se = np.array([r["adv_share_corr"]["se"] for r in mine])
            mean, mean_se = m.mean(0), np.sqrt((se ** 2).sum(0)) / len(mine)
            w = 1 / se ** 2
            chi2 = (w * (m - (w * m).sum(0) / w.sum(0)) ** 2).sum(0)
            het = stats.chi2.sf(chi2, len(mine) - 1) if len(mine) > 1 else np.full(m.shape[1], np.nan)
            cells = "; ".join(f"{a:+.4f} ± {b:.4f} ({a / b:+.1f}; {h:.3f})" for a, b, h in zip(mean, mean_se, het))
            lines.append(f"| {name} | {arm} | {mine[0]['mask_samples']} | {len(mine)} | {cells} |")
            if arm != "planted":
                (k1 if mine[0]["mask_samples"] == 1 else k8).extend(m[:, layer])
    t = stats.ttest_ind(k1, k8, equal_var=False)
    lines += ["", f"Layer {layer}, runs' values: K = 1 {np.mean(k1):+.4f} (n {len(k1)}, sd {np.std(k1, ddof=1):.4f}), "
              f"K = 8 {np.mean(k8):+.4f} (n {len(k8)}, sd {np.std(k8, ddof=1):.4f}); Welch t {t.statistic:.2f}, "
              f"two-sided p {t.pvalue:.4f}. Planted arms left out (their term is in the log; the planted layer's "
              f"c: {', '.join(f'{d} {DESIGNS[d].c}' for d in DESIGNS)})."]
    return "\n".join(lines)


def report_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.attendout placebo-log-report")
    p.add_argument("out", nargs="+", help="the folder `placebo-log` wrote (several: one per seed, split per run)")
    p.add_argument("--decisive", default=None, help="also summarise the logs of the decisive designs in this folder")
    args = p.parse_args(argv)
    folders = [Path(f) for f in args.out]
    for folder in folders:
        print(f"## {folder}\n\n{report(folder)}\n")
    if len(folders) > 1:
        print(seeds_report(folders, Path(args.decisive) if args.decisive else None))
    if args.decisive:
        print("\n" + committed_logs(Path(args.decisive)))
    return 0
