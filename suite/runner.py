"""One fine-tuning run: load the model, attach the method, train with per-epoch evaluation, return its record.

`run_one(RunConfig)` is the unit every executor runs. It never writes files: the store does (atomically).
"""
from __future__ import annotations

import contextlib
import importlib.util
import dataclasses
import math
import platform
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import __version__, metrics
from .attention import METHODS, AttentionMethod, check_precision
from .config import RunConfig, resolve_model
from .data import (Encoded, TaskSpec, collate, encode, get_task, length_grouped_batches, load_splits,
                   seeded_subset, sorted_batches)


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or inf; the run is recorded as failed and the grid goes on."""


# ---------------------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------------------

def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for but no CUDA device is visible")
    return torch.device(requested)


AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype a run trains and evaluates in (None: plain fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return AUTOCAST_DTYPES[precision]


def precision_label(amp_dtype: torch.dtype | None, loss_scaling: bool = False) -> str:
    """'fp32', 'bf16 autocast', 'fp16 autocast, loss scaling': what records and bench headers say ran."""
    if amp_dtype is None:
        return "fp32"
    name = next(k for k, v in AUTOCAST_DTYPES.items() if v is amp_dtype)
    return f"{name} autocast" + (", loss scaling" if loss_scaling else "")


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device) -> dict[str, Any]:
    import datasets
    import transformers

    env = {"suite": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "datasets": datasets.__version__,
           "platform": platform.platform(), "machine": platform.machine(), "cpu_threads": torch.get_num_threads(),
           "device": str(device), "git_commit": git_commit(), "host": platform.node()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by this run; on CPU the process's peak resident set (it never decreases)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------------------
# Model and data
# ---------------------------------------------------------------------------------------------------------

_TOKENIZED: dict[tuple, tuple] = {}  # (model, task, source, max_length, subsets) -> encoded splits, reused by a grid


def load_model(cfg: RunConfig, spec: TaskSpec):
    from transformers import AutoConfig, AutoModelForSequenceClassification, set_seed
    from transformers.utils import logging as hf_logging

    # The load report lists the new classifier head as missing: expected when fine-tuning, noise in a grid.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    path = resolve_model(cfg.model)
    mcfg = AutoConfig.from_pretrained(path, num_labels=spec.num_labels,
                                      problem_type="regression" if spec.is_regression else
                                      "single_label_classification")
    if spec.label_names:
        mcfg.id2label = dict(enumerate(spec.label_names))
        mcfg.label2id = {n: i for i, n in enumerate(spec.label_names)}
    set_seed(cfg.seed)  # the classifier head's initialisation depends on the seed
    # a checkpoint that already has a head of another size (e.g. fine-tuned on another task) gets a fresh one
    model = AutoModelForSequenceClassification.from_pretrained(path, config=mcfg, ignore_mismatched_sizes=True)
    method: AttentionMethod = METHODS.get(cfg.method)(METHODS.get(cfg.method).Config(**cfg.hparams))
    before = sum(p.numel() for p in model.parameters())
    method.attach(model)
    method.extra_parameters = sum(p.numel() for p in model.parameters()) - before  # saved with the model
    return model, method


def load_data(cfg: RunConfig, spec: TaskSpec, tokenizer, data_dir) -> tuple[Encoded, dict[str, Encoded], Encoded]:
    """(train, {eval suffix: dev}, fixed train subset for the overfitting gap)."""
    t = cfg.train
    key = (cfg.model, spec.name, cfg.data_source, str(data_dir), t.max_length, t.max_train_samples,
           t.max_eval_samples, t.train_eval_samples, t.data_seed)
    if key not in _TOKENIZED:
        splits = load_splits(spec, data_dir)
        # Subsets are drawn before tokenising (same rows): a 2000-example run need not tokenise all of MNLI.
        train = encode(spec, _rows(splits[spec.train_split], t.max_train_samples, t.data_seed), tokenizer,
                       t.max_length)
        devs = {}
        for suffix, split in spec.eval_splits.items():
            devs[suffix] = encode(spec, _rows(splits[split], t.max_eval_samples, t.data_seed), tokenizer,
                                  t.max_length)
        probe = train.subset(seeded_subset(len(train), t.train_eval_samples, t.data_seed + 1))
        _TOKENIZED.clear()  # keep one task's tensors at a time
        _TOKENIZED[key] = (train, devs, probe)
    return _TOKENIZED[key]


def _rows(columns: dict[str, list], limit: int | None, seed: int) -> dict[str, list]:
    keep = seeded_subset(len(columns["label"]), limit, seed)
    return {k: [v[i] for i in keep] for k, v in columns.items()}


# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class StepContext:
    """What a training step needs; methods with their own `training_step` receive it."""

    model: torch.nn.Module
    method: AttentionMethod
    optimizer: torch.optim.Optimizer
    scheduler: Any
    device: torch.device
    amp_dtype: torch.dtype | None
    grad_clip: float
    step: int = 0
    # dynamic loss scaling under fp16 autocast; disabled, it passes the loss and the optimizer step through unchanged
    scaler: torch.amp.GradScaler = dataclasses.field(default_factory=lambda: torch.amp.GradScaler("cpu", enabled=False))

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def loss(self, batch: dict, model: torch.nn.Module | None = None) -> torch.Tensor:
        """Task loss plus the method's auxiliary loss, under autocast."""
        model = model or self.model
        with self.autocast():
            loss = model(**batch).loss
            aux = self.method.aux_loss(model)
        return loss if aux is None else loss + aux

    def apply(self, loss: torch.Tensor) -> None:
        """Backward, clip, optimizer and scheduler step (under fp16, with the loss scaled and the gradients unscaled
        before clipping; a step whose gradients overflowed is skipped and the scale lowered)."""
        self.scaler.scale(loss).backward()
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


