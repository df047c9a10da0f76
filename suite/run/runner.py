"""One fine-tuning run: load the model, attach the method, fit, and return its `RunRecord`.

`run_one(RunConfig)` is the unit every executor runs. It never writes files: the store does (atomically).
"""
from __future__ import annotations

import dataclasses
import gc
import math
import time
import traceback
import warnings
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from suite.api.attention import METHODS, AttentionMethod
from suite.api.errors import NonFiniteLoss
from suite.api.tasks import TASKS, TaskSpec, get_task
from suite.run import stopping
from suite.run.analyses import run_analyses, selected
from suite.run.baselines import baseline_scores
from suite.run.cache import cached, tokenized_key
from suite.run.data import Encoded, encode, load_splits, seeded_subset, task_data_dir
from suite.run.device import (
    autocast_dtype,
    enable_tf32,
    environment,
    is_out_of_memory,
    limit_gpu_memory,
    make_deterministic,
    peak_memory_mb,
    peak_reserved_mb,
    pick_device,
    precision_label,
)
from suite.run.draws import check_heldout_task, dev_rows, draw_seed, draw_train, heldout_makeup, train_groups
from suite.run.models import load_model
from suite.run.outputs import RunHooks
from suite.run.progress import Callback as ProgressCallback
from suite.run.progress import Phases
from suite.run.record import HELDOUT, RECORD_VERSION, RunRecord
from suite.run.record_parts import (
    Analyses,
    AttentionStats,
    Baselines,
    Best,
    DataSizes,
    Epoch,
    Metrics,
    Parameters,
    Timing,
)
from suite.run.settings import RunConfig, resolve_model
from suite.run.training import FitData, FitEnv, Fitted, fit

# what the rest of the suite uses; other names are this module's own
__all__ = ["TokenizedCache", "WORKER_CACHE", "run_one", "train_and_record"]

# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------

class TokenizedCache:
    """The last task's tokenised splits, reused by the next runs of a grid in the same worker process."""

    def __init__(self):
        self._key: tuple | None = None
        self._value: Tokenized | None = None

    def clear(self) -> None:
        self._key = self._value = None

    def get(self, job: RunConfig, spec: TaskSpec, tokenizer, data_dir) -> "Tokenized":
        t, seed = job.train, draw_seed(job.train, job.seed)
        key = (job.model, spec.name, job.data_source, str(data_dir), t.max_length, t.max_train_samples,
               t.max_eval_samples, t.train_eval_samples, t.data_seed, seed, t.subset_draw, t.holdout, t.holdout_seed,
               t.test_holdout, t.carve)
        if key != self._key:  # other processes' work is reused through the disk cache (suite.run.cache)
            disk_key = tokenized_key(spec, tokenizer, data_dir, dataclasses.replace(t, data_seed=seed))
            # the dev subset is drawn with train.data_seed (0 when unset), never with the run seed: it joins the key
            disk_key = disk_key and f"{disk_key}-{t.subset_draw}-{t.holdout}-{t.holdout_seed}-dev{t.data_seed or 0}"
            if t.test_holdout is not None:  # keys of runs without it stay as they were
                disk_key = disk_key and f"{disk_key}-test{t.test_holdout}"
            if t.carve != "row" and (t.holdout is not None or t.test_holdout is not None):  # as are row carvings'
                disk_key = disk_key and f"{disk_key}-carve-{t.carve}"
            if t.test_holdout is not None:  # entries from before the held-out rows kept their groups and make-up
                disk_key = disk_key and f"{disk_key}-makeup1"
            value = cached(disk_key, lambda: tuple(_tokenize(spec, tokenizer, data_dir, t, job.seed)),
                           lambda v: _is_tokenized(v) and _ids_within(v, len(tokenizer)))
            self._key, self._value = key, Tokenized(*value)  # the disk cache keeps plain tuples
        return self._value


class Tokenized(NamedTuple):
    """A run's tokenised data: what it trains on, its dev sets, the fixed train subset scored for the overfitting
    gap, its tuning split (empty without train.holdout), how its rows were drawn (`Draw.facts`) and its held-out test
    split (empty without train.test_holdout)."""

    train: Encoded
    devs: dict[str, Encoded]
    train_subset: Encoded
    tune: Encoded
    draw: dict[str, Any]
    heldout: Encoded = Encoded([], [], [])  # a cache entry written before the held-out split existed has none


