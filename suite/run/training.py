"""The train/eval loop of one run: optimizer, steps through the method's hooks, evaluation every epoch.

`fit` takes a loaded model and method and tokenised data and returns what the record needs; it knows nothing about
files, grids or records (the runner does).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from typing import Any, Callable

import numpy as np
import torch

from suite.api import metrics
from suite.api.attention import AttentionMethod, StepContext
from suite.api.errors import HyperParameterError, NonFiniteLoss
from suite.api.tasks import TaskSpec
from suite.run import stopping
from suite.run.batching import BATCHINGS, Widths, padded_widths, resolve_pad_to, sorted_batches, to_device
from suite.run.capture import Steps, eager_reason
from suite.run.data import Encoded
from suite.run.progress import Callback, RunClock, steps_per_epoch
from suite.run.settings import TrainSettings

# what the rest of the suite uses; other names are this module's own
__all__ = ["EpochSelection", "FitData", "FitEnv", "Fitted", "TrainLoop", "build_context", "evaluate", "fit",
           "train_epoch"]


def _no_decay(name: str) -> bool:
    return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name


def build_context(model, method: AttentionMethod, t: TrainSettings, steps: int, device: torch.device,
                  amp_dtype: torch.dtype | None, graphs: bool = False) -> StepContext:
    """AdamW (no decay on biases and norms), linear warm-up and decay, loss scaling under fp16. For steps replayed
    from CUDA graphs (`graphs`) the learning rate is a tensor on the device, which the scheduler fills and the
    fused, capturable AdamW reads at every replay."""
    from transformers import get_linear_schedule_with_warmup

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    lr = torch.tensor(t.lr, dtype=torch.float32, device=device) if graphs else t.lr
    optimizer = torch.optim.AdamW([{"params": [p for n, p in named if not _no_decay(n)],
                                    "weight_decay": t.weight_decay},
                                   {"params": [p for n, p in named if _no_decay(n)], "weight_decay": 0.0}],
                                  lr=lr, fused=device.type in ("cuda", "cpu"),
                                  capturable=graphs and device.type == "cuda")
    warmup = int(t.warmup_ratio * steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, steps)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16)
    ctx = StepContext(model, method, optimizer, scheduler, device, amp_dtype, t.grad_clip, total_steps=steps,
                      warmup_steps=warmup, scaler=scaler, graphs=graphs)
    method.setup_training(ctx)
    return ctx


# ---------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Evaluation:
    loss: float
    metrics: dict[str, float]
    logits: np.ndarray      # in the order of the encoded split
    n: int


@torch.no_grad()
def evaluate(model, enc: Encoded, spec: TaskSpec, batch_size: int, pad_id: int, device, amp_dtype,
             suffix: str = "", widths: Widths = Widths()) -> Evaluation:
    """Loss, official metrics and logits with the model in eval mode (no dropout of any kind), each batch padded as
    `widths` says."""
    was_training = model.training
    model.eval()
    lengths = enc.lengths()
    batches = sorted_batches(lengths, batch_size)
    # logits stay on the device until the split is done: one copy to the host per split, not one per batch, and
    # they are put back in the split's order on the host (an index tensor per batch would be a copy to the device)
    outs = []
    total = torch.zeros((), device=device)
    autocast = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    for b in batches:
        batch = to_device(enc.batch(b, pad_id, spec.is_regression, widths.width(b, lengths)), device)
        with autocast:
            out = model(**batch)
        total += out.loss.float() * len(b)
        outs.append(out.logits.float())
    model.train(was_training)
    arr = np.empty((len(enc), spec.num_labels), dtype=np.float32)
    if outs:
        arr[[i for b in batches for i in b]] = torch.cat(outs).cpu().numpy()
    found = metrics.compute(spec.metrics, arr, np.asarray(enc.labels), spec.is_regression, suffix)
    return Evaluation(total.item() / len(enc), found, arr, len(enc))


# ---------------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------------

STEP_LOG_BATCHES = 25  # batches between host syncs: the running loss is checked, and trackers get the step loss


def _progress(total: int, desc: str, quiet: bool):
    from tqdm.auto import tqdm

    # disable=None: no bar when stderr is no terminal (a log file gets no \r redraws; the grid logs a line per run)
    return tqdm(total=total, desc=desc, disable=True if quiet else None, leave=False, dynamic_ncols=True,
                file=sys.stderr)


@dataclasses.dataclass
class Fitted:
    history: list[dict[str, Any]]
    final_evals: dict[str, Evaluation]   # the last epoch's dev evaluations (predictions)
    train_s: float
    eval_s: float
    steps: int
    seen: int
    ctx: StepContext
    selected_epoch: int = 0      # the epoch whose model the run ends with (train.select_epoch); 0: the last
    stopped_early: bool = False  # early stopping ended the run before train.epochs
    heldout: Evaluation | None = None  # the held-out test split scored by the model the run ends with
    step_mode: dict[str, Any] = dataclasses.field(default_factory=dict)  # captured or eager, and why (Steps.facts)


class EpochSelection:
    """Early stopping on the tuning-split score (never dev: dev is the test set) and the choice of the epoch the run
    ends with (`train.select_epoch`): with `best`, the weights and evaluations of the best epoch are kept in memory
    and put back at the end."""

    def __init__(self, t: TrainSettings, spec: TaskSpec):
        self.t, self.sign = t, 1.0 if spec.higher_is_better else -1.0
        self.best_rank, self.best_epoch, self.best_state, self.best_evals = -math.inf, 0, None, {}

    def update(self, epoch: int, score: float, model, evals) -> bool:
        """Note an epoch's tuning-split score; True when training should stop here (patience spent)."""
        rank = self.sign * score if math.isfinite(score) else -math.inf
        if rank > self.best_rank:
            self.best_rank, self.best_epoch, self.best_evals = rank, epoch, evals
            if self.t.select_epoch == "best" and epoch < self.t.epochs:
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        patience = self.t.early_stopping_patience
        return bool(patience) and epoch < self.t.epochs and epoch - self.best_epoch >= patience

    def finish(self, model, last_epoch: int, last_evals) -> tuple[int, dict]:
        """(selected epoch, its evaluations); with `best`, the model gets the best epoch's weights back."""
        if self.t.select_epoch != "best" or self.best_epoch in (0, last_epoch):
            return last_epoch, last_evals
        model.load_state_dict(self.best_state)
        return self.best_epoch, self.best_evals


