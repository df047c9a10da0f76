"""Model FLOP utilisation of the suite's training step for vanilla BERT-base shapes (batch 32, sequence 128, bf16).

    python benchmarks/mfu.py                      # CUDA: BERT-base, bf16 autocast, fused AdamW
    python benchmarks/mfu.py --compile            # the same step with torch.compile
    python benchmarks/mfu.py --tiny --steps 3     # CPU smoke test of the script itself (no meaningful MFU)

The model is BERT-base built from its config (random weights: speed does not depend on them, and no download is
needed), with the suite's `vanilla` method attached, stepped by its `training_step` (the runner's own
forward, backward, clipping, optimizer and scheduler step). Training FLOPs per token follow the usual count
6 x (non-embedding parameters) + 12 x layers x sequence x hidden (attention scores and weighted sum, forward and
backward); MFU = achieved FLOP/s / the device's peak dense bf16 FLOP/s (`--peak-tflops`, else a table by GPU name).
"""
from __future__ import annotations

import argparse
import math
import time

import torch

# Dense bf16 peak (no sparsity), TFLOP/s, from the vendors' data sheets.
PEAK_TFLOPS = {"H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0, "H200": 989.0,
               "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}


def peak_tflops(name: str) -> float | None:
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # the most specific name first
        if key.lower() in name.lower():
            return PEAK_TFLOPS[key]
    return None


def flops_per_token(config, seq: int) -> float:
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    per_layer = 4 * h * h + 2 * h * inter  # q, k, v, output projections and the two feed-forward matrices
    dense = layers * per_layer + h * h + h * config.num_labels  # + pooler and classifier
    return 6 * dense + 12 * layers * seq * h


def main(argv=None) -> int:
    from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

    import suite  # noqa: F401  registers the methods
    from suite.api.attention import METHODS, StepContext

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide BERT (checks the script on CPU)")
    p.add_argument("--peak-tflops", type=float, help="the device's dense peak at this precision")
    args = p.parse_args(argv)

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
    ctx = StepContext(model, method, optimizer, scheduler, device, amp, grad_clip=1.0)

    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(1000, config.vocab_size, (args.batch_size, args.seq), generator=g),
             "token_type_ids": torch.zeros(args.batch_size, args.seq, dtype=torch.long),
             "attention_mask": torch.ones(args.batch_size, args.seq, dtype=torch.long),
             "labels": torch.randint(0, 2, (args.batch_size,), generator=g)}
    batch = {k: v.to(device) for k, v in batch.items()}

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        loss = ctx.method.training_step(ctx, batch, batch)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = ctx.method.training_step(ctx, batch, batch)
    sync()
    step_s = (time.perf_counter() - start) / args.steps
    if not math.isfinite(loss.item()):
        raise SystemExit("the loss is not finite")

    tokens = args.batch_size * args.seq
    achieved = flops_per_token(config, args.seq) * tokens / step_s / 1e12
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or (peak_tflops(name) if args.precision == "bf16" else None)
    print(f"device: {name}; model: {'tiny BERT' if args.tiny else 'BERT-base'}; batch {args.batch_size} x seq "
          f"{args.seq}; {args.precision}; compile {args.compile}; torch {torch.__version__}")
    print(f"step {step_s * 1e3:.1f} ms, {tokens / step_s:,.0f} tokens/s, {achieved:.1f} TFLOP/s"
          + (f", MFU {achieved / peak:.1%} of {peak:.0f} TFLOP/s peak" if peak else
             " (no peak known for this device: pass --peak-tflops)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
