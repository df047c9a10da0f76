"""`python -m suite bench --loop`: the real training loop on a real GLUE task, profiled.

What a run does per step, measured on the loop itself rather than on one isolated step: the task's training rows
(seeded, as a run draws them) cut into the run's batches and padded as `train.pad_to` says, stepped through
`suite.run.training.train_epoch` (the method's `training_step`, the loss reads every few batches, the progress bar),
then one evaluation of the dev set through `evaluate`. Two epochs over `steps` batches: the first counted (operators,
host synchronisation points and batch shapes: `suite.profiling.counters`; it also warms the allocator up), the second
timed. On a GPU the counts are what a launch-bound step pays for; on the CPU they are the same code's counts, so
they tell in CI what a GPU would see.

Model FLOPs per token follow the usual count, 6 x (non-embedding parameters) + 12 x layers x width x hidden (the
attention scores and weighted sum, forward and backward), on the padded batches (the work the device does), so
achieved FLOP/s are comparable across methods whatever extra work a method does; MFU divides them by the device's
dense peak (`PEAK_TFLOPS`, bf16 on NVIDIA data-centre GPUs; none for CPUs, so no MFU there).
"""
from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import torch

from suite.profiling.counters import counting

# what the rest of the suite uses; other names are this module's own
__all__ = ["LoopSpec", "PEAK_TFLOPS", "flops_per_token", "loop_table", "peak_tflops", "profile_loop"]

# Dense bf16 tensor-core peak (without 2:4 sparsity), TFLOP/s, from NVIDIA's data sheets (their headline figures are
# with sparsity: halved here). H100 SXM / PCIe / NVL: "NVIDIA H100 Tensor Core GPU" datasheet (BF16 1,979 / 1,513 /
# 1,671 with sparsity); H200: "NVIDIA H200 Tensor Core GPU" datasheet (SXM 1,979 with sparsity); A100: "NVIDIA A100
# Tensor Core GPU" datasheet (BF16 312); L40S: "NVIDIA L40S" datasheet (BF16 733 with sparsity -> 362); L40:
# "NVIDIA L40" datasheet (BF16 362.1 with sparsity -> 181); L4: "NVIDIA L4" datasheet (BF16 242 with sparsity -> 121);
# A10: "NVIDIA A10" datasheet (BF16 250 with sparsity -> 125). The A10G (AWS) is not the A10 and NVIDIA publishes
# no figure for it: it is left out, so its MFU needs --peak-tflops. Names are matched as whole words, most specific
# first, so "L40" never matches "L4", nor "A10G" "A10".
PEAK_TFLOPS = {"H100 SXM": 989.5, "H100 NVL": 835.5, "H100 PCIe": 756.5, "H100": 989.5, "H200": 989.5,
               "A100": 312.0, "L40S": 362.0, "L40": 181.0, "L4": 121.0, "A10": 125.0}


def peak_tflops(name: str) -> float | None:
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # the most specific name first
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name, flags=re.IGNORECASE):
            return PEAK_TFLOPS[key]
    return None


def flops_per_token(config, seq: int) -> float:
    """Training FLOPs per token of a BERT-like encoder at width `seq` (forward and backward)."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    per_layer = 4 * h * h + 2 * h * inter  # q, k, v, output projections and the two feed-forward matrices
    dense = layers * per_layer + h * h + h * config.num_labels  # + pooler and classifier
    return 6 * dense + 12 * layers * seq * h


@dataclasses.dataclass
class LoopSpec:
    task: str = "sst2"
    method: str = "vanilla"
    model: str = "minilm"          # the packaged MiniLM, `bert-base` (random-init BERT-base: no download), or a path
    steps: int = 200
    batch_size: int = 32
    max_length: int = 128
    precision: str = "auto"
    pad_to: str = "auto"
    seed: int = 1
    peak_tflops: float | None = None  # overrides the table (a GPU it lacks)
    capture: str = "auto"  # train.capture: steps replayed from CUDA graphs where they can be, or off


def _model(spec_model: str, task, method_name: str, seed: int):
    """(model with the method attached, method, tokenizer); `bert-base` is built from its config, with MiniLM's
    tokenizer (the same uncased WordPiece vocabulary)."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from suite.run.models import load_model
    from suite.run.settings import DEFAULT_MODEL, RunConfig, TrainSettings, resolve_model

    if spec_model == "bert-base":
        torch.manual_seed(seed)
        model = BertForSequenceClassification(BertConfig(num_labels=task.num_labels,
                                                         problem_type="regression" if task.is_regression else None))
        from suite.run.models import build_method

        method = build_method(RunConfig("bert-base", task.name, method_name, {}, seed, TrainSettings()))
        method.attach(model)
        return model, method, AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    job = RunConfig(spec_model, task.name, method_name, {}, seed, TrainSettings())
    model, method, _ = load_model(job, task)
    return model, method, AutoTokenizer.from_pretrained(resolve_model(spec_model))


