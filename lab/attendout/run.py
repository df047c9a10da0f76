"""Does AttendOut's generator G learn anything? A placebo-controlled experiment on a real GLUE task.

    python -m lab.attendout --data-dir /work/shared/data/glue --out lab/attendout/results/placebo

For every seed, two fine-tuning runs of the full MiniLM with AttendOut's defaults: one with the real reward and one
with the placebo (`placebo=True`: the advantages handed to G replaced by Gaussian noise of the same spread). Same
seed, same data order, same G initialisation. Then:

1. Reward signal-to-noise (on the seed-0 real-reward model after training, over `--snr-batches` batch pairs, all
   fp32). Each candidate reward compares G's masks with vanilla attention dropout (Attacker minus Defender); its
   noise is the same quantity between two independent vanilla Defenders. Candidates: the full look-ahead loss
   difference after one virtual SGD step, with independent dropout draws and with common random numbers (CRN); the
   first-order look-ahead (eta * grad L(x_{t+1}) . g) per batch and per sample under CRN. `numerical` is the same
   reward recomputed in float64 (first `--fp64-batches` pairs): the rounding part of the fp32 reward.
2. Policy movement: each run's G, at its start and end, applied to the same reference input (the pre-trained model's
   hidden states on fixed dev batches); delta = pi_end - pi_start over all valid query-key pairs of every layer.
   Movement = RMS(delta); the distance of two runs = RMS(delta_a - delta_b); agreement = cosine(delta_a, delta_b).
   G has learned something only if real-vs-placebo distances exceed the seed-to-seed spread, or real runs agree
   with each other (cosine > 0) where placebo runs do not.
3. Per-layer drop rates (G's mean pi on the reference input), training reward statistics and dev accuracy.
4. The reward accumulated over k consecutive steps (`--accumulate`, see `accumulated.py`), on the
   same model as 1. `--only-snr` runs this part alone and adds it to an existing `<out>/results.json`.

Outputs: `<out>/report.md`, `<out>/results.json`, `<out>/policy.png` (written by `report.py`, which also re-renders
them from results.json and states the acceptance rule). Runs single-threaded (`--threads`).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import accumulated, report
from .common import (
    SOURCES,
    batches_of,
    draw_masks,
    first_order,
    load_data,
    measurement_batches,
    optimize,
    policy_on,
    reference_states,
    train_step,
)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--task", default="sst2")
    p.add_argument("--model", default="minilm")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--g-lr", type=float, default=None, help="override attendout.g_lr")
    p.add_argument("--reference-batches", type=int, default=4, help="dev batches G's policy is compared on")
    p.add_argument("--snr-batches", type=int, default=12)
    p.add_argument("--fp64-batches", type=int, default=3)
    p.add_argument("--accumulate", type=int, nargs="+", default=[4, 8],
                   help="k: also report the reward summed over k consecutive steps (g_accumulate)")
    p.add_argument("--accumulate-batches", type=int, default=64,
                   help="steps (batch pairs) of the accumulated-reward measurement; 0 skips it")
    p.add_argument("--only-snr", action="store_true",
                   help="train only the first seed's real-reward run (the model the SNR is measured on), measure "
                        "the accumulated reward and add it to <out>/results.json (the other parts are kept)")
    p.add_argument("--dev-samples", type=int, default=872)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="lab/attendout/results/placebo")
    args = p.parse_args(argv)
    if min(args.accumulate) < 1 or 0 < args.accumulate_batches < 2 * max(args.accumulate):
        p.error(f"--accumulate {args.accumulate}: every k must be >= 1, and --accumulate-batches (now "
                f"{args.accumulate_batches}) at least 2 * the largest k (or 0 to skip the measurement)")
    if args.only_snr and not (Path(args.out) / "results.json").is_file():
        p.error(f"--only-snr adds to {Path(args.out) / 'results.json'}, which does not exist: run without "
                "--only-snr first, or point --out at an earlier run's folder")
    return args


# ---------------------------------------------------------------------------------------------------------
# Data and models
# ---------------------------------------------------------------------------------------------------------

def build(args, spec, seed: int, placebo: bool):
    from suite.run.models import load_model
    from suite.run.settings import RunConfig, TrainSettings

    # the baseline the published runs used (the method's default then; today's is the Defender with one mask)
    hp = {"placebo": placebo, "baseline": "rloo", "mask_samples": 2} | ({"g_lr": args.g_lr} if args.g_lr else {})
    job = RunConfig(args.model, args.task, "attendout", hp, seed, TrainSettings(lr=args.lr))
    model, method, _ = load_model(job, spec)
    torch.manual_seed(seed)
    return model, method, optimize(model, method, args.lr, args.steps, int(args.warmup_ratio * args.steps))


# ---------------------------------------------------------------------------------------------------------
# Policy on a fixed reference input
# ---------------------------------------------------------------------------------------------------------

def initial_states(args, spec, dev, pad_id):
    """`reference_states` of the pre-trained model with its fresh head (seed 0): the same for every run."""
    return reference_states(build(args, spec, 0, False)[0], dev, pad_id, spec, args.batch_size, args.reference_batches)


# ---------------------------------------------------------------------------------------------------------
# Training runs
# ---------------------------------------------------------------------------------------------------------

def train_run(args, spec, train, dev, pad_id, states, seed: int, placebo: bool) -> dict:
    from suite.run.batching import length_grouped_batches

    model, method, ctx = build(args, spec, seed, placebo)
    start_policy = policy_on(method.generator, method.cfg.p_max, states)
    order = length_grouped_batches(train.lengths(), args.batch_size, torch.Generator().manual_seed(seed))
    order = order[:args.steps + 1]
    batches = list(batches_of(train, order, pad_id, spec))
    log, start, seen = [], time.perf_counter(), method.last_reward
    for step in range(args.steps):
        loss = train_step(ctx, batches, step)
        r = method.last_reward  # a new dict at each reward step: one seen before means this step had none
        if r is not seen and r.get("rewards") is not None and step > 0 and len(log) < step:
            log.append(step_facts(r, float(loss)))
        seen = r
    train_s = time.perf_counter() - start
    end_policy = policy_on(method.generator, method.cfg.p_max, states)
    return {"seed": seed, "placebo": placebo, "train_s": train_s, "log": log,
            "start": start_policy, "end": end_policy, "dev_accuracy": dev_accuracy(args, model, spec, dev, pad_id),
            "cost": method.cost.summary(), "model": model, "method": method, "ctx": ctx, "batches": batches}


def step_facts(r: dict, loss: float) -> dict:
    rewards, adv, share = r["rewards"], r["advantages"], r["drop_share"]
    dev_share = (share - share.mean(0, keepdim=True)).flatten()
    corr = float(np.corrcoef(adv.flatten().numpy(), dev_share.numpy())[0, 1]) if adv is not None else math.nan
    return {"loss": loss, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "between_masks_std": float((rewards[0] - rewards[1]).std()) if len(rewards) > 1 else math.nan,
            "adv_vs_drop_corr": corr}


@torch.no_grad()
def dev_accuracy(args, model, spec, dev, pad_id) -> float:
    from suite.run.batching import sorted_batches

    model.eval()
    correct = total = 0
    order = sorted_batches(dev.lengths(), 64)
    for batch in batches_of(dev, order, pad_id, spec):
        pred = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.argmax(-1)
        correct += int((pred == batch["labels"]).sum())
        total += len(pred)
        if total >= args.dev_samples:
            break
    model.train()
    return correct / total


# ---------------------------------------------------------------------------------------------------------
# Reward signal-to-noise
# ---------------------------------------------------------------------------------------------------------

def lookahead_loss(method, model, batch, nxt, eta, masks=None, state=None, mode="attacker") -> float:
    """Next-batch loss (eval mode) after one virtual SGD step of size eta under replayed masks or fresh draws."""
    from suite.methods.attendout import reward as rw

    params = rw.trainable(model)
    with method.forward_mode("replay" if masks is not None else mode, state, masks=masks):
        loss = rw.losses_at(model, None, batch).mean()
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    moved = {n: p.detach() - eta * g if g is not None else p.detach() for (n, p), g in zip(params.items(), grads)}
    model.eval()
    with torch.no_grad():
        value = rw.losses_at(model, moved, nxt).mean()
    model.train()
    return float(value)


def reward_pair(method, model, batch, nxt, eta, fd_decrease, fp64: bool) -> dict[str, float | list]:
    """Signal (Attacker - Defender) and noise (Defender - Defender) of every candidate on one batch pair."""
    from suite.methods.attendout import reward as rw

    state = rw.RandomState(torch.device("cpu"))
    masks, _ = draw_masks(method, model, batch, state)
    fo = first_order(method, model, batch, nxt, masks, state, eta, fd_decrease)
    crn = {k: lookahead_loss(method, model, batch, nxt, eta, masks[k], state) for k in ("G1", "D1", "D2")}
    fresh = {k: lookahead_loss(method, model, batch, nxt, eta, mode=SOURCES[k]) for k in ("G1", "D1", "D2")}
    out = {"lookahead_independent": (fresh["D1"] - fresh["G1"], fresh["D1"] - fresh["D2"]),
           "lookahead_crn": (crn["D1"] - crn["G1"], crn["D1"] - crn["D2"]),
           "first_order_batch": (float(fo["G1"].mean() - fo["D1"].mean()), float(fo["D2"].mean() - fo["D1"].mean())),
           "first_order_sample": ((fo["G1"] - fo["D1"]).tolist(), (fo["D2"] - fo["D1"]).tolist()),
           "first_order_rloo": ((fo["G1"] - fo["G2"]).tolist(), (fo["D2"] - fo["D1"]).tolist())}
    if fp64:  # the same masks and draws in float64: what of the fp32 reward is rounding
        model.double()
        try:
            fo64 = first_order(method, model, batch, nxt, {k: masks[k] for k in ("G1", "D1")}, state, eta,
                               fd_decrease)
            la64 = {k: lookahead_loss(method, model, batch, nxt, eta, masks[k], state) for k in ("G1", "D1")}
        finally:
            model.float()
        out["numerical"] = {"lookahead_crn": (crn["D1"] - crn["G1"]) - (la64["D1"] - la64["G1"]),
                            "first_order_sample": (fo["G1"] - fo["D1"] - (fo64["G1"] - fo64["D1"]).float()).tolist()}
    return out


def snr_summary(pairs: list[dict]) -> dict:
    """Per candidate: std of the signal, std of the noise, their ratio, and the rounding error's RMS."""
    out = {}
    for name in pairs[0]:
        if name == "numerical":
            continue
        signal = np.concatenate([np.atleast_1d(p[name][0]) for p in pairs])
        noise = np.concatenate([np.atleast_1d(p[name][1]) for p in pairs])
        out[name] = {"signal_std": float(signal.std()), "noise_std": float(noise.std()),
                     "snr": float(signal.std() / noise.std()) if noise.std() > 0 else math.inf,
                     "signal_mean": float(signal.mean()), "n": int(signal.size)}
    numerical = [p["numerical"] for p in pairs if "numerical" in p]
    for name in ("lookahead_crn", "first_order_sample"):
        if numerical:
            err = np.concatenate([np.atleast_1d(n[name]) for n in numerical])
            out[name]["rounding_rms"] = float(np.sqrt((err ** 2).mean()))
    return out