@dataclasses.dataclass(frozen=True)
class TrainLoop:
    """What every epoch of a run trains with: the step context and how each step runs (`steps`; None: the method's
    training_step, eagerly), the training rows and their bucket widths (train.pad_to), the task, the settings, the
    tokenizer's padding id, the batch-order generator, the progress bar's label (none when `quiet`) and the
    callback that gets the step values every STEP_LOG_BATCHES batches."""

    ctx: StepContext
    train: Encoded
    spec: TaskSpec
    t: TrainSettings
    pad_id: int
    generator: torch.Generator
    label: str = ""
    quiet: bool = True
    on_step: Callable[[int, dict[str, float]], None] | None = None
    widths: Widths = Widths()
    steps: Steps | None = None


def train_epoch(loop: TrainLoop, epoch: int, on_loss: Callable[[int, float], None] | None = None) -> tuple[float, int]:
    """One pass over shuffled batches, drawn as train.batching says and padded as `loop.widths` says; (mean training
    loss, examples seen). `loop.on_step(optimizer step, values)` gets the mean loss of the last STEP_LOG_BATCHES
    batches and the learning rate; `on_loss(optimizer step, the epoch's running loss)` is called at the same reads,
    and on a CPU after every batch (the progress lines)."""
    ctx, train, t, on_step = loop.ctx, loop.train, loop.t, loop.on_step
    steps = loop.steps or Steps(ctx, "no Steps given")
    lengths = train.lengths()
    batches = BATCHINGS[t.batching].order(lengths, t.batch_size, loop.generator)
    bar = _progress(len(batches), f"{loop.label} ep{epoch}/{t.epochs}", loop.quiet)
    loss_sum = torch.zeros((), device=ctx.device)

    def make(idx):
        return to_device(train.batch(idx, loop.pad_id, loop.spec.is_regression, loop.widths.width(idx, lengths)),
                         ctx.device)

    nxt, seen, accumulate = make(batches[0]), 0, t.grad_accumulation
    logged_sum, logged_at = 0.0, 0  # the loss sum and batch count at the last host sync
    for i in range(len(batches)):
        stopping.check()  # a SIGTERM / Ctrl-C its handler could not raise (swallowed in a destructor) stops here
        batch = nxt
        nxt = make(batches[i + 1]) if i + 1 < len(batches) else None
        if i % accumulate == 0:  # the first batch of an optimizer step
            ctx.step += 1
            ctx.group_size = min(accumulate, len(batches) - i)
        ctx.group_end = (i + 1) % accumulate == 0 or i + 1 == len(batches)
        loss_sum += steps(batch, nxt).float()
        seen += len(batches[i])
        bar.update(1)
        if (i + 1) % STEP_LOG_BATCHES == 0 or i + 1 == len(batches):  # one host sync every STEP_LOG_BATCHES
            total = loss_sum.item()
            running = total / (i + 1)
            if not math.isfinite(running):
                raise NonFiniteLoss(f"training loss became {running} in epoch {epoch} near step {i + 1}")
            bar.set_postfix(loss=f"{running:.4f}")
            if on_loss is not None:
                on_loss(ctx.step, running)
            if on_step is not None:
                lr = float(ctx.scheduler.get_last_lr()[0]) if hasattr(ctx.scheduler, "get_last_lr") else math.nan
                on_step(ctx.step, {"step/train_loss": (total - logged_sum) / (i + 1 - logged_at), "step/lr": lr})
            logged_sum, logged_at = total, i + 1
        elif on_loss is not None and ctx.device.type == "cpu":  # no sync to wait for on a CPU: progress at any batch
            on_loss(ctx.step, loss_sum.item() / (i + 1))
    bar.close()
    return logged_sum / len(batches), seen  # the last batch's read holds the epoch's sum: no further sync


