"""How much AttendOut's reward says about each layer's drop rate, measured offline where dropout has work to do.

    python -m lab.attendout information --data-dir ../shared/data/glue \
        --out lab/attendout/results/decisive

Setting: the pre-trained MiniLM fine-tuned (vanilla: attention-probability dropout 0.1, the Defender's) on
`--train-samples` examples of `--task` for `--epochs` epochs, fp32, one torch thread. At a few checkpoints (`--at`,
in epochs; 0 is the pre-trained model with its fresh head) the train-subset and dev accuracy are read, and on
`--batches` pairs of consecutive training batches (x_t, x_{t+1}) the reward is computed exactly as AttendOut computes
it (`methods/attendout/reward.py`: v = grad L(x_{t+1}) in eval mode, the forward difference along v, every mask and
the Defender under the same hidden-dropout draws) for many masks per batch:

- `random`: per (mask, sample, layer) a drop rate drawn uniformly in [0, p_max], so each layer's drop share varies
  widely and independently of the other layers' (the design that estimates the reward's dependence on a share);
- `g_init`: every valid pair dropped with probability p_init (0.1), what G draws at its start: the share varies by
  its binomial spread only, as in the planted control's runs, so its correlation is the one comparable with the
  control's.

Per batch and per layer, two advantages against the layer's drop share (the per-sample REINFORCE signal of the
layer's rate): `defender` (the method's default: the mask's reward minus the Defender's on the same sample) and
`rloo` (masks paired, K = 2: reward difference against share difference, as `longhorizon.ShareLog` measured it).
Reported per (checkpoint, design, form, layer): the mean of the per-batch correlations, its standard error over
batches and n; the per-batch least-squares slope of the advantage on the six shares (`random` design); and the
correlation that slope implies at G's initial spread. `--time-steps` training steps of AttendOut itself (both forms)
are timed on the same model. `horizon` turns a correlation into G updates by the planted control's 1/c^2 scaling.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .common import pair_validity

# the planted control of lab/attendout/results/longhorizon (reassessment.md): correlation 0.0432 at g_lr 1e-3, out of
# the placebo band by its first probe, update 100 (probes every 100 updates, so 100 is an upper bound on that time)
PLANTED_C = 0.0432
PLANTED_UPDATES = 100
DESIGNS = ("random", "g_init")
FORMS = ("defender", "rloo")


# -- estimators (numpy; tested on synthetic data) ---------------------------------------------------------------
def correlations(adv: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """(L,): Pearson correlation of the advantages (N,) with each column of the shares (N, L); 0 where either is
    constant."""
    a = adv - adv.mean()
    s = shares - shares.mean(0)
    # a column (or advantage) constant up to rounding counts as constant
    varies = (s.std(0) > 1e-12 * np.maximum(1, np.abs(shares).max(0))) & (a.std() > 1e-12 * max(1, np.abs(adv).max()))
    denom = np.sqrt((a * a).sum() * (s * s).sum(0))
    return np.divide(a @ s, denom, out=np.zeros(s.shape[1]), where=varies & (denom > 0))


def slopes(adv: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """(L,): least-squares coefficients of the advantages on all L shares together (with an intercept)."""
    x = np.column_stack([np.ones(len(adv)), shares])
    return np.linalg.lstsq(x, adv, rcond=None)[0][1:]


def over_batches(values: np.ndarray) -> dict:
    """Per column of (n_batches, L): the mean, its standard error over batches, and n."""
    values = np.asarray(values, dtype=float)
    n = values.shape[0]
    se = values.std(0, ddof=1) / math.sqrt(n) if n > 1 else np.full(values.shape[1], np.nan)
    return {"mean": values.mean(0).tolist(), "se": se.tolist(), "n": n}


def bound(mean: float, se: float, z: float = 2.0) -> float:
    """|c| at most this (mean's magnitude plus z standard errors)."""
    return abs(mean) + z * se


def horizon(c: float, c_ref: float = PLANTED_C, updates_ref: float = PLANTED_UPDATES) -> float:
    """G updates a signal of correlation c needs, by the planted control's 1/c^2 scaling (inf for c = 0)."""
    return math.inf if c == 0 else updates_ref * (c_ref / c) ** 2


# -- masks ---------------------------------------------------------------------------------------------------------
def draw_masks(valid: torch.Tensor, rates: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(K, B, T, T) bool: each valid pair of mask k, sample i dropped with probability rates[k, i]."""
    u = torch.rand((rates.shape[0], *valid.shape), generator=generator)
    return (u < rates[:, :, None, None]) & valid


def shares_of(masks: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(K, B): the share of each sample's valid pairs a mask drops."""
    return masks.sum((-1, -2)).double() / valid.sum((-1, -2)).double().clamp_min(1)


# -- the measurement -----------------------------------------------------------------------------------------------
def reward_batch(method, model, batch, nxt, masks: list[torch.Tensor], eta: float, fd_decrease: float):
    """Per-sample rewards (K, B) of K masks (each a per-layer list of (B, T, T) drops, given as one (L, K, B, T, T)
    tensor) and the Defender's (B,), as `AttendOut._reward_and_update` computes them, under one hidden-dropout state."""
    from suite.methods.attendout import reward as rw

    k = masks.shape[1]
    model.train()
    state = rw.RandomState(torch.device("cpu"))
    direction = rw.next_batch_gradient(model, nxt)
    eps = rw.probe_size(fd_decrease, rw.squared_norm(direction))
    moved = rw.shifted(model, direction, eps, inplace=True)
    drops = {layer: ("drop", masks[layer].flatten(0, 1)) for layer in range(masks.shape[0])}
    many = rw.repeated(batch, k)
    with torch.no_grad(), method.forward_mode("replay", state, copies=k, masks=drops):
        base = rw.losses_at(model, None, many)
    replay = method.forward_mode("replay", state, copies=k, masks=drops)
    rewards = rw.alignment_rewards(model, many, base, moved, eps, eta, replay)
    with torch.no_grad(), method.forward_mode("defender", state, copies=1):  # the Defender's masks: replayed next
        base = rw.losses_at(model, None, batch)
    replay = method.forward_mode("replay", state, copies=1)
    defender = rw.alignment_rewards(model, batch, base, moved, eps, eta, replay)
    return rewards.view(k, -1).double(), defender.double()


def batch_statistics(rewards: torch.Tensor, defender: torch.Tensor, shares: torch.Tensor, design: dict) -> dict:
    """Per design and form, the per-layer correlations of the advantage with the layer's drop share (and, for the
    random design, the slopes). rewards (K, B), defender (B,), shares (L, K, B); `design` maps a name to mask rows."""
    out = {}
    for name, rows in design.items():
        r, s = rewards[rows].numpy(), shares[:, rows].numpy()  # (k, B), (L, k, B)
        layers = s.shape[0]
        adv_d = (r - defender.numpy()[None]).ravel()
        share_d = s.reshape(layers, -1).T
        half = len(rows) // 2
        adv_r = (r[0:2 * half:2] - r[1:2 * half:2]).ravel()
        share_r = (s[:, 0:2 * half:2] - s[:, 1:2 * half:2]).reshape(layers, -1).T
        out[name] = {"defender": correlations(adv_d, share_d), "rloo": correlations(adv_r, share_r),
                     "slope_defender": slopes(adv_d, share_d), "slope_rloo": slopes(adv_r, share_r),
                     "sd_adv_defender": adv_d.std(), "sd_adv_rloo": adv_r.std(),
                     "sd_share_defender": share_d.std(0), "sd_share_rloo": share_r.std(0)}
    return out


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m lab.attendout information",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--task", default="mrpc")
    p.add_argument("--model", default="minilm")
    p.add_argument("--train-samples", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--at", type=float, nargs="+", default=[0, 2, 5], help="checkpoints, in epochs")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup-ratio", type=float, default=0.06)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batches", type=int, default=24, help="batch pairs per checkpoint")
    p.add_argument("--masks", type=int, default=8, help="masks per design per batch (even: rloo pairs them)")
    p.add_argument("--p-max", type=float, default=0.3)
    p.add_argument("--p-init", type=float, default=0.1)
    p.add_argument("--fd-decrease", type=float, default=1e-2)
    p.add_argument("--time-steps", type=int, default=8, help="AttendOut training steps timed per form (0: none)")
    p.add_argument("--eval-samples", type=int, default=408, help="dev examples (and train-subset examples) scored")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="lab/attendout/results/decisive")
    return p.parse_args(argv)