def _is_tokenized(value) -> bool:
    """Whether a cached value is shaped as a Tokenized: three tokenised splits, a dict of them, a dict of facts, and
    (but in entries written before it existed) the held-out test split."""
    return (isinstance(value, tuple) and len(value) in (len(Tokenized._fields) - 1, len(Tokenized._fields))
            and all(isinstance(value[i], Encoded) for i in (0, 2, 3, *range(5, len(value))))
            and isinstance(value[4], dict)
            and isinstance(value[1], dict) and all(isinstance(v, Encoded) for v in value[1].values()))


def _ids_within(value, vocabulary: int) -> bool:
    """Every token id of a cached value is one of the tokenizer's: an entry forged with others (its checksum made to
    match) failed mid-training with an IndexError that named no cache file; now it is named and tokenised anew."""
    encoded = [value[0], *value[1].values(), *(v for v in value[2:] if isinstance(v, Encoded))]
    return all(0 <= min(ids, default=0) and max(ids, default=0) < vocabulary
               for e in encoded for f in e.features for ids in [f["input_ids"]])


def _tokenize(spec: TaskSpec, tokenizer, data_dir, t, run_seed: int) -> Tokenized:
    check_heldout_task(spec, [t])
    splits = load_splits(spec, data_dir)
    # Subsets are drawn before tokenising (same rows): a 2000-example run need not tokenise all of MNLI.
    columns = splits[spec.train_split]
    draw = draw_train(columns["label"], t, run_seed, not spec.is_regression, train_groups(spec, columns, [t]))
    train = encode(spec, _rows(columns, draw.train), tokenizer, t.max_length)
    tune = encode(spec, _rows(columns, draw.tune), tokenizer, t.max_length) if draw.tune else Encoded([], [], [])
    test = encode(spec, _rows(columns, draw.test), tokenizer, t.max_length) if draw.test else Encoded([], [], [])
    dev_columns = {suffix: _rows(splits[split], dev_rows(len(splits[split]["label"]), t))
                   for suffix, split in spec.eval_splits.items()}
    devs = {suffix: encode(spec, dev, tokenizer, t.max_length) for suffix, dev in dev_columns.items()}
    train_subset = train.subset(seeded_subset(len(train), t.train_eval_samples, draw.seed + 1))
    facts = draw.facts()
    if draw.test:  # what the held-out rows are, beside dev's: the report states it with their scores
        groups = draw.groups_of(draw.test)
        test.groups = groups
        facts |= heldout_makeup(spec, _rows(columns, draw.test), next(iter(dev_columns.values())), groups)
    stopping.check()  # a stop swallowed while the tokenizer ran (signals land in its destructors too)
    return Tokenized(train, devs, train_subset, tune, facts, test)


def _rows(columns: dict[str, list], keep: list[int]) -> dict[str, list]:
    return {k: [v[i] for i in keep] for k, v in columns.items()}


WORKER_CACHE = TokenizedCache()  # owned by this process (each pool or Ray worker has its own)


# ---------------------------------------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------------------------------------

def _rank(score: float, spec: TaskSpec) -> float:
    if math.isnan(score):
        return -math.inf
    return score if spec.higher_is_better else -score


def _results(rec: RunRecord, fitted: Fitted, spec: TaskSpec, data: Tokenized, model, method: AttentionMethod,
             extra: int, device, amp_dtype) -> None:
    devs, train_subset, train = data.devs, data.train_subset, data.train
    rec.history = tuple(Epoch.from_json(e, f"history[{i}]") for i, e in enumerate(fitted.history))
    chosen = rec.history[(fitted.selected_epoch or len(rec.history)) - 1]  # train.select_epoch: the last or the best
    rec.final, rec.tune = chosen.dev, chosen.tune
    if not math.isfinite(rec.final.score):
        raise NonFiniteLoss(f"the final dev score is {rec.final.score}: the model's predictions are constant "
                            "(collapsed), so the task's correlation metrics are undefined")
    rec.best = Best.at(max(rec.history, key=lambda e: _rank(e.dev_score, spec)))
    rec.generalisation_gap = chosen.train_subset_score - chosen.dev_score
    rec.timing = Timing.from_json({
        "train_s": fitted.train_s, "eval_s": fitted.eval_s, "steps": fitted.steps,
        "step_s": fitted.train_s / max(fitted.steps, 1), "train_samples_per_s": fitted.seen / fitted.train_s,
        "peak_memory_mb": peak_memory_mb(device),
        "peak_memory_kind": "cuda_max_allocated" if device.type == "cuda" else "process_max_rss",
        **peak_reserved_mb(device),
        "precision": precision_label(amp_dtype, loss_scaling=fitted.ctx.scaler.is_enabled()),
        "step_mode": fitted.step_mode}, "timing")
    sizes = {"train": len(train), "dev": {spec.eval_splits[k]: len(v) for k, v in devs.items()},
             "train_subset": len(train_subset), "draw": data.draw}
    if len(data.tune):
        sizes["tune"] = len(data.tune)
    rec.data = DataSizes.from_json(sizes, "data")
    rec.parameters = Parameters.from_json({"total": sum(p.numel() for p in model.parameters()), "extra": extra,
                                           "training_only": method.training_only_parameters()}, "parameters")
    rec.method_record = method.record()
    rec.baselines = Baselines.from_json(baseline_scores(spec, {k: np.asarray(v.labels) for k, v in devs.items()}),
                                        "baselines")
    rec.prediction_arrays = {suffix: _arrays(devs[suffix], e, spec) for suffix, e in fitted.final_evals.items()}
    if fitted.heldout is not None:
        _heldout(rec, fitted.heldout, data.heldout, spec)