def reward_snr(args, spec, train, pad_id, run) -> dict:
    model, method = run["model"], run["method"]
    batches = measurement_batches(model, train, args.batch_size, args.snr_batches + 1, pad_id, spec, seed=10_000)
    pairs = [reward_pair(method, model, batches[i], batches[i + 1], args.lr, method.cfg.fd_decrease,
                         fp64=i < args.fp64_batches) for i in range(args.snr_batches)]
    return snr_summary(pairs)


# ---------------------------------------------------------------------------------------------------------
# Analysis and output
# ---------------------------------------------------------------------------------------------------------

def delta(run) -> np.ndarray:
    return np.concatenate(run["end"]) - np.concatenate(run["start"])


def rms(x: np.ndarray) -> float:
    return float(np.sqrt((x ** 2).mean()))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) if np.linalg.norm(a) * np.linalg.norm(b) else 0.0


def compare_policies(runs: list[dict]) -> dict:
    real = {r["seed"]: delta(r) for r in runs if not r["placebo"]}
    placebo = {r["seed"]: delta(r) for r in runs if r["placebo"]}

    def pairs(group):
        return [(rms(group[a] - group[b]), cosine(group[a], group[b])) for a, b in itertools.combinations(group, 2)]

    matched = [(rms(real[s] - placebo[s]), cosine(real[s], placebo[s])) for s in real if s in placebo]
    out = {"movement_real": [rms(d) for d in real.values()], "movement_placebo": [rms(d) for d in placebo.values()]}
    for name, values in (("real_vs_placebo_same_seed", matched), ("real_seed_to_seed", pairs(real)),
                         ("placebo_seed_to_seed", pairs(placebo))):
        out[name] = {"distance": [v[0] for v in values], "cosine": [v[1] for v in values]}
    return out