def build(args, spec, hp: dict, seed: int):
    """The pre-trained model with a fresh head (seeded) and AttendOut (`hp`, no cost probe) attached."""
    from transformers import AutoModelForSequenceClassification

    from suite.run.models import quiet_transformers
    from suite.run.settings import resolve_model

    from .common import make_method

    with quiet_transformers():
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_pretrained(resolve_model(args.model),
                                                                   num_labels=spec.num_labels)
    method = make_method(args.model, args.task, {"cost_every": 0, **hp}, seed, args.lr)
    method.attach(model)
    return model, method


@torch.no_grad()
def accuracy(model, enc, pad_id, spec, limit: int) -> float:
    from suite.run.batching import sorted_batches

    from .common import batches_of

    model.eval()
    idx = list(range(min(limit, len(enc))))
    right = 0
    for batch in batches_of(enc.subset(idx), sorted_batches(enc.subset(idx).lengths(), 64), pad_id, spec):
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        right += int((logits.argmax(-1) == batch["labels"]).sum())
    model.train()
    return right / len(idx)


def measure(args, method, model, pairs, eta, gen) -> dict:
    """Per-batch statistics over the batch pairs at the current weights."""
    layers = model.config.num_hidden_layers
    k = args.masks
    per_batch, began = [], time.perf_counter()
    for batch, nxt in pairs:
        valid = pair_validity(batch["attention_mask"])
        b = valid.shape[0]
        rates = torch.cat([args.p_max * torch.rand((layers, k, b), generator=gen),
                           torch.full((layers, k, b), args.p_init)], 1)  # (L, 2k, B)
        masks = torch.stack([draw_masks(valid, rates[layer], gen) for layer in range(layers)])
        shares = torch.stack([shares_of(masks[layer], valid) for layer in range(layers)])
        rewards, defender = reward_batch(method, model, batch, nxt, masks, eta, args.fd_decrease)
        per_batch.append(batch_statistics(rewards, defender, shares,
                                          {"random": list(range(k)), "g_init": list(range(k, 2 * k))}))
    out = {"seconds": time.perf_counter() - began}
    for design in DESIGNS:
        out[design] = {key: over_batches(np.stack([pb[design][key] for pb in per_batch]))
                       if np.ndim(per_batch[0][design][key]) else
                       over_batches(np.array([[pb[design][key]] for pb in per_batch]))
                       for key in per_batch[0][design]}
    # the correlation G sees at its start implied by the random design's slope (a linear reward in the share):
    # slope x the share's spread under G's initial masks / the advantage's spread there
    for form in FORMS:
        slope = np.array(out["random"][f"slope_{form}"]["mean"])
        spread = np.array(out["g_init"][f"sd_share_{form}"]["mean"])
        out["g_init"][f"implied_{form}"] = (slope * spread / out["g_init"][f"sd_adv_{form}"]["mean"][0]).tolist()
    return out


