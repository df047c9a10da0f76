"""Model FLOP utilisation of the suite's training step for vanilla BERT-base shapes on real, padded GLUE batches.

    python lab/speed/mfu.py --data-dir ../shared/data/glue            # CUDA: BERT-base, bf16 autocast, fused AdamW
    python lab/speed/mfu.py --data-dir ../shared/data/glue --compile  # the same step with torch.compile
    python lab/speed/mfu.py --data-dir ../shared/data/glue --tiny --steps 3   # CPU smoke test (no meaningful MFU)

The batches are the ones the suite trains on: a GLUE task's training set (RTE by default) tokenised with the BERT
uncased vocabulary (the packaged MiniLM's tokenizer, the same WordPiece vocabulary as bert-base-uncased), truncated
to --max-length and cut into the suite's length-grouped batches, each padded to its longest example; not one
unpadded full-length batch (the fused attention kernel's best case). The model is BERT-base built from its config
(random weights: speed does not depend on them, and no download is needed), with the suite's `vanilla` method
attached, stepped by its `training_step` (the runner's own forward, backward, clipping, optimizer and scheduler step).

Training FLOPs per token follow the usual count 6 x (non-embedding parameters) + 12 x layers x sequence x hidden
(attention scores and weighted sum, forward and backward), counted on the padded batch (the work the device does);
the share spent on padding is reported beside it. MFU = achieved FLOP/s / the device's peak dense bf16 FLOP/s
(`--peak-tflops`, else the table below by GPU name).
"""
from __future__ import annotations

import argparse
import math
import time

import torch

# the peak table and the FLOP count are the loop profile's (`suite bench --loop`): one home for both
from suite.profiling.loop import PEAK_TFLOPS, flops_per_token, peak_tflops  # noqa: F401


def glue_batches(task: str, data_dir: str, batch_size: int, max_length: int, count: int, seed: int = 0) -> list[dict]:
    """`count` training batches of a GLUE task as the suite trains on them (length-grouped, padded per batch)."""
    from transformers import AutoTokenizer

    from suite.api.tasks import get_task
    from suite.run.batching import BATCHINGS
    from suite.run.data import encode, load_splits
    from suite.run.settings import DEFAULT_MODEL, resolve_model

    spec = get_task(task)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))  # the bert-base-uncased vocabulary
    train = encode(spec, load_splits(spec, data_dir)[spec.train_split], tokenizer, max_length)
    order = BATCHINGS["length"].order(train.lengths(), batch_size, torch.Generator().manual_seed(seed))
    order = [b for b in order if len(b) == batch_size] or order  # full batches: the shape a long run mostly sees
    pad_id = tokenizer.pad_token_id or 0
    return [train.batch(order[i % len(order)], pad_id, spec.is_regression) for i in range(count)]


def padded_flops(config, batch: dict) -> tuple[float, int, int]:
    """(training FLOPs of the padded batch, padded tokens, real tokens)."""
    b, seq = batch["input_ids"].shape
    return flops_per_token(config, seq) * b * seq, b * seq, int(batch["attention_mask"].sum())


def measure(args) -> dict:
    """The measurement as a dict (also used by lab/speed/gpu_check.py)."""
    from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

    import suite  # noqa: F401  registers the methods
    from suite.api.attention import METHODS, StepContext

    device = torch.device(args.device)
    config = (BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
              if args.tiny else BertConfig())  # BertConfig() is bert-base: 768 wide, 12 layers, 12 heads
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    method = METHODS.get("vanilla")()  # dropout 0.1 on the probabilities, through the fused SDPA kernel
    method.attach(model)
    model.to(device).train()
    if args.compile:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=device.type in ("cuda", "cpu"))
    total = args.warmup + args.steps
    scheduler = get_linear_schedule_with_warmup(optimizer, total // 10, total)
    amp = torch.bfloat16 if args.precision == "bf16" else None
    ctx = StepContext(model, method, optimizer, scheduler, device, amp, grad_clip=1.0, total_steps=total)
    batches = [{k: v.to(device) for k, v in b.items()}
               for b in glue_batches(args.task, args.data_dir, args.batch_size, args.max_length, total)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step(batch, next_batch):  # as the runner steps: the step count and the method's host-side hook first
        ctx.step += 1
        ctx.method.before_step(ctx)
        return ctx.method.training_step(ctx, batch, next_batch)

    for i in range(args.warmup):
        step(batches[i], batches[i + 1])
    sync()
    timed = batches[args.warmup:]
    start = time.perf_counter()
    for i, batch in enumerate(timed):
        loss = step(batch, timed[i + 1] if i + 1 < len(timed) else None)
    sync()
    seconds = time.perf_counter() - start
    if not math.isfinite(loss.item()):
        raise SystemExit("the loss is not finite")
    flops, padded, real = (sum(x) for x in zip(*(padded_flops(config, b) for b in timed)))
    achieved = flops / seconds / 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or (peak_tflops(name) if args.precision == "bf16" else None)
    return {"device": name, "model": "tiny BERT" if args.tiny else "BERT-base", "task": args.task,
            "batch_size": args.batch_size, "max_length": args.max_length,
            "mean_padded_length": padded / len(timed) / args.batch_size, "padding_share": 1 - real / padded,
            "precision": args.precision, "compile": args.compile, "torch": torch.__version__, "steps": len(timed),
            "step_ms": seconds / len(timed) * 1e3, "tokens_per_s": padded / seconds,
            "real_tokens_per_s": real / seconds,
            "achieved_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak if peak else None}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="the GLUE folder (the suite's --data-dir)")
    p.add_argument("--task", default="rte", help="the GLUE task whose training batches are used (default rte)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide BERT (checks the script on CPU)")
    p.add_argument("--peak-tflops", type=float, help="the device's dense peak at this precision")
    return p


def main(argv=None) -> int:
    r = measure(parser().parse_args(argv))
    print(f"device: {r['device']}; model: {r['model']}; {r['task']} batches of {r['batch_size']}, mean padded length "
          f"{r['mean_padded_length']:.0f} (max {r['max_length']}), {r['padding_share']:.0%} padding; {r['precision']}; "
          f"compile {r['compile']}; torch {r['torch']}")
    print(f"step {r['step_ms']:.1f} ms, {r['tokens_per_s']:,.0f} tokens/s ({r['real_tokens_per_s']:,.0f} real), "
          f"{r['achieved_tflops']:.1f} TFLOP/s"
          + (f", MFU {r['mfu']:.1%} of {r['peak_tflops']:.0f} TFLOP/s peak" if r["mfu"] is not None else
             " (no peak known for this device: pass --peak-tflops)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
