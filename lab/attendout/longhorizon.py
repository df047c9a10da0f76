"""AttendOut's generator over thousands of updates: real reward vs placebo vs a planted reward, per g_lr and seed.

    python -m lab.attendout longhorizon --data-dir /work/shared/data/glue \
        --out lab/attendout/results/longhorizon

Per (arm, g_lr, seed) one fine-tuning run of a reduced model (MiniLM's first `--layers` layers, pre-trained weights,
a fresh head) on `--task` with AttendOut's defaults but `g_lr`, for `--updates` G updates (one per step; the warm-up's
first step has learning rate 0 and no reward, so the run takes one step more). Arms: `real` (AttendOut's reward),
`placebo` (`placebo=True`: advantages replaced by noise of the same spread) and `planted` (the positive control,
`planted.py`: the reward replaced by one that pays for dropping more pairs of layer `--planted-layer`, at
signal-to-noise `--strength`). Same seed: same data order, same G initialisation, same head.

Every `--probe-every` steps G's mean drop probability per layer is read on a fixed reference input (the initial
model's hidden states on fixed dev batches, identical for every run) and on the training batches of that window.
Per reward step the correlation of the leave-one-out reward difference of the two masks with their difference in
each layer's drop share is accumulated: how much of what G is told is about each layer's drop rate.
Results go to `<out>/runs[-PART].jsonl` as each run ends (a stop keeps them); `longhorizon_report` analyses them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from suite.methods.attendout import PolicyUpdate

from .common import batches_of, load_data, make_method, optimize, policy_on, reference_states, train_step
from .planted import AddedReward, PlantedReward, baseline_advantage, centred_shares, layer_drop_share

ARMS = ("real", "placebo", "planted")
INIT_SEED = 1234  # the random-init encoder is the same in every run (only the head and G vary by seed)
DELTA_PAIRS = 2048  # pairs of the reference input on which policy changes are compared


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m lab.attendout longhorizon",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--task", default="sst2")
    p.add_argument("--model", default="minilm")
    p.add_argument("--layers", type=int, default=2, help="keep the model's first N layers")
    p.add_argument("--hidden", type=int, default=0,
                   help="if > 0: a random-init BERT of this width (MiniLM's vocabulary and tokenizer) instead of the "
                        "pre-trained weights; heads = hidden // 32, FFN 2 x hidden")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--g-lrs", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--updates", type=int, default=2000, help="G updates per run")
    p.add_argument("--strength", type=float, default=0.3,
                   help="planted arm: signal-to-noise per reward (--planted-form replace) or the correlation c added "
                        "to the advantage's with the layer's share (--planted-form added)")
    p.add_argument("--planted-form", choices=("replace", "added"), default="replace",
                   help="replace: the reward replaced by a planted one (needs rloo or ema); added: a planted term on "
                        "top of the real reward (any baseline)")
    p.add_argument("--baseline", default="rloo", help="AttendOut's baseline in every arm (the published runs': rloo)")
    p.add_argument("--mask-samples", type=int, default=2, help="K masks of G per update")
    p.add_argument("--planted-layer", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup-ratio", type=float, default=0.06)
    p.add_argument("--probe-every", type=int, default=100)
    p.add_argument("--reference-batches", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--freeze-embeddings", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the word embeddings fixed (most of the reduced model's weights)")
    p.add_argument("--out", default="lab/attendout/results/longhorizon")
    p.add_argument("--part", default="",
                   help="name of this process's share when several run side by side into one --out (its own "
                        "runs-PART.jsonl and meta-PART.json; the report reads them all)")
    args = p.parse_args(argv)
    if args.updates < 1 or args.probe_every < 1 or args.layers < 1:
        p.error("--updates, --probe-every and --layers must be >= 1")
    return args


def build(args, spec, seed: int, arm: str, g_lr: float):
    """(model, method, step context) of one run: MiniLM cut to `--layers` layers with AttendOut attached."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from suite.run.models import quiet_transformers
    from suite.run.settings import resolve_model

    path = resolve_model(args.model)
    with quiet_transformers():
        config = AutoConfig.from_pretrained(path, num_labels=spec.num_labels, num_hidden_layers=args.layers)
        if args.hidden:  # a small random-init encoder of MiniLM's vocabulary: the same initial weights in every run
            config.update({"hidden_size": args.hidden, "num_attention_heads": max(1, args.hidden // 32),
                           "intermediate_size": 2 * args.hidden})
            torch.manual_seed(INIT_SEED)
            model = AutoModelForSequenceClassification.from_config(config)
            torch.manual_seed(seed)  # the head's initialisation, per seed
            model.classifier.reset_parameters()
        else:
            torch.manual_seed(seed)  # the head's initialisation
            model = AutoModelForSequenceClassification.from_pretrained(path, config=config)
    if args.freeze_embeddings:  # the 30k-row word embedding is most of the weights: the reward's cost, not its point
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    # by default the baseline the published runs used (the method's default then; today's is the Defender, K = 1)
    hp = {"g_lr": g_lr, "placebo": arm == "placebo", "cost_every": 0, "baseline": args.baseline,
          "mask_samples": args.mask_samples}
    method = make_method(args.model, args.task, hp, seed, args.lr)
    torch.manual_seed(seed)  # G's initialisation: the same in every arm of a seed
    method.attach(model)
    steps = args.updates + 1
    ctx = optimize(model, method, args.lr, steps, max(1, int(args.warmup_ratio * steps)),
                   [q for q in model.parameters() if q.requires_grad])
    return model, method, ctx


def initial_states(args, spec, dev, pad_id) -> list:
    """`reference_states` of the initial (pre-trained, cut) model: the same for every run of `args`."""
    return reference_states(build(args, spec, 0, "real", 1e-3)[0], dev, pad_id, spec, args.batch_size,
                            args.reference_batches)


class ShareLog:
    """Per reward step, how much of what G is told is about each layer's drop rate. With `rloo` and K = 2 (the
    published runs' form): the two masks' reward difference against their drop-share difference, pooled over steps
    (`correlations`). In every form: the correlation over the step's K x B units of the advantage with the
    baseline-centred share (`per_step`, the offline measurement's statistic), averaged over steps. A reward hook of
    the method's that only looks: it sees what the hooks added before it hand on (a planted reward's)."""

    def __init__(self, method, layers: int):
        self.d_reward, self.d_share = [], [[] for _ in range(layers)]
        self.steps: list[list[float]] = []
        self.layers, self.method = layers, method
        method.reward_hooks.append(self)

    def __call__(self, update: PolicyUpdate) -> None:
        rewards, defender, samples = update.rewards, update.defender, update.samples
        baseline = self.method.cfg.baseline
        adv = baseline_advantage(rewards, defender, baseline).cpu().numpy().ravel()
        self.steps.append([float(np.corrcoef(adv, centred_shares(samples, layer, baseline).cpu().numpy().ravel())[0, 1])
                           for layer in range(self.layers)])
        if baseline == "rloo" and rewards.shape[0] == 2:
            self.d_reward.append((rewards[0] - rewards[1]).double().cpu().numpy())
            for layer in range(self.layers):
                self.d_share[layer].append((layer_drop_share(samples[0], layer)
                                            - layer_drop_share(samples[1], layer)).double().cpu().numpy())

    def correlations(self) -> list[float] | None:
        if not self.d_reward:
            return None
        r = np.concatenate(self.d_reward)
        return [float(np.corrcoef(r, np.concatenate(s))[0, 1]) for s in self.d_share]

    def per_step(self) -> dict:
        """Per layer: the mean over reward steps of the per-step correlation and its standard error (NaN steps, a
        constant share or advantage, left out)."""
        x = np.array(self.steps, dtype=float).reshape(-1, self.layers)
        n = (~np.isnan(x)).sum(0)
        return {"mean": np.nanmean(x, 0).tolist() if x.size else None,
                "se": (np.nanstd(x, 0, ddof=1) / np.sqrt(n)).tolist() if x.shape[0] > 1 else None,
                "steps": n.tolist()}


def training_batches(args, spec, train, pad_id, seed: int, n: int) -> list[dict]:
    """The first `n` training batches of a run of `seed`: as many epochs as needed, the first epoch's order the
    published runs' one."""
    from suite.run.batching import length_grouped_batches

    order, epoch = [], 0
    while len(order) < n:
        order += length_grouped_batches(train.lengths(), args.batch_size,
                                        torch.Generator().manual_seed(seed + 1000 * epoch))
        epoch += 1
    return list(batches_of(train, order[:n], pad_id, spec))


def train_run(args, spec, train, pad_id, states, arm: str, g_lr: float, seed: int) -> dict:
    model, method, ctx = build(args, spec, seed, arm, g_lr)
    # hooks run in the order added: the planted reward first, then the log, which sees what G is handed
    planted = None
    if arm == "planted":
        planted = (AddedReward(method, args.strength, args.planted_layer) if args.planted_form == "added" else
                   PlantedReward(method, args.strength, args.planted_layer, seed=seed + 1000))
    shares = ShareLog(method, args.layers)
    steps = args.updates + 1
    batches = training_batches(args, spec, train, pad_id, seed, steps + 1)
    probes = [{"step": 0, "reference": [float(v.mean()) for v in policy_on(method.generator, method.cfg.p_max, states)],
               "training": None}]
    start_policy = policy_on(method.generator, method.cfg.p_max, states)
    sums = method.layer_sums
    losses, began = [], time.perf_counter()
    for step in range(steps):
        losses.append(float(train_step(ctx, batches, step)))
        if (step + 1) % args.probe_every == 0 or step + 1 == steps:
            now = method.layer_sums  # G's mean drop probability on this window's training batches
            window = ((now.pi - sums.pi) / (now.pairs - sums.pairs).clamp_min(1)).tolist()
            sums = now
            probes.append({"step": step + 1, "training": window, "reference": [
                float(v.mean()) for v in policy_on(method.generator, method.cfg.p_max, states)]})
            if getattr(args, "verbose", False):  # the per-step time under the machine's current load
                print(f"  {arm} seed {seed}: step {step + 1}/{steps}, {(time.perf_counter() - began) / (step + 1):.2f}"
                      f" s per step, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    end_policy = policy_on(method.generator, method.cfg.p_max, states)
    delta = np.concatenate(end_policy) - np.concatenate(start_policy)
    # the reference input is the same in every run: a fixed subsample of its pairs keeps results.json small
    keep = np.sort(np.random.default_rng(0).choice(delta.size, min(DELTA_PAIRS, delta.size), replace=False))
    return {"arm": arm, "g_lr": g_lr, "seed": seed, "strength": args.strength if planted else 0.0,
            "g_updates": method.policy.updates, "steps": steps, "train_s": time.perf_counter() - began,
            "probes": probes, "share_reward_corr": shares.correlations(), "adv_share_corr": shares.per_step(),
            "baseline": method.cfg.baseline, "mask_samples": method.cfg.mask_samples,
            "planted_form": args.planted_form if planted else None,
            "loss_first100": float(np.mean(losses[:100])), "loss_last100": float(np.mean(losses[-100:])),
            "delta": [round(float(x), 7) for x in delta[keep]], "cost": method.cost.summary()}


def meta(args, argv) -> dict:
    from suite.run.device import machine

    return {"command": "python -m lab.attendout longhorizon " + " ".join(argv),
            "machine": f"{machine(torch.device('cpu'))}, {os.cpu_count()} cores, torch {torch.__version__}",
            "load_at_start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
            "args": vars(args)}


def main(argv: list[str]) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    import suite  # noqa: F401  registers the methods
    from suite.run.models import quiet_transformers

    from . import longhorizon_report

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    part = f"-{args.part}" if args.part else ""
    (out / f"meta{part}.json").write_text(json.dumps(meta(args, argv), indent=1) + "\n")
    runs_path = out / f"runs{part}.jsonl"
    done = {(r["arm"], r["g_lr"], r["seed"]) for r in longhorizon_report.read_runs(runs_path)}
    began = time.perf_counter()
    with quiet_transformers():
        spec, tokenizer, train, dev = load_data(args)
        pad_id = tokenizer.pad_token_id or 0
        states = initial_states(args, spec, dev, pad_id)
        for seed in args.seeds:  # seed-major: a stopped experiment has every (g_lr, arm) cell for its first seeds
            for g_lr in args.g_lrs:
                for arm in args.arms:
                    if (arm, g_lr, seed) in done:  # a restarted experiment keeps the runs it has
                        continue
                    run = train_run(args, spec, train, pad_id, states, arm, g_lr, seed)
                    with runs_path.open("a") as f:
                        f.write(json.dumps(run) + "\n")
                    print(f"{arm} g_lr={g_lr:g} seed={seed}: {run['g_updates']} G updates, {run['train_s']:.0f}s, "
                          f"reference drop rate {run['probes'][-1]['reference']}, load {os.getloadavg()[0]:.2f}, "
                          f"{(time.perf_counter() - began) / 60:.1f} min so far", file=sys.stderr, flush=True)
    print(longhorizon_report.write(out, time.perf_counter() - began))
    return 0