def time_steps(args, spec, train, pad_id, order) -> dict:
    """Seconds per AttendOut training step on MiniLM (steps after the first two), per form, fp32."""
    from .common import batches_of, optimize, train_step

    out = {}
    n = args.time_steps + 3
    batches = list(batches_of(train, (order * (n // len(order) + 1))[:n], pad_id, spec))
    for form, hp in (("defender", {"baseline": "defender", "mask_samples": 1}),
                     ("rloo", {"baseline": "rloo", "mask_samples": 2})):
        model, method = build(args, spec, hp, args.seed)
        ctx = optimize(model, method, args.lr, 1000, 0)
        times = []
        for step in range(args.time_steps + 2):
            began = time.perf_counter()
            train_step(ctx, batches, step)
            times.append(time.perf_counter() - began)
        kept = times[2:]
        out[form] = {"per_step_s": float(np.mean(kept)), "se_s": float(np.std(kept, ddof=1) / math.sqrt(len(kept))),
                     "steps": len(kept), "tokens_per_batch": [int(b["attention_mask"].sum()) for b in batches[2:-1]]}
    return out


def main(argv: list[str]) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    import suite  # noqa: F401  registers the methods
    from suite.methods.attendout.reward import per_sample_loss
    from suite.run.batching import length_grouped_batches
    from suite.run.data import seeded_subset
    from suite.run.models import quiet_transformers

    from .common import batches_of, load_data, optimize

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with quiet_transformers():
        spec, tokenizer, train_all, dev = load_data(args)
    pad_id = tokenizer.pad_token_id or 0
    train = train_all.subset(seeded_subset(len(train_all), args.train_samples, args.seed))
    model, method = build(args, spec, {}, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    orders = [length_grouped_batches(train.lengths(), args.batch_size, torch.Generator().manual_seed(args.seed + e))
              for e in range(args.epochs)]
    steps_per_epoch = len(orders[0])
    total = steps_per_epoch * args.epochs
    ctx = optimize(model, method, args.lr, total, int(args.warmup_ratio * total))
    optimizer, scheduler = ctx.optimizer, ctx.scheduler  # the vanilla loop below steps them itself
    measure_order = length_grouped_batches(train.lengths(), args.batch_size, torch.Generator().manual_seed(10_000))
    pairs = list(batches_of(train, measure_order[:args.batches + 1], pad_id, spec))
    pairs = list(zip(pairs[:-1], pairs[1:]))
    checkpoints, losses, step = [], [], 0
    targets = sorted({round(a * steps_per_epoch) for a in args.at})
    model.train()
    for epoch in range(args.epochs + 1):
        for idx in (orders[epoch] if epoch < args.epochs else []) + [None]:
            if step in targets and not any(c["step"] == step for c in checkpoints):
                eta = scheduler.get_last_lr()[0] or args.lr
                entry = {"step": step, "epoch": step / steps_per_epoch, "eta": eta,
                         "train_acc": accuracy(model, train, pad_id, spec, args.eval_samples),
                         "dev_acc": accuracy(model, dev, pad_id, spec, args.eval_samples),
                         "train_loss_recent": float(np.mean(losses[-steps_per_epoch:])) if losses else None}
                torch.manual_seed(args.seed + step)
                entry["measurement"] = measure(args, method, model, pairs, eta, gen)
                checkpoints.append(entry)
                print(f"checkpoint step {step}: train {entry['train_acc']:.3f} dev {entry['dev_acc']:.3f}, "
                      f"{entry['measurement']['seconds']:.0f}s, {(time.perf_counter() - began) / 60:.1f} min",
                      file=sys.stderr, flush=True)
            if idx is None:
                break
            batch = next(batches_of(train, [idx], pad_id, spec))
            with method.forward_mode("defender"):  # vanilla: attention-probability dropout p_defender = 0.1
                loss = per_sample_loss(model, model(**{k: v for k, v in batch.items() if k != "labels"}).logits,
                                       batch["labels"]).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            step += 1
    timing = time_steps(args, spec, train, pad_id, orders[0]) if args.time_steps else None
    from suite.run.device import machine

    result = {"command": "python -m lab.attendout information " + " ".join(argv),
              "machine": f"{machine(torch.device('cpu'))}, {os.cpu_count()} cores, torch {torch.__version__}",
              "load_at_end": " ".join(f"{v:.2f}" for v in os.getloadavg()),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
              "args": vars(args), "steps_per_epoch": steps_per_epoch, "checkpoints": checkpoints,
              "step_timing": timing, "wall_s": time.perf_counter() - began,
              "planted": {"c": PLANTED_C, "updates": PLANTED_UPDATES}}
    (out / "information.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / 'information.json'} in {(time.perf_counter() - began) / 60:.1f} min", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# -- the report ----------------------------------------------------------------------------------------------------
def pooled(entries: list[dict], layer: int) -> tuple[float, float, int]:
    """A layer's mean over checkpoints (equal weights) and its standard error, from each checkpoint's mean and SE."""
    means = [e["mean"][layer] for e in entries]
    ses = [e["se"][layer] for e in entries]
    return float(np.mean(means)), float(math.sqrt(sum(s * s for s in ses)) / len(ses)), sum(e["n"] for e in entries)


def plan(result: dict, seeds: int = 5) -> dict:
    """Per form, the largest two-SE bound over layers of the correlation G sees at its start (implied by the random
    design's slope; and measured directly on G-at-init masks), its horizon, and the cost of the four arms."""
    checkpoints = result["checkpoints"]
    layers = len(checkpoints[0]["measurement"]["random"]["defender"]["mean"])
    out = {"forms": {}}
    for form in FORMS:
        direct = [pooled([c["measurement"]["g_init"][form] for c in checkpoints], layer) for layer in range(layers)]
        implied_per = [[c["measurement"]["g_init"][f"implied_{form}"][layer] for c in checkpoints]
                       for layer in range(layers)]
        # the implied correlation's SE: the slope's SE scaled as the slope is (spreads are measured far more tightly)
        implied = []
        for layer in range(layers):
            ratios = [c["measurement"]["g_init"][f"implied_{form}"][layer]
                      / c["measurement"]["random"][f"slope_{form}"]["mean"][layer]
                      if c["measurement"]["random"][f"slope_{form}"]["mean"][layer] else 0.0 for c in checkpoints]
            ses = [r * c["measurement"]["random"][f"slope_{form}"]["se"][layer] for r, c in zip(ratios, checkpoints)]
            implied.append((float(np.mean(implied_per[layer])),
                            float(math.sqrt(sum(s * s for s in ses)) / len(ses))))
        b_implied = max(bound(m, s) for m, s in implied)
        b_direct = max(bound(m, s) for m, s, _ in direct)
        out["forms"][form] = {"direct": direct, "implied": implied, "bound_implied": b_implied,
                              "bound_direct": b_direct, "updates_implied": horizon(b_implied),
                              "updates_direct": horizon(b_direct)}
    timing = result["step_timing"]
    weakest = min(out["forms"][f]["bound_implied"] for f in FORMS)
    updates = horizon(weakest)
    arms = {"planted (rloo, c at the bound)": "rloo", "placebo (defender)": "defender",
            "real, defender": "defender", "real, rloo": "rloo"}
    per_run = {arm: updates * timing[form]["per_step_s"] / 3600 for arm, form in arms.items()}
    out.update({"bound": weakest, "updates": updates, "seeds": seeds, "arms": arms, "hours_per_run": per_run,
                "cpu_hours": seeds * sum(per_run.values()), "runs": seeds * len(arms)})
    return out


def report(result: dict) -> list[str]:
    """Markdown tables of the measurement, the horizon and the cost."""
    p = plan(result)
    lines = ["### Checkpoints of the vanilla run (fp32, dev and train-subset accuracy on 408 examples each)", "",
             "| step | epoch | train-subset acc | dev acc | mean train loss, last epoch |",
             "|---:|---:|---:|---:|---:|"]
    for c in result["checkpoints"]:
        loss = "–" if c["train_loss_recent"] is None else f"{c['train_loss_recent']:.3f}"
        lines.append(f"| {c['step']} | {c['epoch']:g} | {c['train_acc']:.3f} | {c['dev_acc']:.3f} | {loss} |")
    for design in DESIGNS:
        for form in FORMS:
            lines += ["", f"### Correlation of the advantage with a layer's drop share: design `{design}`, form "
                      f"`{form}` (mean of per-batch correlations ± SE over batches)", "",
                      "| layer | " + " | ".join(f"step {c['step']}" for c in result["checkpoints"]) + " | pooled |",
                      "|---:|" + "---:|" * (len(result["checkpoints"]) + 1)]
            entries = [c["measurement"][design][form] for c in result["checkpoints"]]
            for layer in range(len(entries[0]["mean"])):
                cells = [f"{e['mean'][layer]:+.4f} ± {e['se'][layer]:.4f} (n {e['n']})" for e in entries]
                m, s, n = pooled(entries, layer)
                lines.append(f"| {layer} | " + " | ".join(cells) + f" | {m:+.4f} ± {s:.4f} (n {n}) |")
    lines += ["", "### The correlation G sees at its start (masks at p_init), per layer, pooled over checkpoints", "",
              "| form | layer | measured on G-at-init masks | implied by the random design's slope |",
              "|---|---:|---:|---:|"]
    for form in FORMS:
        f = p["forms"][form]
        for layer, ((dm, ds, _), (im, is_)) in enumerate(zip(f["direct"], f["implied"])):
            lines.append(f"| {form} | {layer} | {dm:+.4f} ± {ds:.4f} | {im:+.5f} ± {is_:.5f} |")
    lines += ["", "### Horizon (planted control: c = "
              f"{PLANTED_C} out of the placebo band by update {PLANTED_UPDATES}; updates = {PLANTED_UPDATES} x "
              f"({PLANTED_C} / c)^2)", "",
              "| form | largest 2-SE bound, implied | updates | largest 2-SE bound, direct | updates |",
              "|---|---:|---:|---:|---:|"]
    for form in FORMS:
        f = p["forms"][form]
        lines.append(f"| {form} | {f['bound_implied']:.5f} | {f['updates_implied']:,.0f} | {f['bound_direct']:.4f} "
                     f"| {f['updates_direct']:,.0f} |")
    t = result["step_timing"]
    lines += ["", "### Cost at the horizon of the weaker form "
              f"(c = {p['bound']:.5f}: {p['updates']:,.0f} G updates, one per training step)", "",
              "| arm | seconds per step (measured, fp32, 1 thread) | CPU-hours per run | runs |",
              "|---|---:|---:|---:|"]
    for arm, form in p["arms"].items():
        lines.append(f"| {arm} | {t[form]['per_step_s']:.2f} ± {t[form]['se_s']:.2f} | "
                     f"{p['hours_per_run'][arm]:,.1f} | {p['seeds']} |")
    lines.append(f"| **all** | | **{p['cpu_hours']:,.0f}** | {p['runs']} |")
    return lines


def report_main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path("lab/attendout/results/decisive/information.json")
    print("\n".join(report(json.loads(path.read_text()))))
    return 0
