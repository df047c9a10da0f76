"""Verdict, markdown and figure of the AttendOut placebo experiment, from its `results.json`.

    python -m lab.attendout report lab/attendout/results/placebo   # re-render report.md and policy.png

The acceptance bar is judged by strict separation: G has learned only if every real-vs-placebo distance (same seed)
exceeds every seed-to-seed distance (real-real and placebo-placebo pairs). Under exchangeable distances (no signal),
3 given values out of 9 are all the largest with probability 1 / C(9, 3) = 1/84. The means of both groups are
reported beside it. The drop-share correlation is the mean over real-reward runs of each run's mean per-step
correlation between advantage and realised drop share (a negative value: masks that drop more pairs got a lower
reward), with its standard error over seeds. The accumulated reward (`reward_snr_accumulated`, possibly added later by
`--only-snr`) is rendered in its own section with its own command, date and load.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np


def verdict(policy: dict) -> dict:
    matched = policy["real_vs_placebo_same_seed"]["distance"]
    seeds = policy["real_seed_to_seed"]["distance"] + policy["placebo_seed_to_seed"]["distance"]
    n, k = len(matched) + len(seeds), len(matched)
    return {"real_vs_placebo_mean": statistics.fmean(matched), "seed_to_seed_mean": statistics.fmean(seeds),
            "separated": min(matched) > max(seeds), "separation_p_if_no_signal": 1 / math.comb(n, k),
            "real_agreement_cosine_mean": statistics.fmean(policy["real_seed_to_seed"]["cosine"])}


def drop_share_correlation(summaries: list[dict]) -> tuple[float, float]:
    values = [s["adv_vs_drop_corr_mean"] for s in summaries if not s["placebo"]]
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return statistics.fmean(values), se


def _snr_lines(snr: dict, f) -> list[str]:
    lines = ["## Reward signal-to-noise", "",
             "Signal: Attacker (G's masks) minus Defender (vanilla attention dropout); noise: Defender minus an "
             "independent Defender; rounding: fp32 minus float64 of the same reward.", "",
             "| reward | signal std | noise std | SNR | fp32 rounding RMS | n |", "|---|---|---|---|---|---|"]
    for name, s in snr.items():
        lines.append(f"| {name} | {f(s['signal_std'])} | {f(s['noise_std'])} | {s['snr']:.2f} | "
                     f"{f(s['rounding_rms']) if 'rounding_rms' in s else ''} | {s['n']} |")
    return lines


def _policy_lines(policy: dict, v: dict, f) -> list[str]:
    lines = ["", "## G's policy: real reward vs placebo", "",
             "delta = G's drop probabilities at the end minus at the start, on the same reference input.", "",
             "| comparison | RMS distance (each pair) | cosine of the changes |", "|---|---|---|"]
    for name in ("real_vs_placebo_same_seed", "real_seed_to_seed", "placebo_seed_to_seed"):
        lines.append(f"| {name.replace('_', ' ')} | {', '.join(f(x) for x in policy[name]['distance'])} | "
                     f"{', '.join(f'{x:.2f}' for x in policy[name]['cosine'])} |")
    moved = {k: ", ".join(f(x) for x in policy[f"movement_{k}"]) for k in ("real", "placebo")}
    return lines + ["", f"Movement from initialisation (RMS of delta): real {moved['real']}; placebo "
                    f"{moved['placebo']}.", "",
                    f"Mean distance real vs placebo {f(v['real_vs_placebo_mean'])}, seed to seed "
                    f"{f(v['seed_to_seed_mean'])}; mean cosine between real runs' changes "
                    f"{v['real_agreement_cosine_mean']:+.2f}.", "",
                    f"Acceptance bar (every real-vs-placebo distance above every seed-to-seed distance; chance "
                    f"{v['separation_p_if_no_signal']:.3f} without signal): "
                    f"**{'met' if v['separated'] else 'not met'}**."]


def _accumulated_lines(acc: dict, f) -> list[str]:
    meta, summary = acc["meta"], acc["summary"]
    ks = list(next(iter(summary.values())))
    lines = ["", "## Reward accumulated over k steps", "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}; load average {meta['load']}  ",
             f"Date: {meta['date']}; {meta['wall_s'] / 60:.1f} min", ""]
    if "model_run" in acc:
        m = acc["model_run"]
        lines += [f"Measured on a retrained seed-{m['seed']} real-reward model (dev acc {m['dev_accuracy']:.3f}, end "
                  f"drop rates {' '.join(f'{x:.3f}' for x in m['drop_rate_per_layer_end'])}).", ""]
    lines += [f"The first-order batch reward of each of {len(acc['steps'])} consecutive steps (weights held fixed, "
              "common random numbers), summed over non-overlapping blocks of k steps: signal G's mask minus a "
              "Defender (`first_order_batch`) or minus a second G mask (`first_order_rloo_batch`), noise a Defender "
              "minus an independent Defender. Interval: 95% bootstrap over blocks (none below 6). `g_accumulate` "
              "itself sums k steps' policy gradients, each from its own step's reward: the k = 1 rows are the SNR "
              "of each of its terms. G1 and G2 are draws of the same policy, so a `first_order_rloo_batch` ratio "
              "above 1 says only that G's masks (shared by the heads) move the reward more than vanilla dropout's "
              "do, not that the reward tells good policies from bad.", "",
              "| reward | k | signal std | noise std | SNR | 95% interval | signal mean | n |",
              "|---|---|---|---|---|---|---|---|"]
    for name, per_k in summary.items():
        for k in ks:
            s = per_k[k]
            interval = "" if math.isnan(s["snr_low"]) else f"{s['snr_low']:.2f}–{s['snr_high']:.2f}"
            lines.append(f"| {name} | {k} | {f(s['signal_std'])} | {f(s['noise_std'])} | {s['snr']:.2f} | "
                         f"{interval} | {f(s['signal_mean'])} | {s['n']} |")
    return lines + ["", accumulated_verdict(summary)]


def accumulated_verdict(summary: dict) -> str:
    """One sentence: the largest accumulated SNR (k > 1) and whether any interval lies wholly above 1."""
    rows = [(s["snr"], name, k, s) for name, per_k in summary.items() for k, s in per_k.items() if k != "1"]
    best, name, k, s = max(rows, key=lambda r: r[0])
    above = [f"{n} k={kk}" for _, n, kk, r in rows if r["snr_low"] > 1]
    return (f"Largest accumulated SNR: {best:.2f} ({name}, k={k}, interval {s['snr_low']:.2f}–{s['snr_high']:.2f}, "
            f"n={s['n']}). Interval wholly above 1: {', '.join(above) if above else 'none'}.")


def markdown(meta: dict, snr: dict, policy: dict, summaries: list[dict], accumulated: dict | None = None) -> str:
    f = "{:.3g}".format
    v = verdict(policy)
    corr, corr_se = drop_share_correlation(summaries)
    separate = accumulated is not None and accumulated["meta"]["command"] != meta["command"]
    lines = [f"# AttendOut placebo experiment ({meta['task']}, {meta['model']})", "",
             f"Command{' (every part but the accumulated reward)' if separate else ''}: `{meta['command']}`  ",
             f"Machine: {meta['machine']}; load average {meta['load']} "
             "(shared machine, other jobs running)  ", f"Date: {meta['date']}; {meta['wall_s'] / 60:.1f} min", ""]
    lines += _snr_lines(snr, f) + (_accumulated_lines(accumulated, f) if accumulated else [])
    lines += _policy_lines(policy, v, f)
    lines += ["", "## Runs", "",
              f"Correlation of the advantage with the realised drop share, real-reward runs: {corr:+.3f} "
              f"(standard error over seeds {corr_se:.3f}).", "",
              "| seed | reward | dev acc | drop rate per layer (end) | reward std | between-mask std | "
              "corr(adv, drop share) | step ratio | train s |", "|---|---|---|---|---|---|---|---|---|"]
    def ratio(x):  # not measured in-run on a GPU (the probe would stall it): None
        return "-" if x is None else f"{x:.2f}"

    for s in summaries:
        rates = " ".join(f"{x:.3f}" for x in s["drop_rate_per_layer_end"])
        lines.append(f"| {s['seed']} | {'placebo' if s['placebo'] else 'real'} | {s['dev_accuracy']:.3f} | {rates} "
                     f"| {f(s['reward_std'])} | {f(s['between_masks_std'])} | {s['adv_vs_drop_corr_mean']:+.3f} | "
                     f"{ratio(s['cost']['step_ratio'])} | {s['train_s']:.0f} |")
    lines += ["", f"Drop rate per layer at initialisation: "
              f"{' '.join(f'{x:.3f}' for x in summaries[0]['drop_rate_per_layer_start'])}.", ""]
    return "\n".join(lines)


def figure(path: Path, summaries: list[dict], policy: dict, snr: dict, accumulated: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6))
    for placebo, colour in ((False, "tab:blue"), (True, "tab:orange")):
        rows = np.array([s["drop_rate_per_layer_end"] for s in summaries if s["placebo"] == placebo])
        layers = np.arange(rows.shape[1])
        axes[0].errorbar(layers, rows.mean(0), yerr=rows.std(0), capsize=3, color=colour, marker="o",
                         label="placebo" if placebo else "real reward")
    start = np.array(summaries[0]["drop_rate_per_layer_start"])
    axes[0].plot(np.arange(len(start)), start, "k--", label="at initialisation")
    axes[0].set(xlabel="layer", ylabel="G's mean drop probability (reference input)", title="Per-layer drop rate")
    axes[0].legend()
    groups = [("real vs placebo\n(same seed)", policy["real_vs_placebo_same_seed"]["distance"]),
              ("real, seed\nto seed", policy["real_seed_to_seed"]["distance"]),
              ("placebo, seed\nto seed", policy["placebo_seed_to_seed"]["distance"])]
    for i, (label, values) in enumerate(groups):
        axes[1].bar(i, np.mean(values), color="grey", alpha=0.6)
        axes[1].scatter([i] * len(values), values, color="k", zorder=3)
    axes[1].set_xticks(range(len(groups)), [g[0] for g in groups])
    axes[1].set(ylabel="RMS distance of policy changes", title="Policy distances")
    names, values = list(snr), [snr[n]["snr"] for n in snr]
    for name, per_k in (accumulated or {}).get("summary", {}).items():
        for k in per_k:
            if k != "1":
                names.append(f"{name}_(k={k})")
                values.append(per_k[k]["snr"])
    colours = ["tab:green" if n in snr else "tab:purple" for n in names]
    axes[2].bar(range(len(names)), values, color=colours)
    axes[2].axhline(1.0, color="k", ls="--")
    axes[2].set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=7)
    axes[2].set(ylabel="std(Attacker-Defender) / std(Defender-Defender)",
                title="Reward signal / noise (purple: summed over k steps)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(out: Path, results: dict) -> None:
    """report.md and policy.png from the experiment's results (as written to results.json)."""
    accumulated = results.get("reward_snr_accumulated")
    (out / "report.md").write_text(markdown(results["meta"], results["reward_snr"], results["policy"],
                                            results["runs"], accumulated))
    figure(out / "policy.png", results["runs"], results["policy"], results["reward_snr"], accumulated)


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "lab/attendout/results/placebo")
    write(folder, json.loads((folder / "results.json").read_text()))
    print(folder / "report.md")
    return 0