def check_finite_model(model: torch.nn.Module, dev_loss: float, epoch: int) -> None:
    """A diverged model can still produce a finite running loss on its last steps: check weights and dev loss."""
    named = list(model.named_parameters())
    finite = torch.stack([torch.isfinite(p).all() for _, p in named]).tolist()  # one host read for all of them
    bad = next((n for (n, _), ok in zip(named, finite) if not ok), None)
    if bad is not None:
        raise NonFiniteLoss(f"weights became NaN/inf after epoch {epoch} (first: {bad}); lower the learning rate")
    if not math.isfinite(dev_loss):
        raise NonFiniteLoss(f"dev loss became {dev_loss} after epoch {epoch}; lower the learning rate")


@dataclasses.dataclass(frozen=True)
class FitData:
    """What `fit` trains on and scores: the task, the training rows, the eval splits (by metric suffix), the fixed
    train subset scored each epoch for the overfitting gap, the tuning split (train.holdout; None: none), the
    tokenizer's padding id and the held-out test split (train.test_holdout; None: none), scored once at the end."""

    spec: TaskSpec
    train: Encoded
    devs: dict[str, Encoded]
    train_subset: Encoded
    tune: Encoded | None
    pad_id: int
    heldout: Encoded | None = None


@dataclasses.dataclass(frozen=True)
class FitEnv:
    """Where and how `fit` runs: the device, the autocast dtype (None: fp32), the run's label for progress bars,
    and the callbacks a grid passes (each finished epoch's entry; every STEP_LOG_BATCHES batches' step values; the
    run's progress events, `suite.run.progress`)."""

    device: torch.device
    amp_dtype: torch.dtype | None
    label: str
    quiet: bool = False
    on_epoch: Callable[[dict], None] | None = None
    on_step: Callable[[int, dict[str, float]], None] | None = None
    on_progress: Callback | None = None


