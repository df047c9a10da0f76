"""The pre-registered tests of the decisive designs (`decisive.py`), and their power.

    python -m lab.attendout decisive-report lab/attendout/results/decisive/A    # verdict.{json,md}
    python -m lab.attendout decisive-power lab/attendout/results/decisive       # power.{json,md}

The tests are those of lab/attendout/results/decisive/PREREGISTRATION-*.md, applied to whatever runs have finished: a
design with fewer runs than registered is reported "in progress" with its counts and no verdict.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

from .decisive import ALPHA, DESIGNS, LAYER, a_power_from_kappa, b_horizon, by_arm, endpoint, kappa, mean_corr, t_power
from .longhorizon_report import read_runs

ANCHOR = "lab/attendout/results/longhorizon/results.json"  # the long-horizon control: c = 0.0432, g_lr 1e-3
A_OFFLINE_BOUND = 0.0058                                # |c| at two SE, Defender baseline (information.json)


def counts(design, arms: dict) -> dict:
    return {arm: f"{len(arms.get(arm, {}))}/{len(seeds)}" for arm, seeds in design.arms.items()}


def complete(design, arms: dict) -> bool:
    return all(set(seeds) <= set(arms.get(arm, {})) for arm, seeds in design.arms.items())


def test_a(arms: dict) -> dict:
    """Paired (by seed) one-sided t-test: planted minus placebo in layer LAYER > 0."""
    seeds = DESIGNS["A"].arms["planted"]
    planted, placebo = (np.array([arms[a][s] for s in seeds]) for a in ("planted", "placebo"))
    t, p = stats.ttest_rel(planted, placebo, alternative="greater")
    learned = bool(p < ALPHA)
    return {"planted": planted.tolist(), "placebo": placebo.tolist(), "mean_diff": float((planted - placebo).mean()),
            "t": float(t), "p": float(p), "df": len(seeds) - 1, "control_learned": learned,
            "decision": ("G learned the planted layer's rate from a signal of c = 0.022 within 371 updates; the "
                         "offline bound puts the real reward's signal 4x lower (|c| <= 0.0058), so a benchmark run "
                         "is far too short for the real reward to move G detectably" if learned else
                         "G did not detectably learn a layer's rate within 371 updates even from a signal of "
                         "c = 0.022, 4x the offline bound on the real reward's: within a benchmark run AttendOut is "
                         "scores dropout at p_init with per-sample masks")}


def test_b(arms: dict) -> dict:
    """The planted arm against 0 (one-sided, the control), the real arm against 0 (two-sided, the endpoint), the
    placebo's mean against 0 (two-sided, the sanity check of the zero-drift assumption)."""
    def one(arm, alternative):
        x = np.array([arms[arm][s] for s in DESIGNS["B"].arms[arm]])
        t, p = stats.ttest_1samp(x, 0.0, alternative=alternative)
        return {"values": x.tolist(), "mean": float(x.mean()), "t": float(t), "p": float(p), "df": len(x) - 1}

    out = {"planted": one("planted", "greater"), "real": one("real", "two-sided"),
           "placebo": one("placebo", "two-sided")}
    control, real = out["planted"]["p"] < ALPHA, out["real"]["p"] < ALPHA
    sane = out["placebo"]["p"] >= ALPHA
    if not control:
        decision = "undecided: the planted control at the offline bound was not learned within the horizon"
    elif real:
        sign = "more" if out["real"]["mean"] > 0 else "less"
        decision = f"G learns from the real reward: layer {LAYER} moves to drop {sign}"
    else:
        decision = (f"G does not learn layer {LAYER}'s rate from the real reward at this horizon, where a signal at "
                    "the offline bound is learned")
    if not sane:  # the registered fallback: the real arm against the placebo (Welch)
        t, p = stats.ttest_ind(out["real"]["values"], out["placebo"]["values"], equal_var=False)
        out["fallback_real_vs_placebo"] = {"t": float(t), "p": float(p)}
        decision += (" (the placebo drifted away from 0, so by the registered fallback the real arm is read against "
                     f"the placebo: Welch p = {p:.3g})")
    return out | {"control_learned": bool(control), "real_moved": bool(real), "placebo_sane": bool(sane),
                  "decision": decision}


# issue 66's real-reward forms (PREREGISTRATION-real.md): the equivalence margin is the drift that a signal of the
# placebo logs' correlation (0.0188) gives in layer 1 over 371 updates at design A's kappa (0.0030): 0.021
REAL_MARGIN = 0.021
REAL_FORMS = ("A_real", "rloo2")