def run_summary(run: dict) -> dict:
    log = run["log"]
    tail = log[-50:]
    return {"seed": run["seed"], "placebo": run["placebo"], "train_s": run["train_s"],
            "dev_accuracy": run["dev_accuracy"], "cost": run["cost"],
            "drop_rate_per_layer_start": [float(v.mean()) for v in run["start"]],
            "drop_rate_per_layer_end": [float(v.mean()) for v in run["end"]],
            "reward_std": statistics.fmean(s["reward_std"] for s in log),
            "between_masks_std": statistics.fmean(s["between_masks_std"] for s in log),
            "adv_vs_drop_corr_mean": statistics.fmean(s["adv_vs_drop_corr"] for s in log),
            "adv_vs_drop_corr_last50": statistics.fmean(s["adv_vs_drop_corr"] for s in tail),
            "reward_steps": len(log), "train_loss_last50": statistics.fmean(s["loss"] for s in tail)}


def run_meta(args, argv, began: float) -> dict:
    import os

    from suite.run.device import machine

    return {"task": args.task, "model": args.model, "machine": f"{machine(torch.device('cpu'))}, {os.cpu_count()} "
            f"cores", "load": " ".join(f"{v:.1f}" for v in os.getloadavg()),
            "command": "python -m lab.attendout "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.perf_counter() - began,
            "python": platform.python_version(), "torch": torch.__version__, "args": vars(args)}