def profile_loop(ls: LoopSpec, data_dir, device: torch.device) -> dict[str, Any]:
    """Count, then time, two epochs of `ls.steps` batches of the real loop, and count one dev evaluation."""
    from suite.api.tasks import get_task
    from suite.run.batching import BATCHINGS, padded_widths, resolve_pad_to
    from suite.run.capture import Steps, eager_reason
    from suite.run.device import autocast_dtype, machine, wait_policy
    from suite.run.runner import TokenizedCache
    from suite.run.settings import RunConfig, preset_train
    from suite.run.training import TrainLoop, build_context, evaluate, train_epoch

    task = get_task(ls.task)
    t = dataclasses.replace(preset_train("quick", ls.task), epochs=2, batch_size=ls.batch_size,
                            max_train_samples=ls.steps * ls.batch_size, train_eval_samples=0, stats_batches=0,
                            max_length=ls.max_length, precision=ls.precision, pad_to=ls.pad_to,
                            capture=ls.capture)
    model, method, tokenizer = _model(ls.model, task, ls.method, ls.seed)
    job = RunConfig(ls.model, task.name, ls.method, {}, ls.seed, t)
    data = TokenizedCache().get(job, task, tokenizer, data_dir)
    amp = autocast_dtype(t.precision, device)
    model.to(device).train()
    pad_to = resolve_pad_to(t.pad_to, device.type, t.compile)
    pad_id = tokenizer.pad_token_id or 0
    train, dev = data.train, next(iter(data.devs.values()))
    train_w, dev_w = padded_widths(train.lengths(), pad_to, t.max_length), padded_widths(dev.lengths(), pad_to,
                                                                                        t.max_length)
    steps = math.ceil(len(train) / t.batch_size)
    reason = eager_reason(method, t.capture, device, amp, t.compile, t.grad_accumulation)
    ctx = build_context(model, method, t, 2 * steps, device, amp, graphs=reason is None)
    stepper = Steps(ctx, reason)
    shapes: set[tuple[int, int]] = set()
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: shapes.add(tuple(kwargs["input_ids"].shape)) if m.training else None,
        with_kwargs=True)
    generator = torch.Generator().manual_seed(ls.seed)
    loop = TrainLoop(ctx, train, task, t, pad_id, generator, "bench", quiet=True, widths=train_w, steps=stepper)

    def epoch(number: int) -> None:
        train_epoch(loop, number)

    with counting() as counted:
        epoch(1)
    hook.remove()
    lengths = train.lengths()
    order = torch.Generator()
    order.set_state(generator.get_state())  # the timed epoch's batches, drawn as train_epoch will draw them
    batches = BATCHINGS[t.batching].order(lengths, t.batch_size, order)
    padded = [(len(b), train_w.width(b, lengths)) for b in batches]
    _sync(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    epoch(2)
    _sync(device)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    with counting() as evaluated:
        evaluate(model, dev, task, t.eval_batch_size, pad_id, device, amp, widths=dev_w)
    eval_batches = math.ceil(len(dev) / t.eval_batch_size)
    padded_tokens, real_tokens = sum(b * w for b, w in padded), sum(lengths)
    flops = sum(flops_per_token(model.config, w) * b * w for b, w in padded)
    achieved = flops / seconds / 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(amp, "fp32")
    peak = ls.peak_tflops or (peak_tflops(name) if device.type == "cuda" and precision == "bf16" else None)
    return {"task": task.name, "method": ls.method, "model": ls.model, "batch_size": t.batch_size,
            "max_length": t.max_length, "pad_to": pad_to, "precision": precision, "steps": steps,
            "device": machine(device), "torch": torch.__version__,
            "host_syncs_per_step": counted.syncs / steps, "host_sync_kinds": dict(counted.sync_kinds),
            "shapes_per_epoch": len(shapes), "widths": sorted({w for _, w in shapes}),
            "ops_per_step": counted.ops / steps, "views_per_step": counted.views / steps,
            "steps_per_s": steps / seconds, "step_ms": 1e3 * seconds / steps,
            # every thread's CPU time: what threads spinning while they wait burn shows here
            "cpu_s_per_step": cpu_seconds / steps, "threads": torch.get_num_threads(),
            "omp_wait_policy": wait_policy(),
            "tokens_per_s": padded_tokens / seconds, "real_tokens_per_s": real_tokens / seconds,
            "padding_share": 1 - real_tokens / padded_tokens,
            "eval_host_syncs_per_batch": evaluated.syncs / eval_batches,
            "eval_host_sync_kinds": dict(evaluated.sync_kinds), "eval_batches": eval_batches,
            "achieved_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak if peak else None,
            "step_mode": stepper.facts()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loop_table(rows: list[dict[str, Any]]) -> str:
    from tabulate import tabulate

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    body = [[r["task"], r["method"], r["pad_to"], _mode(r.get("step_mode", {})),
             num(r["host_syncs_per_step"], ".2f"), r["shapes_per_epoch"],
             num(r["ops_per_step"], ".0f"), num(r["steps_per_s"], ".2f"), num(r["tokens_per_s"], ".0f"),
             num(r["padding_share"], ".1%"), num(r["eval_host_syncs_per_batch"], ".2f"),
             num(r["achieved_tflops"], ".3f"), num(r["mfu"], ".1%")] for r in rows]
    return tabulate(body, headers=["task", "method", "pad_to", "step", "host syncs/step", "shapes/epoch", "ops/step",
                                   "steps/s", "tokens/s", "padding", "eval syncs/batch", "TFLOP/s", "MFU"],
                    tablefmt="github", disable_numparse=True)


def _mode(facts: dict[str, Any]) -> str:
    """'captured (8 graphs)' or 'eager: the reason'."""
    if facts.get("mode") == "captured":
        return f"captured ({facts['graphs']} graphs)"
    return f"eager: {facts.get('reason', '?')}"
