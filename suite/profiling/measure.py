"""Building the candidates (baselines and methods sharing one model's weights) and timing their training steps."""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Callable

import torch

# what the rest of the suite uses; other names are this module's own
__all__ = ["Candidate", "SHAPES", "build_candidates", "cpu_step_peak_bytes", "make_batches",
           "profile_step", "run_shape", "shape_config"]

SDPA, EAGER = "[sdpa]", "[eager]"
SHAPES = ("bert-base", "minilm", "tiny")


class _NoStepSGD(torch.optim.SGD):
    """Param groups and a learning rate (AttendOut's look-ahead reads it) but no update: steps stay comparable."""

    @torch.no_grad()
    def step(self, closure=None):
        return None


@dataclasses.dataclass
class Candidate:
    name: str
    step: Callable[[dict, dict], Any] | None = None
    ctx: Any = None
    extra_parameters: int = 0
    note: str = ""
    target: float | None = None  # the method's cost_target (x eager)
    times: list[float] = dataclasses.field(default_factory=list)
    peak_mb: float | None = None
    error: str | None = None


def shape_config(name: str):
    from transformers import AutoConfig, BertConfig

    if name == "bert-base":
        cfg = BertConfig()  # bert-base-uncased: 12 layers, hidden 768, 12 heads, FFN 3072, dropout 0.1
    elif name == "minilm":
        from suite.run.settings import default_model

        cfg = AutoConfig.from_pretrained(default_model())
    elif name == "tiny":
        cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=128)
    else:
        raise ValueError(f"unknown shape {name!r}: choose from {', '.join(SHAPES)}")
    cfg.num_labels = 2
    return cfg