def only_accumulated(args, argv, began: float) -> Path:
    """Train the first seed's real-reward run, measure the accumulated reward, add it to the existing results."""
    out = Path(args.out)
    results = json.loads((out / "results.json").read_text())
    spec, tokenizer, train, dev = load_data(args)
    pad_id = tokenizer.pad_token_id or 0
    states = initial_states(args, spec, dev, pad_id)
    run = train_run(args, spec, train, dev, pad_id, states, args.seeds[0], False)
    print(f"seed {args.seeds[0]} real: {run['train_s']:.0f}s, dev acc {run['dev_accuracy']:.3f}", file=sys.stderr)
    measured = accumulated.accumulated_snr(args, spec, train, pad_id, run)
    results["reward_snr_accumulated"] = measured | {"meta": run_meta(args, argv, began), "model_run": run_summary(run)}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    report.write(out, results)
    return out / "report.md"


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    import suite  # noqa: F401  registers the methods
    from suite.run.models import quiet_transformers

    began = time.perf_counter()
    if args.only_snr:
        with quiet_transformers():
            print(only_accumulated(args, argv, began))
        return 0
    with quiet_transformers():
        spec, tokenizer, train, dev = load_data(args)
        pad_id = tokenizer.pad_token_id or 0
        states = initial_states(args, spec, dev, pad_id)
        runs = []
        for seed in args.seeds:
            for placebo in (False, True):
                run = train_run(args, spec, train, dev, pad_id, states, seed, placebo)
                print(f"seed {seed} {'placebo' if placebo else 'real'}: {run['train_s']:.0f}s, dev acc "
                      f"{run['dev_accuracy']:.3f}", file=sys.stderr, flush=True)
                if seed != args.seeds[0] or placebo:
                    run.pop("model"), run.pop("method"), run.pop("ctx")
                runs.append(run)
                run.pop("batches")
        snr = reward_snr(args, spec, train, pad_id, runs[0])
        acc = accumulated.accumulated_snr(args, spec, train, pad_id, runs[0]) if args.accumulate_batches else None
    summaries = [run_summary(r) for r in runs]
    policy = compare_policies(runs)
    meta = run_meta(args, argv, began)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"meta": meta, "reward_snr": snr, "policy": policy | {"verdict": report.verdict(policy)},
               "runs": summaries}
    if acc is not None:
        results["reward_snr_accumulated"] = acc | {"meta": meta}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    report.write(out, results)
    print(out / "report.md")
    return 0

