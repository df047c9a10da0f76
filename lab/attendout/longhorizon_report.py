"""Analysis, report and figure of the long-horizon AttendOut experiment (`longhorizon.py`), from `runs.jsonl`.

    python -m lab.attendout longhorizon-report lab/attendout/results/longhorizon

Per g_lr:
- separation: G's policy change (end minus start on the common reference input) of a real-reward run against the
  placebo run of the same seed, as an RMS distance, beside every seed-to-seed distance (real-real, placebo-placebo);
  G separates from the placebo only if every matched distance exceeds every seed-to-seed one. The same for planted.
- the placebo band at each probe: the largest |drop-rate change since step 0| of any placebo run in any layer. A
  layer of an arm has moved when every seed's change in that layer lies beyond the band, all in the same direction;
  the first such probe is the arm's detection step.
- the steps the real signal would need, by the positive control's scaling: the drift of a REINFORCE policy grows with
  the correlation c between what G is told (the two masks' reward difference) and the masks' difference in a layer's
  drop share, while the noise-driven spread does not depend on c, so detection needs about N_planted * (c_planted /
  c_real)^2 steps. c_real is the real runs' largest |mean correlation over seeds| over layers; when it is within two
  standard errors of 0 the bound uses two standard errors instead (the most signal the data allow).
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np


def read_runs(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rms(x) -> float:
    return float(np.sqrt(np.mean(np.square(x))))


def rates(run: dict) -> np.ndarray:
    """(probes, layers) drop rates on the reference input."""
    return np.array([p["reference"] for p in run["probes"]])


def separation(runs: list[dict], arm: str) -> dict:
    """Matched (same seed) distances of `arm` to placebo, and every seed-to-seed distance within both arms."""
    by = {(r["arm"], r["seed"]): np.array(r["delta"]) for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    matched = [rms(by[arm, s] - by["placebo", s]) for s in seeds if (arm, s) in by and ("placebo", s) in by]
    within = [rms(by[a, s] - by[a, t]) for a in (arm, "placebo") for s, t in itertools.combinations(seeds, 2)
              if (a, s) in by and (a, t) in by]
    return {"matched": matched, "seed_to_seed": within,
            "separated": bool(matched and within and min(matched) > max(within)),
            "matched_mean": float(np.mean(matched)) if matched else math.nan,
            "seed_to_seed_mean": float(np.mean(within)) if within else math.nan,
            "movement": [rms(by[arm, s]) for s in seeds if (arm, s) in by]}


def band(runs: list[dict]) -> np.ndarray:
    """(probes,) the placebo band: the largest |change since step 0| of any placebo run in any layer (NaN without
    a placebo run: then nothing counts as moved)."""
    placebo = [rates(r) for r in runs if r["arm"] == "placebo"]
    if not placebo:
        return np.full(len(runs[0]["probes"]), np.nan)
    return np.max([np.abs(x - x[0]).max(1) for x in placebo], axis=0)


def moved(runs: list[dict], arm: str, limit: np.ndarray, steps: list[int]) -> dict:
    """Per layer: the first probe step at which every seed's change lies beyond the band in one direction."""
    changes = np.array([rates(r) - rates(r)[0] for r in runs if r["arm"] == arm])  # (seeds, probes, layers)
    out = {}
    for layer in range(changes.shape[2]):
        c = changes[:, :, layer]
        beyond = ((c > limit).all(0)) | ((c < -limit).all(0))
        hit = np.flatnonzero(beyond)
        out[str(layer)] = {"first_step": int(steps[hit[0]]) if hit.size else None,
                           "end_change_per_seed": c[:, -1].tolist(), "end_band": float(limit[-1]),
                           "moved_at_end": bool(beyond[-1])}
    return out