def real_vs_placebo(real: dict[int, float], placebo: dict[int, float], seeds: tuple[int, ...]) -> dict:
    """Paired by seed, real minus placebo in layer LAYER: the two-sided t-test (does G move?) and the TOST at
    +-REAL_MARGIN (does it move less than a signal of correlation 0.0188 would?), each at ALPHA before Holm."""
    r, q = (np.array([arm[s] for s in seeds]) for arm in (real, placebo))
    d = r - q
    n = len(d)
    se = d.std(ddof=1) / math.sqrt(n)
    t, p = stats.ttest_1samp(d, 0.0)
    p_low = float(stats.t.sf((d.mean() + REAL_MARGIN) / se, n - 1))   # H0: diff <= -margin
    p_high = float(stats.t.cdf((d.mean() - REAL_MARGIN) / se, n - 1))  # H0: diff >= +margin
    half = stats.t.ppf(1 - ALPHA / 2, n - 1) * se
    return {"seeds": list(seeds), "real": r.tolist(), "placebo": q.tolist(), "mean_diff": float(d.mean()),
            "ci95": [float(d.mean() - half), float(d.mean() + half)], "t": float(t), "p": float(p), "df": n - 1,
            "tost_p": max(p_low, p_high), "margin": REAL_MARGIN}


def test_real_forms(root: Path) -> dict:
    """Both forms' tests with Holm over the two forms (separately for the difference and the equivalence tests);
    a form without all its registered runs is left out and the family is not decided."""
    placebo_a = by_arm(read_runs(root / "A" / "runs.jsonl")).get("placebo", {})
    tests = {}
    for name in REAL_FORMS:
        folder = root / name
        if not (folder / "runs.jsonl").is_file():
            continue
        design, arms = DESIGNS[name], by_arm(read_runs(folder / "runs.jsonl"))
        placebo = placebo_a if name == "A_real" else arms.get("placebo", {})
        seeds = design.arms["real"]
        if set(seeds) <= set(arms.get("real", {})) and set(seeds) <= set(placebo):
            tests[name] = real_vs_placebo(arms["real"], placebo, seeds)
    if set(tests) != set(REAL_FORMS):
        return {"complete": False, "forms": tests}
    for key, verdict in (("p", "moved"), ("tost_p", "equivalent")):
        order = sorted(tests, key=lambda f: tests[f][key])
        for rank, form in enumerate(order):  # Holm: step down over the 2 forms, stop at the first not rejected
            adjusted = max(min(1.0, tests[f][key] * (len(order) - i)) for i, f in enumerate(order[:rank + 1]))
            tests[form][f"{key}_holm"] = adjusted
            tests[form][verdict] = bool(adjusted < ALPHA)
    for t in tests.values():
        t["decision"] = ("G moves layer 1's rate under the real reward (" + ("more" if t["mean_diff"] > 0 else "less")
                         + " drop) within 371 updates" if t["moved"] else
                         f"G moves layer 1's rate less than +-{REAL_MARGIN} against the placebo within 371 updates "
                         "(less than a signal of correlation 0.0188 would)" if t["equivalent"] else "undecided")
    return {"complete": True, "forms": tests}