def standard_step(ctx: StepContext, batch: dict, next_batch: dict | None) -> torch.Tensor:
    loss = ctx.loss(batch)
    ctx.apply(loss)
    return loss.detach()


def to_device(batch: dict, device: torch.device) -> dict:
    if device.type == "cuda":  # from pinned memory the copy is asynchronous: the host does not wait for it
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model, enc: Encoded, spec: TaskSpec, batch_size: int, pad_id: int, device, amp_dtype,
             suffix: str = "") -> tuple[float, dict[str, float], int]:
    """(mean loss, official metrics, n) with the model in eval mode (no dropout of any kind)."""
    was_training = model.training
    model.eval()
    logits, total = [], torch.zeros((), device=device)
    batches = sorted_batches(enc.lengths(), batch_size)
    order = [i for b in batches for i in b]
    ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    for b in batches:
        batch = to_device(collate([enc.features[i] for i in b], [enc.labels[i] for i in b], pad_id,
                                  spec.is_regression), device)
        with ctx:
            out = model(**batch)
        total += out.loss.float() * len(b)
        logits.append(out.logits.float())
    model.train(was_training)
    all_logits = torch.cat(logits).cpu().numpy()
    gold = np.asarray([enc.labels[i] for i in order])
    return (total.item() / len(enc), metrics.compute(spec.metrics, all_logits, gold, spec.is_regression, suffix),
            len(enc))


def evaluate_all(model, devs: dict[str, Encoded], spec, batch_size, pad_id, device, amp_dtype) -> tuple[float, dict]:
    losses, found, n = 0.0, {}, 0
    for suffix, enc in devs.items():
        loss, m, k = evaluate(model, enc, spec, batch_size, pad_id, device, amp_dtype, suffix)
        losses, n = losses + loss * k, n + k
        found.update(m)
    found["score"] = metrics.headline(found, spec.metric_keys())
    return losses / n, found


def _progress(total: int, desc: str, quiet: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=quiet, leave=False, dynamic_ncols=True, file=sys.stderr)