def analyse(runs: list[dict], meta: dict) -> dict:
    batch = meta["args"]["batch_size"]
    layer = meta["args"]["planted_layer"]
    out = {}
    for g_lr in sorted({r["g_lr"] for r in runs}):
        group = [r for r in runs if r["g_lr"] == g_lr]
        steps = [p["step"] for p in group[0]["probes"]]
        limit = band(group)
        arms = sorted({r["arm"] for r in group})
        entry = {"placebo_band_end": float(limit[-1]), "steps": steps, "band": limit.tolist()}
        for arm in arms:
            corr = np.array([r["share_reward_corr"] for r in group if r["arm"] == arm])
            entry[arm] = {"moved": moved(group, arm, limit, steps), "corr_mean": corr.mean(0).tolist(),
                          "corr_per_seed": corr.tolist(),
                          "rates_mean": np.mean([rates(r) for r in group if r["arm"] == arm], 0).tolist(),
                          "rates_std": np.std([rates(r) for r in group if r["arm"] == arm], 0).tolist(),
                          "g_updates": [r["g_updates"] for r in group if r["arm"] == arm],
                          "loss_last100": [r["loss_last100"] for r in group if r["arm"] == arm],
                          "train_s": [r["train_s"] for r in group if r["arm"] == arm]}
            if arm != "placebo":
                entry[arm]["separation"] = separation(group, arm)
        if "real" in arms and "planted" in arms:
            entry["steps_needed"] = steps_needed(entry, layer, batch)
        out[f"{g_lr:g}"] = entry
    return out


def steps_needed(entry: dict, layer: int, batch: int) -> dict:
    """The real signal's steps to detection by the planted control's scaling (see the module docstring)."""
    planted, real = entry["planted"], entry["real"]
    n_planted = planted["moved"][str(layer)]["first_step"]
    c_planted = abs(planted["corr_mean"][layer])
    mean = np.abs(np.array(real["corr_per_seed"]).mean(0))  # |mean over seeds| per layer: noise averages out
    best = int(np.argmax(mean))
    c_real = float(mean[best])
    # a correlation over n independent pairs has standard error ~ 1/sqrt(n); n = reward steps x samples x seeds
    se = 1 / math.sqrt(sum(real["g_updates"]) * batch)
    bounded = c_real < 2 * se
    c_used = 2 * se if bounded else c_real
    out = {"planted_first_step": n_planted, "c_planted": c_planted, "c_real": c_real, "c_real_layer": best,
           "c_real_se": se, "c_real_within_2se_of_0": bounded, "c_used": c_used}
    out["real_steps_needed"] = None if n_planted is None else float(n_planted * (c_planted / c_used) ** 2)
    return out