def _arrays(enc: Encoded, e, spec: TaskSpec) -> dict[str, np.ndarray]:
    """One split's per-example predictions as the sidecar keeps them: row in its split, gold label, logits."""
    arrays = {"index": np.asarray(enc.index if enc.index is not None else range(e.n)),
              "label": np.asarray(enc.labels, dtype=np.float32 if spec.is_regression else np.int64),
              "logits": e.logits.astype(np.float32)}
    if enc.groups is not None:  # the held-out split's rows share sources: its example se is jackknifed by group
        arrays["group"] = np.asarray(enc.groups, dtype=np.int64)
    return arrays


def _heldout(rec: RunRecord, e, enc: Encoded, spec: TaskSpec) -> None:
    """The held-out test split's score (beside dev's), its learn-nothing baselines, size and predictions."""
    if not math.isfinite(e.metrics["score"]):
        raise NonFiniteLoss(f"the held-out test score is {e.metrics['score']}: the model's predictions are constant "
                            "(collapsed), so the task's correlation metrics are undefined")
    rec.heldout = Metrics.from_json(e.metrics, "heldout")
    rec.heldout_baselines = Baselines.from_json(baseline_scores(spec, {"": np.asarray(enc.labels)}),
                                                "heldout_baselines")
    rec.data = dataclasses.replace(rec.data, heldout=len(enc))
    rec.prediction_arrays[HELDOUT] = _arrays(enc, e, spec)