class Scorer:
    """The run's model scored on each of its splits, built once per run: the same batch size (train.eval_batch_size),
    padding id, device and autocast dtype for every split, and each split's bucket widths (train.pad_to) from its
    own lengths, computed once."""

    def __init__(self, model, data: FitData, t: TrainSettings, env: FitEnv):
        self.model, self.data, self.t, self.env = model, data, t, env
        self.pad_to = resolve_pad_to(t.pad_to, env.device.type, t.compile)
        self.dev_widths = {suffix: self.widths(enc) for suffix, enc in data.devs.items()}
        self.subset_widths = self.widths(data.train_subset)
        self.tune_widths = self.widths(data.tune) if data.tune is not None else Widths()

    def widths(self, enc: Encoded) -> Widths:
        return padded_widths(enc.lengths(), self.pad_to, self.t.max_length)

    def evaluate(self, enc: Encoded, widths: Widths, suffix: str = "") -> Evaluation:
        return evaluate(self.model, enc, self.data.spec, self.t.eval_batch_size, self.data.pad_id, self.env.device,
                        self.env.amp_dtype, suffix, widths)

    def devs(self) -> tuple[float, dict[str, float], dict[str, Evaluation]]:
        """(mean dev loss, metrics of every eval split with the headline `score`, each split's evaluation)."""
        evals = {suffix: self.evaluate(enc, self.dev_widths[suffix], suffix) for suffix, enc in self.data.devs.items()}
        found: dict[str, float] = {}
        for e in evals.values():
            found.update(e.metrics)
        found["score"] = metrics.headline(found, self.data.spec.metric_keys())
        loss = sum(e.loss * e.n for e in evals.values()) / sum(e.n for e in evals.values())
        return loss, found, evals

    def split(self, enc: Encoded, widths: Widths) -> Evaluation:
        """One split scored by the task's unsuffixed metrics, with their headline `score` (the train subset, the
        tuning split, the held-out test split)."""
        e = self.evaluate(enc, widths)
        e.metrics["score"] = metrics.headline(e.metrics, list(self.data.spec.metrics))
        return e

    def train_subset(self) -> dict[str, Any]:
        """An epoch's entries for the fixed train subset (NaN without one: train_eval_samples=0, no generalisation
        gap)."""
        if not len(self.data.train_subset):
            return {"train_subset_loss": math.nan, "train_subset": {"score": math.nan}}
        e = self.split(self.data.train_subset, self.subset_widths)
        return {"train_subset_loss": e.loss, "train_subset": e.metrics}

    def tune(self) -> dict[str, Any]:
        """An epoch's entries for the tuning split, scored like the train subset."""
        e = self.split(self.data.tune, self.tune_widths)
        return {"tune_loss": e.loss, "tune": e.metrics}


def fit(model, method: AttentionMethod, data: FitData, t: TrainSettings, seed: int, env: FitEnv) -> Fitted:
    """Train for `t.epochs`, scoring dev, the train subset and the tuning split each epoch; early stopping and
    `select_epoch=best` read the tuning split's score only. The held-out test split is scored once, by the model the
    run ends with, after every choice is made."""
    if data.tune is None and (t.early_stopping_patience or t.select_epoch == "best"):
        raise HyperParameterError("early stopping and select_epoch=best need a tuning split (train.holdout): they "
                                  "never read dev")
    device = env.device
    per_epoch = steps_per_epoch(len(data.train), t)
    reason = eager_reason(method, t.capture, device, env.amp_dtype, t.compile, t.grad_accumulation)
    ctx = build_context(model, method, t, per_epoch * t.epochs, device, env.amp_dtype, graphs=reason is None)
    steps = Steps(ctx, reason)
    scorer = Scorer(model, data, t, env)
    loop = TrainLoop(ctx, data.train, data.spec, t, data.pad_id, torch.Generator().manual_seed(seed), env.label,
                     env.quiet, env.on_step, scorer.widths(data.train), steps)
    history, train_s, eval_s, seen, evals = [], 0.0, 0.0, 0, {}
    selection, stop = EpochSelection(t, data.spec), False
    clock = RunClock(env.on_progress, t.epochs, per_epoch * t.epochs, len(data.train))
    clock.started()
    model.train()
    for epoch in range(1, t.epochs + 1):
        start = time.perf_counter()
        train_loss, n = train_epoch(loop, epoch, on_loss=lambda step, loss, e=epoch: clock.stepped(e, step, loss))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_time = time.perf_counter() - start
        train_s, seen = train_s + epoch_time, seen + n

        start = time.perf_counter()
        dev_loss, dev, evals = scorer.devs()
        check_finite_model(model, dev_loss, epoch)
        entry = {"epoch": epoch, "train_loss": train_loss, "dev_loss": dev_loss, "dev": dev, **scorer.train_subset(),
                 "epoch_time_s": epoch_time, "train_samples_per_s": n / epoch_time}
        if data.tune is not None:
            entry |= scorer.tune()
        eval_s += time.perf_counter() - start
        facts = method.epoch_record()
        if facts:
            entry["method"] = facts
        history.append(entry)
        clock.epoch_done(epoch, ctx.step, entry)
        if env.on_epoch:
            env.on_epoch(entry)
        if stop := selection.update(epoch, entry["tune"]["score"] if data.tune is not None else math.nan, model,
                                    evals):
            break
    selected, evals = selection.finish(model, len(history), evals)
    heldout = scorer.split(data.heldout, scorer.widths(data.heldout)) if data.heldout is not None else None
    return Fitted(history, evals, train_s, eval_s, ctx.step, seen, ctx, selected, stop, heldout, steps.facts())