def figure(path: Path, runs: list[dict], analysis: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g_lrs = list(analysis)
    layers = len(runs[0]["probes"][0]["reference"])
    fig, axes = plt.subplots(len(g_lrs), layers, figsize=(5.2 * layers, 3.4 * len(g_lrs)), squeeze=False)
    colours = {"real": "tab:blue", "placebo": "tab:orange", "planted": "tab:green"}
    for row, g in enumerate(g_lrs):
        group = [r for r in runs if f"{r['g_lr']:g}" == g]
        steps = analysis[g]["steps"]
        for layer in range(layers):
            ax = axes[row][layer]
            for r in group:
                ax.plot(steps, rates(r)[:, layer], color=colours[r["arm"]], alpha=0.75, lw=1,
                        label=r["arm"] if r["seed"] == min(x["seed"] for x in group) else None)
            start = rates(group[0])[0, layer]
            limit = np.array(analysis[g]["band"])
            ax.fill_between(steps, start - limit, start + limit, color="grey", alpha=0.15,
                            label="placebo band (around seed 0's start)")
            ax.set(title=f"g_lr={g}, layer {layer}", xlabel="step (one G update each)",
                   ylabel="G's mean drop probability (reference input)")
            ax.set_ylim(bottom=0)  # a drop probability; the band's lower edge may reach below
            if row == 0 and layer == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(meta: dict, analysis: dict, runs: list[dict], wall_s: float | None) -> str:
    a = meta["args"]
    lines = ["# AttendOut over thousands of G updates: real reward vs placebo vs planted", "",
             "Commands (one process each, side by side, each `nice -n 10` with one torch thread):", "",
             *[f"    {c}" for c in meta["commands"]], "",
             f"Machine: {meta['machine']}; load average at the start of each process "
             f"{'; '.join(meta['loads_at_start'])} (shared machine, other jobs running)  ",
             f"Date: {meta['date']} (first process started)"
             + (f"; wall time {wall_s / 60:.0f} min" if wall_s else ""), "",
             f"Model: {'a random-init BERT, hidden ' + str(a['hidden']) if a['hidden'] else a['model']} with "
             f"{a['layers']} layers (MiniLM's vocabulary and tokenizer"
             f"{', word embeddings frozen' if a['freeze_embeddings'] else ''}), {a['task']}, batch {a['batch_size']}, "
             f"max length {a['max_length']}, lr {a['lr']}; {a['updates']} G updates per run; seeds {a['seeds']}; "
             f"planted: strength {a['strength']} on layer {a['planted_layer']}.", ""]
    lines += ["| g_lr | arm | drop rate per layer, start -> end (mean ± sd over seeds) | moved beyond the placebo band "
              "(first probe, every seed beyond it in one direction) | separated from placebo | "
              "matched / seed-to-seed distance | "
              "corr(reward diff, drop-share diff) per layer |", "|---|---|---|---|---|---|---|"]
    for g, e in analysis.items():
        for arm in ("real", "placebo", "planted"):
            if arm not in e:
                continue
            r, sd = np.array(e[arm]["rates_mean"]), np.array(e[arm]["rates_std"])
            rate = ", ".join(f"{r[0, i]:.3f} -> {r[-1, i]:.3f} ± {sd[-1, i]:.3f}" for i in range(r.shape[1]))
            first = ", ".join(f"L{layer}: {m['first_step'] if m['first_step'] is not None else 'no'}"
                              f"{' (still at the end)' if m['moved_at_end'] else ''}"
                              for layer, m in e[arm]["moved"].items()) if arm != "placebo" else "(defines the band)"
            sep = e[arm].get("separation")
            sep_s = ("yes" if sep["separated"] else "no") if sep else ""
            dist = f"{sep['matched_mean']:.4f} / {sep['seed_to_seed_mean']:.4f}" if sep else ""
            corr = ", ".join(f"{c:+.4f}" for c in e[arm]["corr_mean"])
            lines.append(f"| {g} | {arm} ({len(e[arm]['g_updates'])} seeds) | {rate} | {first} | {sep_s} | {dist} "
                         f"| {corr} |")
    lines += ["", "Placebo band at the end (largest |drop-rate change| of any placebo run in any layer): " +
              ", ".join(f"g_lr {g}: {e['placebo_band_end']:.4f}" for g, e in analysis.items()) + ".", "",
              "## Steps the real signal would need (positive control's scaling)", ""]
    for g, e in analysis.items():
        s = e.get("steps_needed")
        if not s:
            continue
        if s["real_steps_needed"] is None:
            lines.append(f"- g_lr {g}: the planted control never left the placebo band, so it gives no scale.")
            continue
        lines.append(f"- g_lr {g}: planted (|c| = {s['c_planted']:.3f}) left the band at step "
                     f"{s['planted_first_step']}; real |c| = {s['c_real']:.4f} (layer {s['c_real_layer']}, standard "
                     f"error {s['c_real_se']:.4f}"
                     f"{', within two standard errors of 0' if s['c_real_within_2se_of_0'] else ''})"
                     f" -> about {s['real_steps_needed']:,.0f} steps"
                     f"{' at the very least' if s['c_real_within_2se_of_0'] else ''}.")
    return "\n".join(lines) + "\n"


def write(out: Path, wall_s: float | None = None) -> Path:
    metas = [json.loads(p.read_text()) for p in sorted(out.glob("meta*.json"))]
    meta = metas[0] | {"commands": [m["command"] for m in metas], "loads_at_start": [m["load_at_start"] for m in metas],
                       "date": min(m["date"] for m in metas)}
    meta["args"] = metas[0]["args"] | {key: sorted({v for m in metas for v in m["args"][key]})
                                       for key in ("g_lrs", "seeds", "arms")}
    runs = {}
    for path in sorted(out.glob("runs*.jsonl")):
        for r in read_runs(path):  # a cell run twice by side-by-side processes counts once
            runs.setdefault((r["arm"], r["g_lr"], r["seed"]), r)
    runs = list(runs.values())
    analysis = analyse(runs, meta)
    summaries = [{k: v for k, v in r.items() if k != "delta"} for r in runs]
    (out / "results.json").write_text(json.dumps({"meta": meta | {"wall_s": wall_s}, "analysis": analysis,
                                                  "runs": summaries}, indent=1) + "\n")
    figure(out / "drop_rates.png", runs, analysis)
    notes = out / "notes.md"  # what the commands do not say (written by hand), appended to the report
    (out / "report.md").write_text(markdown(meta, analysis, runs, wall_s)
                                   + ("\n" + notes.read_text() if notes.is_file() else ""))
    return out / "report.md"


def main(argv: list[str]) -> int:
    print(write(Path(argv[0] if argv else "lab/attendout/results/longhorizon")))
    return 0