def train_and_record(rec: RunRecord, job: RunConfig, data_dir, device: torch.device, quiet: bool,
                     on_epoch: Callable[[dict], None] | None, cache: TokenizedCache, hooks=None,
                     on_progress: ProgressCallback | None = None) -> None:
    from transformers import AutoTokenizer

    spec = get_task(job.task)
    t = job.train
    phases = Phases(on_progress, t.epochs)
    phases.begin("data: read, drawn and tokenised (or read from the tokenised-data cache)")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(job.model))
    data = cache.get(job, spec, tokenizer, data_dir)
    devs = data.devs
    phases.begin(f"model: loading {job.model} with {job.method}")
    model, method, extra = load_model(job, spec)
    model.to(device)
    if t.compile:
        if method.compile_warning:  # a method that breaks the graph: compiled anyway, said so
            warnings.warn(f"{job.label}: {method.compile_warning}", stacklevel=2)
        model.compile()  # in place: parameter names, hooks and the method's modules stay as they are
    amp_dtype = autocast_dtype(t.precision, device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    fit_data = FitData(spec, data.train, devs, data.train_subset, data.tune if len(data.tune) else None, pad_id,
                       data.heldout if len(data.heldout) else None)
    env = FitEnv(device, amp_dtype, job.label, quiet, on_epoch, hooks.step if hooks is not None else None,
                 on_progress)
    fitted = fit(model, method, fit_data, t, job.seed, env)
    _results(rec, fitted, spec, data, model, method, extra, device, amp_dtype)
    phases.step = fitted.steps
    if t.stats_batches > 0:
        from suite.run.attention_stats import attention_statistics

        first = next(iter(devs.values()))
        phases.begin(f"attention statistics: {t.stats_batches} dev batch(es) of up to {t.eval_batch_size}, every "
                     "pair of heads compared per query (train.stats_batches=0 skips them)")
        rec.attention = AttentionStats.from_json(
            attention_statistics(model, tokenizer, first, spec, t, pad_id, device, amp_dtype), "attention")
    if selected(t.analyses):
        phases.begin(f"analyses: {t.analyses}")
        rec.analyses = Analyses.from_json(
            run_analyses(model, tokenizer, next(iter(devs.values())), spec, t, pad_id, device, amp_dtype), "analyses")
    if hooks is not None:  # saved model, test-set predictions (suite.run.outputs)
        hooks.finished(model, tokenizer, spec, task_data_dir(spec, data_dir), device, amp_dtype)


def provenance(job: RunConfig) -> dict[str, Any]:
    """Which installed distribution registered the run's method and task (name and version)."""
    return {"method": METHODS.origin(job.method), "task": TASKS.origin(job.task)}


OOM_RETRY_NOTE = ("out of memory twice, the second time after this process's cached memory was freed; it is run "
                  "again when the same command is given again (failed runs are rerun), and fewer runs per GPU "
                  "(--gpus-per-run, --workers) or a smaller --batch-size leave it more memory")


def run_one(job: RunConfig, data_dir=None, device: str = "auto", quiet: bool = False,
            on_epoch: Callable[[dict], None] | None = None, cache: TokenizedCache | None = None,
            memory_fraction: float | None = None, on_progress: ProgressCallback | None = None) -> RunRecord:
    """Run one job and return its record: `status` is `ok`, or `failed` with the error. `memory_fraction`: this
    process's cap on its GPU's memory when runs share a GPU. `on_progress` gets the run's progress events (its start,
    steps and epochs: `suite.run.progress`). A run that runs out of memory is run once more after the
    memory is freed (a neighbour on a shared GPU may have held it), then recorded as failed with the reason.

    Ctrl-C and SIGTERM (`suite.api.errors.Terminated`) are BaseExceptions: they propagate and nothing is recorded.
    """
    dev = pick_device(device)
    try:
        gpu = {"tf32_matmul": enable_tf32(dev), "memory_fraction": limit_gpu_memory(dev, memory_fraction),
               "deterministic": make_deterministic(dev, job.train.deterministic)}
    except Exception as exc:  # noqa: BLE001  recorded with its reason: in a pool worker it would end the process,
        # and the record would only say that the worker died
        return RunRecord.failed(job, f"{type(exc).__name__} while setting up {dev}: {exc}",
                                traceback=traceback.format_exc()[-4000:])
    rec = _attempt(job, data_dir, dev, quiet, on_epoch, cache, gpu, on_progress)
    if rec.error and rec.error.startswith(OOM_ERROR):
        release_memory(dev)
        rec = _attempt(job, data_dir, dev, quiet, on_epoch, cache, gpu, on_progress)
        rec.note_executor(oom_retries=1)
        if rec.error and rec.error.startswith(OOM_ERROR):
            rec.error += f" ({OOM_RETRY_NOTE})"
    return rec


OOM_ERROR = "OutOfMemoryError: "


def _attempt(job: RunConfig, data_dir, dev: torch.device, quiet: bool, on_epoch, cache, gpu: dict,
             on_progress: ProgressCallback | None = None) -> RunRecord:
    rec = RunRecord.started_now(job, environment(dev))
    if dev.type == "cuda":
        rec.environment = {**rec.environment, **{k: v for k, v in gpu.items() if v is not None}}
    rec.provenance = provenance(job)
    start = time.perf_counter()
    hooks = RunHooks(job)  # tracking, saved model, test predictions: only when the job's outputs ask for them
    try:
        train_and_record(rec, job, data_dir, dev, quiet, hooks.chain(on_epoch), cache or WORKER_CACHE, hooks,
                         on_progress)
        rec.status = "ok"
    except NonFiniteLoss as exc:
        rec.status, rec.error = "failed", f"NonFiniteLoss: {exc}"
    except Exception as exc:  # noqa: BLE001  a failing run is recorded; the grid goes on
        name = "OutOfMemoryError" if is_out_of_memory(exc) else type(exc).__name__
        rec.status, rec.error = "failed", f"{name}: {exc}"
        rec.traceback = traceback.format_exc()[-4000:]
    rec.wall_s = time.perf_counter() - start
    rec.finished = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rec.version = RECORD_VERSION
    hooks.close(rec)
    release_memory(dev)
    return rec


def release_memory(device: torch.device) -> None:
    """Free what the finished run left behind before the next one starts in this process: its model, optimizer and
    method state sit in reference cycles (a method's step context points back at the model), which only the cyclic
    collector frees; on CUDA the caching allocator also returns the memory, so the next run's peak memory is its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