def build_candidates(cfg, methods: list[tuple[str, Any]], device: torch.device,
                     amp_dtype: torch.dtype | None) -> list[Candidate]:
    """Baselines and methods on copies of one random-init model that share its weight tensors."""
    from transformers import AutoModelForSequenceClassification

    from suite.api.attention import AttentionMethod, StepContext

    base = AutoModelForSequenceClassification.from_config(cfg).to(device)
    base.train()
    shared = {id(p): p for p in base.parameters()}

    def copy_of_base():
        model = copy.deepcopy(base, memo=dict(shared))  # new modules and config, the same parameter tensors
        model.train()
        return model

    def context(model, method):
        opt = _NoStepSGD(model.parameters(), lr=2e-5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        # one nominal step: a scheduled rate (DropHead's default) stays at its start, p, the cost the bench times
        return StepContext(model, method, opt, sched, device, amp_dtype, grad_clip=0.0, total_steps=1)

    out = []
    for impl, label in (("sdpa", SDPA), ("eager", EAGER)):
        model = copy_of_base()
        model.set_attn_implementation(impl)
        ctx = context(model, AttentionMethod())
        out.append(Candidate(label, lambda b, nb, c=ctx: c.method.training_step(c, b, nb), ctx,
                             note=f"transformers {impl}, attention dropout {cfg.attention_probs_dropout_prob}"))
    for name, method in methods:
        cand = Candidate(name, target=method.cost_target)
        try:
            model = copy_of_base()
            method.attach(model)
            model.to(device)  # parameters a method's prepare() created on the CPU
            cand.extra_parameters = (sum(p.numel() for p in model.parameters() if id(p) not in shared)
                                     + method.training_only_parameters())
            cand.ctx = ctx = context(model, method)
            method.setup_training(ctx)
            cand.step = lambda b, nb, m=method, c=ctx: (m.before_step(c), m.training_step(c, b, nb))[1]
            if type(method).training_step is not AttentionMethod.training_step:
                cand.note = "its own training step (batch + next batch)"
        except Exception as exc:  # noqa: BLE001  one broken method must not end the benchmark
            cand.error = f"setup: {type(exc).__name__}: {exc}"[:200]
        out.append(cand)
    return out


def make_batches(cfg, batch_size: int, seq_len: int, padding: float, device, seed: int) -> tuple[dict, dict]:
    """Two different random batches (a step, and the next batch for methods that look ahead)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(2):
        ids = torch.randint(1000 if cfg.vocab_size > 2000 else 5, cfg.vocab_size, (batch_size, seq_len), generator=g)
        mask = torch.ones(batch_size, seq_len, dtype=torch.long)
        if padding > 0:
            lengths = seq_len - (torch.rand(batch_size, generator=g) * padding * seq_len).long()
            lengths[0] = seq_len  # the longest row sets the width, as with dynamic padding
            mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
            ids[mask == 0] = cfg.pad_token_id or 0
        batch = {"input_ids": ids, "attention_mask": mask,
                 "token_type_ids": torch.zeros_like(ids),
                 "labels": torch.randint(0, 2, (batch_size,), generator=g)}
        batches.append({k: v.to(device) for k, v in batch.items()})
    return batches[0], batches[1]


# ---------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _take_step(cand: Candidate, b1: dict, b2: dict, device: torch.device) -> float | None:
    """One step, timed; on failure the candidate is marked and skipped from then on."""
    cand.ctx.step += 1
    _sync(device)
    start = time.perf_counter()
    try:
        cand.step(b1, b2)
        _sync(device)
    except Exception as exc:  # noqa: BLE001
        oom = isinstance(exc, torch.cuda.OutOfMemoryError)
        cand.error = "out of memory" if oom else f"{type(exc).__name__}: {exc}"[:200]
        cand.ctx.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return None
    return time.perf_counter() - start


def cpu_step_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak of (bytes allocated - bytes freed) on the CPU while `fn` runs, from the profiler's allocation events."""
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # read when the profiler first starts: no start/stop lines
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    level = peak = 0
    for e in events:
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def measure_memory(cand: Candidate, b1: dict, b2: dict, device: torch.device) -> None:
    cand.ctx.optimizer.zero_grad(set_to_none=True)
    cand.ctx.step += 1
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            cand.step(b1, b2)
            torch.cuda.synchronize(device)
            cand.peak_mb = (torch.cuda.max_memory_allocated(device) - before) / 2**20
        else:
            cand.peak_mb = cpu_step_peak_bytes(lambda: cand.step(b1, b2)) / 2**20
    except Exception as exc:  # noqa: BLE001
        cand.error = cand.error or f"memory pass: {type(exc).__name__}: {exc}"[:200]


def run_shape(cands: list[Candidate], b1: dict, b2: dict, device, warmup: int, reps: int, memory: bool,
              log: Callable[[str], None]) -> None:
    for c in cands:
        c.times.clear()
        c.peak_mb = None
    live = [c for c in cands if c.error is None]
    for r in range(warmup):
        for c in live[r % len(live):] + live[:r % len(live)]:
            if c.error is None:
                _take_step(c, b1, b2, device)
        log(f"  warm-up round {r + 1}/{warmup} done")
    if memory:
        for c in cands:
            if c.error is None:
                measure_memory(c, b1, b2, device)
    for r in range(reps):
        order = live[r % len(live):] + live[:r % len(live)]
        for c in order:
            if c.error is None:
                t = _take_step(c, b1, b2, device)
                if t is not None:
                    c.times.append(t)
        log(f"  round {r + 1}/{reps} done")


# ---------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------


def profile_step(cand: Candidate, b1: dict, b2: dict, device: torch.device, top: int = 10) -> str:
    """Top operators of one step by self time (device time on CUDA), as a markdown table."""
    import os

    from tabulate import tabulate

    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    cand.ctx.step += 1
    with profile(activities=acts) as prof:
        cand.step(b1, b2)
        _sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) or 1
    rows = [[e.key, f"{getattr(e, key) / 1000:.1f}", f"{100 * getattr(e, key) / total:.0f}%", e.count]
            for e in events[:top]]
    return tabulate(rows, headers=["operator", f"self {'device' if device.type == 'cuda' else 'CPU'} ms",
                                   "share", "calls"], tablefmt="github", disable_numparse=True)