def report(out: Path) -> dict:
    meta = json.loads((out / "meta.json").read_text())
    design = DESIGNS[meta["design"]["name"]]
    runs = read_runs(out / "runs.jsonl")
    arms = by_arm(runs)
    result = {"design": design.name, "updates": meta["updates"], "layer": LAYER, "counts": counts(design, arms),
              "complete": complete(design, arms), "seconds_per_step": per_step(runs),
              "adv_share_corr": {arm: mean_corr(runs, arm) for arm in design.arms}}
    if design.name == "kappa" and len(set(arms.get("planted", {})) & set(arms.get("placebo", {}))) >= 2:
        result["kappa"] = kappa(runs, design, meta["updates"])
        result["B_horizon"] = b_horizon(result["kappa"])
        result["A_power_from_kappa"] = a_power_from_kappa(result["kappa"])
    if result["complete"] and design.name == "A":
        result["test"] = test_a(arms)
    if result["complete"] and design.name == "B":
        result["test"] = test_b(arms)
    if design.name in REAL_FORMS:
        family = test_real_forms(out.parent)
        if design.name in family["forms"]:
            result["test"] = family["forms"][design.name] | {"family_complete": family["complete"]}
            if not family["complete"]:
                result["test"]["decision"] = "in progress: the other form's runs are not all in, so Holm cannot run"
    (out / "verdict.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "verdict.md").write_text(markdown(result, runs) + "\n")
    return result


def per_step(runs: list[dict]) -> dict:
    return {f"{r['arm']}:{r['seed']}": round(r["train_s"] / r["steps"], 2) for r in runs}


def markdown(result: dict, runs: list[dict]) -> str:
    lines = [f"# Design {result['design']}: {'complete' if result['complete'] else 'in progress'}", "",
             f"Written by `python -m lab.attendout decisive-report` from runs.jsonl "
             f"({len(runs)} runs). Horizon {result['updates']} G updates; endpoint: the change of G's mean drop "
             f"probability in layer {LAYER} on the reference input.", "",
             "| arm | runs done / registered |", "|---|---:|"]
    lines += [f"| {arm} | {n} |" for arm, n in result["counts"].items()]
    lines += ["", "| run | endpoint | mean per-step corr(advantage, layer share), layer " f"{LAYER} | s per step |",
              "|---|---:|---:|---:|"]
    for r in runs:
        corr = (r.get("adv_share_corr") or {}).get("mean")
        lines.append(f"| {r['arm']} seed {r['seed']} | {endpoint(r):+.5f} | "
                     f"{'-' if corr is None else f'{corr[LAYER]:+.4f}'} | {r['train_s'] / r['steps']:.2f} |")
    if "kappa" in result and result["kappa"].get("done"):
        k, h = result["kappa"], result["B_horizon"]
        lines += ["", f"kappa = {k['kappa']:.3g} ± {k['kappa_se']:.2g} (drift per update per unit c, paired over "
                  f"{len(k['seeds'])} seeds); s = {k['s']:.3g} (per-update noise of the endpoint, pooled within arms).",
                  f"B's horizon for 80% power of the real arm at c = 0.0058 (10 seeds, two-sided 0.05): "
                  f"{fmt(h['n_point'])} updates at kappa's estimate ({fmt(h['n_kappa_plus_se'])} to "
                  f"{fmt(h['n_kappa_minus_se'])} at kappa ± 1 SE); the rule's choice: {h['n_chosen']}"
                  + ("." if k.get("complete") else " (provisional: not every registered seed pair has finished; "
                     "B's horizon is fixed only from the complete calibration)."),
                  f"A's power by kappa (scaled to K = 1): {result['A_power_from_kappa']:.2f}."]
    if "test" in result:
        lines += ["", f"**Decision**: {result['test']['decision']}.", "", "```", json.dumps(result["test"], indent=1),
                  "```"]
    return "\n".join(lines)


def fmt(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def anchor_power(path: str = ANCHOR) -> dict:
    """A's power before it runs, from the long-horizon control (a 2-layer random-init model, K = 2 rloo, g_lr 1e-3,
    3 seeds per arm): kappa from the planted arm's layer-0 change at update 100 (c = its measured correlation) minus
    the mean of the arms without a planted signal (real and placebo), s from those arms' spread over seeds at the
    probes up to A's horizon (per sqrt(update), pooled); scaled to A's c and n (drift ~ c n, noise ~ sqrt(n)). Also
    the power of the same test for a signal at the offline bound."""
    runs = [r for r in json.loads(Path(path).read_text())["runs"] if r["g_lr"] == 0.001]
    a = DESIGNS["A"]

    def changes(arm):  # (seeds, probes) layer-0 change since step 0
        return np.array([[p["reference"][0] - r["probes"][0]["reference"][0] for p in r["probes"]]
                         for r in runs if r["arm"] == arm])

    steps = np.array([p["step"] for p in runs[0]["probes"]])
    at100, early = int(np.flatnonzero(steps == 100)[0]), (steps > 0) & (steps <= a.updates + 29)
    quiet = [changes("placebo"), changes("real")]
    c0 = float(np.mean([r["share_reward_corr"][0] for r in runs if r["arm"] == "planted"]))
    k = (changes("planted")[:, at100].mean() - np.mean([x[:, at100].mean() for x in quiet])) / (c0 * 100)
    var = np.mean([x[:, early].var(0, ddof=1) for x in quiet], 0) / steps[early]  # per update, per probe
    s = float(np.sqrt(var.mean()))
    seeds = len(a.arms["planted"])

    def power(c):
        return t_power(k * c * math.sqrt(a.updates) / s / math.sqrt(2) * math.sqrt(seeds), seeds - 1)

    return {"anchor": path, "c_anchor": c0, "kappa": float(k), "s": s, "probes_for_s": steps[early].tolist(),
            "A_power": power(a.c), "A_power_at_offline_bound": power(A_OFFLINE_BOUND)}


def power_main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "lab/attendout/results/decisive")
    out = {"A_from_anchor": anchor_power()}
    kappa_dir = root / "kappa"
    if (kappa_dir / "runs.jsonl").is_file():
        v = report(kappa_dir)
        if v.get("kappa", {}).get("done"):
            out |= {"kappa": v["kappa"], "B_horizon": v["B_horizon"], "A_from_kappa": v["A_power_from_kappa"],
                    "kappa_complete": v["complete"]}
    (root / "power.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


def main(argv: list[str]) -> int:
    for d in argv:
        print(json.dumps({k: v for k, v in report(Path(d)).items() if k != "adv_share_corr"}, indent=1))
    return 0