def train_and_evaluate(cfg: RunConfig, data_dir, device: torch.device, quiet: bool,
                       on_epoch: Callable[[dict], None] | None = None) -> dict[str, Any]:
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    spec = get_task(cfg.task)
    t = cfg.train
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model))
    train, devs, probe = load_data(cfg, spec, tokenizer, data_dir)
    model, method = load_model(cfg, spec)
    model.to(device)
    if t.compile:
        model.compile()  # in place: parameter names, hooks and the method's modules stay as they are
    amp_dtype = autocast_dtype(t.precision, device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    decay = [p for n, p in model.named_parameters() if p.requires_grad and not _no_decay(n)]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and _no_decay(n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=t.lr,
                                  fused=device.type in ("cuda", "cpu"))
    steps_per_epoch = math.ceil(len(train) / t.batch_size)
    total_steps = steps_per_epoch * t.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(t.warmup_ratio * total_steps), total_steps)
    check_precision(method, t.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16)
    ctx = StepContext(model, method, optimizer, scheduler, device, amp_dtype, t.grad_clip, scaler=scaler)
    step_fn = method.training_step or standard_step  # methods with several models bring their own step
    if hasattr(method, "setup_training"):
        method.setup_training(ctx)

    generator = torch.Generator().manual_seed(cfg.seed)
    lengths = train.lengths()
    history, train_time, eval_time, seen = [], 0.0, 0.0, 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    for epoch in range(1, t.epochs + 1):
        batches = length_grouped_batches(lengths, t.batch_size, generator)
        bar = _progress(len(batches), f"{cfg.label} ep{epoch}/{t.epochs}", quiet)
        loss_sum = torch.zeros((), device=device)
        start = time.perf_counter()

        def make(idx):
            return to_device(collate([train.features[i] for i in idx], [train.labels[i] for i in idx], pad_id,
                                     spec.is_regression), device)

        nxt = make(batches[0])
        for i in range(len(batches)):
            batch = nxt
            nxt = make(batches[i + 1]) if i + 1 < len(batches) else None
            ctx.step += 1
            loss_sum += step_fn(ctx, batch, nxt).float()
            seen += len(batches[i])
            bar.update(1)
            if (i + 1) % 10 == 0 or i + 1 == len(batches):  # one host sync every 10 steps, not every step
                running = loss_sum.item() / (i + 1)
                if not math.isfinite(running):
                    raise NonFiniteLoss(f"training loss became {running} in epoch {epoch} near step {i + 1}")
                bar.set_postfix(loss=f"{running:.4f}")
        bar.close()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_time = time.perf_counter() - start
        train_time += epoch_time

        start = time.perf_counter()
        dev_loss, dev = evaluate_all(model, devs, spec, t.eval_batch_size, pad_id, device, amp_dtype)
        if len(probe):
            probe_loss, probe_m, _ = evaluate(model, probe, spec, t.eval_batch_size, pad_id, device, amp_dtype)
            probe_m["score"] = metrics.headline(probe_m, list(spec.metrics))
        else:  # train_eval_samples=0: no train-subset scores (and no generalisation gap)
            probe_loss, probe_m = math.nan, {"score": math.nan}
        eval_time += time.perf_counter() - start
        entry = {"epoch": epoch, "train_loss": loss_sum.item() / len(batches), "dev_loss": dev_loss, "dev": dev,
                 "train_subset_loss": probe_loss, "train_subset": probe_m, "epoch_time_s": epoch_time,
                 "train_samples_per_s": len(train) / epoch_time}
        if hasattr(method, "epoch_record"):
            entry["method"] = method.epoch_record()
        history.append(entry)
        if on_epoch:
            on_epoch(entry)

    result: dict[str, Any] = {"history": history, "final": history[-1]["dev"],
                              "best": max(history, key=lambda e: _rank(e["dev"]["score"], spec))["dev"]
                              | {"epoch": max(history, key=lambda e: _rank(e["dev"]["score"], spec))["epoch"]}}
    result["generalisation_gap"] = history[-1]["train_subset"]["score"] - history[-1]["dev"]["score"]
    result["timing"] = {"train_s": train_time, "eval_s": eval_time, "steps": ctx.step,
                        "step_s": train_time / max(ctx.step, 1), "train_samples_per_s": seen / train_time,
                        "peak_memory_mb": peak_memory_mb(device),
                        "peak_memory_kind": "cuda_max_allocated" if device.type == "cuda" else "process_max_rss",
                        "precision": precision_label(amp_dtype, loss_scaling=scaler.is_enabled())}
    result["data"] = {"train": len(train), "dev": {spec.eval_splits[k]: len(v) for k, v in devs.items()},
                      "train_subset": len(probe)}
    result["parameters"] = {"total": sum(p.numel() for p in model.parameters()),
                            "extra": method.extra_parameters,
                            "training_only": getattr(method, "training_only_parameters", 0)}
    if t.stats_batches > 0 and importlib.util.find_spec("suite.stats") is not None:
        from . import stats

        first = next(iter(devs.values()))
        result["attention"] = stats.attention_statistics(model, tokenizer, first, spec, t, pad_id, device, amp_dtype)
    result["method_record"] = method.record()
    return result


def _rank(score: float, spec: TaskSpec) -> float:
    if math.isnan(score):
        return -math.inf
    return score if spec.higher_is_better else -score


def _no_decay(name: str) -> bool:
    return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name


def run_one(cfg: RunConfig, data_dir=None, device: str = "auto", quiet: bool = False,
            on_epoch: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Run one job and return its record: `status` is `ok`, or `failed` with the error. Ctrl-C propagates."""
    dev = pick_device(device)
    record: dict[str, Any] = {"config": cfg.to_dict(), "hash": cfg.hash, "label": cfg.label,
                              "environment": environment(dev), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    start = time.perf_counter()
    try:
        record.update(train_and_evaluate(cfg, data_dir, dev, quiet, on_epoch))
        record["status"] = "ok"
    except NonFiniteLoss as exc:
        record.update(status="failed", error=f"NonFiniteLoss: {exc}")
    except Exception as exc:  # noqa: BLE001  a failing run is recorded; the grid goes on
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-4000:])
    record["wall_s"] = time.perf_counter() - start
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return record
