"""AttendOut's decisive designs in MiniLM (lab/attendout/results/decisive/PREREGISTRATION-*.md): the kappa calibration,
design A (the benchmark's horizon) and design B (the paper's scale), run, tested and sized.

    python -m lab.attendout decisive --design kappa --data-dir ../shared/data/glue \
        --out lab/attendout/results/decisive/kappa                  # runs; a rerun skips the runs already in runs.jsonl
    python -m lab.attendout decisive-report lab/attendout/results/decisive/kappa   # the verdict
    python -m lab.attendout decisive-power lab/attendout/results/decisive          # A's and B's power

Each run is `longhorizon.train_run` (its machinery: the model, AttendOut, the planted control, the reference-input
probes) with the decisive setting: the pre-trained 6-layer MiniLM, MRPC's full training set, lr 1e-4 (the `quick`
preset's), batch 16, max length 128, all weights trained, G at g_lr 1e-3, the Defender baseline with K masks per
update, the planted arm's term added on top of the real reward (`planted.AddedReward`), one G update per step.
The endpoint of every design: the change, from step 0 to the last update, of G's mean drop probability in layer
`LAYER` on the fixed reference input (the initial model's hidden states on fixed dev batches).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

LAYER = 1          # the endpoint's layer: the one whose offline bound (|c| <= 0.0058) is the largest
ALPHA = 0.05
POWER = 0.80
B_BOUNDS = (100, 2000)  # B's sized horizon is clipped to this range (updates)


@dataclasses.dataclass(frozen=True)
class Design:
    name: str
    arms: dict[str, tuple[int, ...]]   # arm -> seeds
    updates: int | None                # None: sized by the kappa calibration (B)
    mask_samples: int
    c: float                           # the planted arm's added correlation
    baseline: str = "defender"         # AttendOut's advantage: the Defender's (the default) or rloo (K = 2 published)


DESIGNS = {
    "kappa": Design("kappa", {"planted": (0, 1, 2), "placebo": (0, 1, 2)}, 100, 8, 0.02),
    "A": Design("A", {"planted": tuple(range(5)), "placebo": tuple(range(5))}, 371, 1, 0.022),
    "B": Design("B", {"real": tuple(range(10)), "planted": tuple(range(10)), "placebo": (0, 1, 2)}, None, 8, 0.0058),
    # issue 66 (PREREGISTRATION-real.md): the real reward at the benchmark's horizon in two forms; A_real's placebo
    # is design A's (same seeds, same setting), rloo2 has its own
    "A_real": Design("A_real", {"real": tuple(range(5))}, 371, 1, 0.0),
    "rloo2": Design("rloo2", {"real": tuple(range(5)), "placebo": tuple(range(5))}, 371, 2, 0.0, "rloo"),
}


def longhorizon_argv(design: Design, updates: int, data_dir: str, out: str) -> list[str]:
    """The design as `longhorizon` options (the setting of the module docstring)."""
    return ["--data-dir", data_dir, "--task", "mrpc", "--model", "minilm", "--layers", "6", "--hidden", "0",
            "--g-lrs", "1e-3", "--updates", str(updates), "--strength", str(design.c), "--planted-form", "added",
            "--planted-layer", str(LAYER), "--baseline", design.baseline, "--mask-samples", str(design.mask_samples),
            "--batch-size", "16", "--max-length", "128", "--lr", "1e-4", "--warmup-ratio", "0.06",
            "--probe-every", "10", "--reference-batches", "4", "--threads", "1", "--no-freeze-embeddings",
            "--out", out]


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m lab.attendout decisive",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--design", required=True, choices=sorted(DESIGNS))
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--updates", type=int, default=None, help="B only: the horizon the kappa calibration sized")
    p.add_argument("--only", nargs="*", default=None, metavar="ARM:SEED",
                   help="run only these runs (e.g. planted:0 placebo:0), for a process sharing the work")
    p.add_argument("--time-steps", type=int, default=0,
                   help="instead of the runs: time this many real-reward steps at K = 1 and at K = 8, interleaved "
                        "(after 2 untimed ones each), and write <out>/cost.json")
    args = p.parse_args(argv)
    design = DESIGNS[args.design]
    if (design.updates is None) == (args.updates is None) and not args.time_steps:
        p.error("--updates is required for design B (from `decisive-power`) and not accepted otherwise")
    return args


def run_order(design: Design) -> list[tuple[str, int]]:
    """Seed-major, arms alternating: a stopped design has both arms of its first seeds."""
    seeds = sorted({s for v in design.arms.values() for s in v})
    return [(arm, s) for s in seeds for arm in design.arms if s in design.arms[arm]]


def main(argv: list[str]) -> int:
    from suite.run.models import quiet_transformers

    from . import longhorizon
    from .common import load_data
    from .longhorizon_report import read_runs

    args = parse(argv)
    design = DESIGNS[args.design]
    updates = design.updates or args.updates or 100
    lh = longhorizon.parse(longhorizon_argv(design, updates, args.data_dir, args.out))
    lh.verbose = True
    import torch

    torch.set_num_threads(1)
    import suite  # noqa: F401  registers the methods

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.time_steps:
        with quiet_transformers():
            return cost(lh, args, out)
    meta = longhorizon.meta(lh, argv) | {"design": dataclasses.asdict(design), "updates": updates, "layer": LAYER,
                                         "git_commit": git_commit()}
    meta["command"] = "python -m lab.attendout decisive " + " ".join(argv)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    runs_path = out / "runs.jsonl"
    todo = [(a, s) for a, s in run_order(design)
            if args.only is None or f"{a}:{s}" in args.only]
    began = time.perf_counter()
    with quiet_transformers():
        spec, tokenizer, train, dev = load_data(lh)
        pad_id = tokenizer.pad_token_id or 0
        states = longhorizon.initial_states(lh, spec, dev, pad_id)
        for arm, seed in todo:
            if (arm, seed) in {(r["arm"], r["seed"]) for r in read_runs(runs_path)}:  # finished: kept
                continue
            run = longhorizon.train_run(lh, spec, train, pad_id, states, arm, 1e-3, seed)
            run["load_at_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
            with runs_path.open("a") as f:
                f.write(json.dumps(run) + "\n")
            print(f"{design.name} {arm} seed {seed}: {run['train_s'] / run['steps']:.2f} s per step, layer {LAYER} "
                  f"change {endpoint(run):+.4f}, load {run['load_at_end']}, "
                  f"{(time.perf_counter() - began) / 60:.1f} min so far", file=sys.stderr, flush=True)
    return 0


def git_commit() -> str | None:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def cost(lh, args, out: Path) -> int:
    """Seconds per real-reward AttendOut step at K = 1 and K = 8 (Defender), steps interleaved so that both see the
    same load."""
    import torch

    from suite.run.batching import length_grouped_batches

    from . import longhorizon
    from .common import batches_of, load_data, train_step

    spec, tokenizer, train, _ = load_data(lh)
    order = length_grouped_batches(train.lengths(), lh.batch_size, torch.Generator().manual_seed(0))
    batches = list(batches_of(train, order[:args.time_steps + 3], tokenizer.pad_token_id or 0, spec))
    forms = {}
    for k in (1, 8):
        lh.mask_samples = k
        forms[k] = longhorizon.build(lh, spec, 0, "real", 1e-3)
    times: dict[int, list[float]] = {1: [], 8: []}
    for step in range(args.time_steps + 2):
        for k, (model, method, ctx) in forms.items():
            began = time.perf_counter()
            train_step(ctx, batches, step)
            times[k].append(time.perf_counter() - began)
    result = {"command": "python -m lab.attendout decisive " + " ".join(sys.argv[2:]),
              "machine": longhorizon.meta(lh, [])["machine"], "load_at_end": " ".join(f"{v:.2f}" for v in
                                                                                      os.getloadavg()),
              "tokens_per_batch": [int(b["attention_mask"].sum()) for b in batches[2:-1]]}
    for k, t in times.items():
        kept = np.array(t[2:])
        result[f"K{k}"] = {"per_step_s": float(kept.mean()), "se_s": float(kept.std(ddof=1) / math.sqrt(len(kept))),
                           "steps": len(kept), "all_s": [round(x, 3) for x in t]}
    result["ratio_K8_K1"] = result["K8"]["per_step_s"] / result["K1"]["per_step_s"]
    (out / "cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("K", "ratio", "load"))}, indent=1))
    return 0


# -- analysis ----------------------------------------------------------------------------------------------------
def endpoint(run: dict, layer: int = LAYER) -> float:
    """The change of G's mean drop probability in `layer` on the reference input, step 0 to the run's end."""
    return run["probes"][-1]["reference"][layer] - run["probes"][0]["reference"][layer]


def by_arm(runs: list[dict]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        out.setdefault(r["arm"], {})[r["seed"]] = endpoint(r)
    return out


def t_power(ncp: float, df: int, alpha: float = ALPHA, sided: int = 1) -> float:
    """Power of a t-test with `df` degrees of freedom at noncentrality `ncp` (one- or two-sided)."""
    crit = stats.t.ppf(1 - alpha / sided, df)
    power = stats.nct.sf(crit, df, ncp)
    return float(power + (stats.nct.cdf(-crit, df, ncp) if sided == 2 else 0.0))


def ncp_for(power: float, df: int, alpha: float = ALPHA, sided: int = 1) -> float:
    """The noncentrality at which a t-test with `df` degrees of freedom has `power`."""
    lo, hi = 0.0, 50.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_power(mid, df, alpha, sided) < power else (lo, mid)
    return hi


def kappa(runs: list[dict], design: Design, updates: int) -> dict:
    """The drift rate per update per unit of c (kappa) and the per-update noise (s) of the endpoint, from the
    calibration: drift = kappa * c * n, spread over seeds = s * sqrt(n) (a random walk's)."""
    arms = by_arm(runs)
    seeds = sorted(set(arms.get("planted", {})) & set(arms.get("placebo", {})))
    if len(seeds) < 2:
        return {"seeds": seeds, "done": False}
    diff = np.array([arms["planted"][s] - arms["placebo"][s] for s in seeds])
    planted, placebo = (np.array([arms[a][s] for s in seeds]) for a in ("planted", "placebo"))
    pooled_sd = math.sqrt((planted.var(ddof=1) + placebo.var(ddof=1)) / 2)
    k = diff.mean() / (design.c * updates)
    k_se = diff.std(ddof=1) / math.sqrt(len(seeds)) / (design.c * updates)
    registered = set(design.arms.get("planted", ())) & set(design.arms.get("placebo", ()))
    # "done": computable; "complete": from every registered seed pair (before that, B's horizon is provisional)
    return {"done": True, "complete": registered <= set(seeds), "seeds": seeds, "n": updates, "c": design.c,
            "planted": planted.tolist(),
            "placebo": placebo.tolist(), "paired_diff": diff.tolist(), "kappa": float(k), "kappa_se": float(k_se),
            "s": pooled_sd / math.sqrt(updates), "pooled_sd": pooled_sd,
            "placebo_mean": float(placebo.mean()), "planted_corr": mean_corr(runs, "planted")}


def mean_corr(runs: list[dict], arm: str) -> list[float] | None:
    """Per layer, the mean over runs of the per-step correlation of the advantage with the layer's share."""
    rows = [r["adv_share_corr"]["mean"] for r in runs if r["arm"] == arm and r.get("adv_share_corr")]
    return np.mean(rows, 0).tolist() if rows else None


def b_horizon(k: dict, c: float = DESIGNS["B"].c, seeds: int = 10) -> dict:
    """B's horizon: the updates at which the real arm's two-sided test against 0 (10 seeds, alpha 0.05) has 80%
    power if its correlation is `c` (the offline bound), at kappa's estimate and at kappa +- 1 SE."""
    need = ncp_for(POWER, seeds - 1, ALPHA, 2)

    def n_at(kap: float) -> float | None:
        return None if kap <= 0 else (need * k["s"] / (math.sqrt(seeds) * kap * c)) ** 2

    point, low, high = n_at(k["kappa"]), n_at(k["kappa"] + k["kappa_se"]), n_at(k["kappa"] - k["kappa_se"])
    chosen = None if point is None else int(min(max(math.ceil(point / 10) * 10, B_BOUNDS[0]), B_BOUNDS[1]))
    power = {}
    if chosen is not None:
        ncp = math.sqrt(seeds) * k["kappa"] * c * math.sqrt(chosen) / k["s"]
        power = {"real_two_sided": t_power(ncp, seeds - 1, ALPHA, 2), "planted_one_sided": t_power(ncp, seeds - 1)}
    return {"ncp_needed": need, "n_point": point, "n_kappa_plus_se": low, "n_kappa_minus_se": high,
            "n_chosen": chosen, "power_at_chosen": power}


def a_power_from_kappa(k: dict, design: Design = DESIGNS["A"], k_masks: int = DESIGNS["kappa"].mask_samples) -> float:
    """A's power (paired one-sided t, 4 df) by the calibration's kappa, scaled from K = 8 to A's K = 1 by
    sqrt(K) (the Defender's K x B units are independent: per-update signal-to-noise grows as sqrt(K))."""
    n = design.updates
    drift_over_noise = k["kappa"] * design.c * math.sqrt(n) / k["s"] / math.sqrt(k_masks / design.mask_samples)
    d_pair = drift_over_noise / math.sqrt(2)  # the paired difference carries both arms' noise
    return t_power(d_pair * math.sqrt(len(design.arms["planted"])), len(design.arms["planted"]) - 1)
