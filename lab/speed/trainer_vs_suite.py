"""Vanilla fine-tuning of one model on one GLUE task by this suite (`suite.run.runner.run_one`) and by HF `Trainer`,
with the
same data subset, hyper-parameters and seed; prints wall-clock and dev metric for both as a markdown table.

    python lab/speed/trainer_vs_suite.py --task sst2 --data-dir ../shared/data/glue --max-train-samples 1000 \
        --epochs 2 --seeds 1,2 [--precisions fp32,bf16]

Each seed runs the suite and Trainer back to back (the order alternates between seeds, so drift on a shared machine
hits both). Wall-clock is end to end for both: read the TSVs, tokenise, load the model, train, evaluate the dev set
after every epoch. Two suite rows: "suite (as recorded)" also scores a fixed train subset every epoch and computes
attention statistics (work Trainer does not do); "suite (like for like)" turns both off.

`--batching length,random` runs every runner both ways: the suite's `train.batching` (length-grouped batches, its
default, or a plain shuffle) and Trainer's `train_sampling_strategy` (`group_by_length`, or `random`, Trainer's own
default), so whether length grouping changes the dev metric is measured, not assumed. Under the table, Welch's t-test
compares each suite row's dev scores with Trainer's at the same precision and batching (the two draw batches in
different orders, so seeds do not pair them).

With several `--precisions`, every runner runs at each (Trainer's `bf16=True` is the same autocast as the suite's
`train.precision=bf16`), and a last speed-up column compares each row with Trainer at the first precision listed.

Trainer gets what our runner does: linear schedule with 10% warmup, AdamW (weight decay 0.01, none on biases and
LayerNorm), gradient clipping 1.0, the same batching (above) with dynamic padding (`DataCollatorWithPadding`),
evaluation each epoch, bf16 autocast on CUDA, no checkpoints, no reporting.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

from suite.api import metrics
from suite.api.tasks import get_task
from suite.run.data import load_splits
from suite.run.device import autocast_dtype, pick_device
from suite.run.draws import dev_rows, draw_train, train_groups
from suite.run.settings import DEFAULT_MODEL, RunConfig, TrainSettings, resolve_model


class TokenCounter:
    """Counts the (padded) tokens the model is fed, training and evaluation apart: the work each runner asks for.
    Both runners load the model through AutoModelForSequenceClassification.from_pretrained; while counting, that
    loader adds a forward pre-hook to the model it returns."""

    def __init__(self):
        self.train = self.eval = 0

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if module.training:
            self.train += ids.numel()
        else:
            self.eval += ids.numel()

    def __enter__(self):
        from transformers import AutoModelForSequenceClassification as Auto

        self._saved = Auto.__dict__.get("from_pretrained")
        load = Auto.from_pretrained

        def counting_load(*args, **kwargs):
            model = load(*args, **kwargs)
            model.register_forward_pre_hook(self._hook, with_kwargs=True)
            return model

        Auto.from_pretrained = counting_load
        return self

    def __exit__(self, *exc):
        from transformers import AutoModelForSequenceClassification as Auto

        if self._saved is None:
            del Auto.from_pretrained
        else:
            Auto.from_pretrained = self._saved


def run_suite(cfg: RunConfig, data_dir: str, device: str) -> dict:
    from suite.run.runner import TokenizedCache, run_one

    start = time.perf_counter()
    # a fresh cache: every run reads and tokenises its data, as Trainer's does
    rec = run_one(cfg, data_dir, device=device, quiet=True, cache=TokenizedCache())
    wall = time.perf_counter() - start
    if not rec.ok:
        raise RuntimeError(rec.error)
    return {"wall_s": wall, "score": rec.final.score, "train_s": rec.timing.train_s,
            "eval_s": rec.timing.eval_s, "steps": rec.timing.steps}


def run_trainer(cfg: RunConfig, data_dir: str, device: str) -> dict:
    import datasets
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    spec = get_task(cfg.task)
    t = cfg.train
    path = resolve_model(cfg.model)
    start = time.perf_counter()
    splits = load_splits(spec, data_dir)

    def rows(cols: dict, keep) -> datasets.Dataset:
        return datasets.Dataset.from_dict({k: [cols[k][i] for i in keep] for k in (*spec.text_fields, "label")})

    tokenizer = AutoTokenizer.from_pretrained(path)

    def tokenise(batch):
        return tokenizer(*[batch[f] for f in spec.text_fields], truncation=True, max_length=t.max_length)

    # the same rows the suite trains and evaluates on: its draw for this seed (holdout, data draw) and its dev subset
    train_cols = splits[spec.train_split]
    train_keep = draw_train(train_cols["label"], t, cfg.seed, not spec.is_regression,
                            train_groups(spec, train_cols, [t])).train
    train = rows(train_cols, train_keep).map(
        tokenise, batched=True, remove_columns=list(spec.text_fields))
    (dev_split,) = spec.eval_splits.values()
    dev = rows(splits[dev_split], dev_rows(len(splits[dev_split]["label"]), t)).map(
        tokenise, batched=True, remove_columns=list(spec.text_fields))

    set_seed(cfg.seed)
    model = AutoModelForSequenceClassification.from_pretrained(  # the suite's vanilla.p is this config value
        path, num_labels=spec.num_labels, attention_probs_dropout_prob=cfg.hparams["p"])
    on = pick_device(device)  # (`dev` is the dev split here)
    # the suite's own resolution of `auto` (bf16 where the device computes it natively), so both runners match
    bf16 = autocast_dtype(t.precision, on) == torch.bfloat16

    def compute_metrics(pred):
        found = metrics.compute(spec.metrics, np.asarray(pred.predictions), np.asarray(pred.label_ids),
                                spec.is_regression, "")
        found["score"] = metrics.headline(found, spec.metric_keys())
        return found

    scores = []

    class KeepScores(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            scores.append(metrics["eval_score"])

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, learning_rate=t.lr, per_device_train_batch_size=t.batch_size,
            per_device_eval_batch_size=t.eval_batch_size, num_train_epochs=t.epochs, warmup_steps=t.warmup_ratio,
            weight_decay=t.weight_decay, max_grad_norm=t.grad_clip, lr_scheduler_type="linear",
            train_sampling_strategy="group_by_length" if t.batching in ("length", "trainer_length") else "random",
            eval_strategy="epoch", save_strategy="no",
            logging_strategy="no", report_to="none", seed=cfg.seed, data_seed=cfg.seed, use_cpu=on.type != "cuda",
            bf16=bf16, disable_tqdm=True,
            dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev,
                          data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=compute_metrics,
                          callbacks=[KeepScores()])
        trainer.remove_callback(PrinterCallback)  # metrics go to the table, not to stdout
        train_start = time.perf_counter()
        out_train = trainer.train()
        train_and_eval = time.perf_counter() - train_start
    wall = time.perf_counter() - start
    return {"wall_s": wall, "score": scores[-1], "train_and_eval_s": train_and_eval,
            "steps": out_train.global_step}


def machine(device: str) -> str:
    from suite.run.device import machine as device_name

    return f"{device_name(pick_device(device))}, {os.cpu_count()} cores, torch {torch.__version__}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="sst2")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"))
    p.add_argument("--max-train-samples", type=int, default=1000)
    p.add_argument("--max-eval-samples", type=int)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--dropout", type=float, default=0.1,
                   help="attention-probability dropout (vanilla.p; Trainer: the model config's attention dropout)")
    p.add_argument("--holdout", type=float,
                   help="carve the suite's tuning split from train first (train.holdout), as a study's final runs do; "
                        "both runners train on the rows left")
    p.add_argument("--seeds", default="1,2", help="one suite run and one Trainer run per seed, interleaved")
    p.add_argument("--device", default="auto")
    p.add_argument("--precisions", default="auto",
                   help="comma-separated; each runner runs at each (auto: bf16 autocast where the device computes it "
                        "natively, a GPU of compute capability 8.0+ or a CPU with AVX512-BF16 or AMX, else fp32; "
                        "fp32; bf16)")
    p.add_argument("--batching", default="length",
                   help="comma-separated: length (the suite's default; Trainer's group_by_length) and/or random "
                        "(plain shuffle, Trainer's default); each runner runs at each")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--skip-recorded", action="store_true", help="leave out the 'suite (as recorded)' runs")
    p.add_argument("--count-tokens", action="store_true",
                   help="also count the padded tokens each runner trains and evaluates on (a hook per module call)")
    args = p.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if args.threads:
        torch.set_num_threads(args.threads)

    precisions, batchings = args.precisions.split(","), args.batching.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]

    def settings(precision: str, batching: str, like_for_like: bool) -> TrainSettings:
        t = TrainSettings(epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, precision=precision,
                          max_train_samples=args.max_train_samples, max_eval_samples=args.max_eval_samples,
                          batching=batching, holdout=args.holdout)
        return dataclasses.replace(t, train_eval_samples=0, stats_batches=0) if like_for_like else t

    def job(seed: int, t: TrainSettings) -> RunConfig:
        return RunConfig(args.model, args.task, "vanilla", {"p": args.dropout}, seed, t)

    runners = {}  # name -> ((precision, batching), run(seed))
    for prec in precisions:
        for batching in batchings:
            setting = (prec, batching)
            tag = ", ".join([*([prec] if len(precisions) > 1 else []), *([batching] if len(batchings) > 1 else [])])
            tag = f" [{tag}]" if tag else ""
            if not args.skip_recorded:
                runners["suite (as recorded)" + tag] = (setting, lambda seed, t=settings(*setting, False): run_suite(
                    job(seed, t), args.data_dir, args.device))
            runners["suite (like for like)" + tag] = (setting, lambda seed, t=settings(*setting, True): run_suite(
                job(seed, t), args.data_dir, args.device))
            runners["HF Trainer" + tag] = (setting, lambda seed, t=settings(*setting, True): run_trainer(
                job(seed, t), args.data_dir, args.device))
    load_before = os.getloadavg()[0]
    results = _run_interleaved(runners, seeds, args.count_tokens)
    load_after = os.getloadavg()[0]

    def trainer_runs(setting: tuple[str, str]) -> list[dict]:
        return [r for name, runs in results.items() if runners[name][0] == setting and name.startswith("HF Trainer")
                for r in runs]

    def trainer(setting: tuple[str, str], key: str) -> float:
        return np.mean([r[key] for r in trainer_runs(setting)])

    rows = []
    for name, runs in results.items():
        setting = runners[name][0]
        wall, cpu = np.mean([r["wall_s"] for r in runs]), np.mean([r["cpu_s"] for r in runs])
        rows.append([name, " / ".join(f"{r['wall_s']:.1f}" for r in runs), f"{wall:.1f}",
                     f"{trainer(setting, 'wall_s') / wall:.2f}x", " / ".join(f"{r['cpu_s']:.1f}" for r in runs),
                     f"{cpu:.1f}", f"{trainer(setting, 'cpu_s') / cpu:.2f}x"]
                    + ([f"{trainer((precisions[0], setting[1]), 'cpu_s') / cpu:.2f}x"] if len(precisions) > 1 else [])
                    + [" / ".join(f"{r['score']:.4f}" for r in runs), f"{np.mean([r['score'] for r in runs]):.4f}"]
                    + ([" ; ".join(r["tokens"] for r in runs)] if args.count_tokens else []))
    spec = get_task(args.task)
    print(f"**{spec.display}, {args.model}, vanilla, {args.max_train_samples or 'all'} train examples, "
          f"{args.epochs} epoch(s), batch {args.batch_size}, lr {args.lr}, attention dropout {args.dropout}"
          f"{f', tuning split {args.holdout:g} held out' if args.holdout else ''}, seeds {args.seeds}**  ")
    print("command: `python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]) + "`  ")
    print(f"machine: {machine(args.device)}; load average {load_before:.1f} before, {load_after:.1f} after  \n")
    print(tabulate(rows, headers=["runner", "wall s (per seed)", "mean wall s", "wall speed-up",
                                  "CPU s (per seed)", "mean CPU s", "CPU speed-up"]
                   + ([f"CPU speed-up vs Trainer [{precisions[0]}]"] if len(precisions) > 1 else [])
                   + [f"dev {'/'.join(spec.metrics)} (per seed)", "mean dev"]
                   + (["padded tokens train / eval (per seed)"] if args.count_tokens else []), tablefmt="github"))
    print()
    for name, runs in results.items():
        if not name.startswith("HF Trainer"):
            print(f"- {name} minus HF Trainer at its settings: "
                  f"{welch(runs, trainer_runs(runners[name][0]))}")
    return 0


def _run_interleaved(runners: dict, seeds: list[int], count_tokens: bool) -> dict[str, list[dict]]:
    """Every runner at every seed, the order reversed every other seed (drift on a shared machine hits all)."""
    results: dict[str, list[dict]] = {name: [] for name in runners}
    for i, seed in enumerate(seeds):
        order = list(runners) if i % 2 == 0 else list(reversed(runners))
        for name in order:
            cpu_start = time.process_time()
            with TokenCounter() if count_tokens else contextlib.nullcontext() as counted:
                res = runners[name][1](seed)
            res["cpu_s"] = time.process_time() - cpu_start  # this process's CPU time: less hurt by other load
            if counted is not None:
                res["tokens"] = f"{counted.train:,} / {counted.eval:,}"
            res["seed"] = seed
            results[name].append(res)
            print(f"seed {seed} {name}: {res['wall_s']:.1f}s wall, {res['cpu_s']:.1f}s CPU, dev score "
                  f"{res['score']:.4f}", file=sys.stderr, flush=True)
    return results


def welch(a: list[dict], b: list[dict]) -> str:
    """Mean difference of the dev scores of two sets of runs and Welch's t-test (the runs are not paired)."""
    from scipy import stats

    x, y = [r["score"] for r in a], [r["score"] for r in b]
    p = stats.ttest_ind(x, y, equal_var=False).pvalue if len(x) > 1 and len(y) > 1 else float("nan")
    return f"{np.mean(x) - np.mean(y):+.4f} dev score (Welch's t-test p = {p:.2f}, {len(x)} vs {len(y)} runs)"


if __name__ == "__main__":
    raise SystemExit(main())
