"""`python -m suite bench`: training-step time and peak memory of every attention method against vanilla attention.

What one measurement is: a training step as the runner takes it (`runner.standard_step`, or the method's own
`training_step`, e.g. AttendOut's), on a random-init model of the chosen shape, in train mode (dropout on), with the
model's loss on random labels. The optimizer is a no-op SGD (its param groups exist, its `step` changes nothing) and
gradient clipping is off, so a step is forward + backward (+ a method's auxiliary loss, + whatever extra work its own
training step does, such as AttendOut's look-ahead passes and generator update); the AdamW update, the same for every
method, does not dilute the ratios. Batches have no padding unless `--padding` is given.

Baselines, both stock transformers with attention-probability dropout at the config's rate (0.1):
  [sdpa]   transformers' fused `scaled_dot_product_attention` path, the default BERT/RoBERTa attention;
  [eager]  transformers' own eager attention (explicit matmul, softmax, dropout, matmul): the reference for methods
           that must materialise the probabilities. It is independent of the suite's code.
The suite's `vanilla` row (its SDPA path) should read about 1.00x [sdpa]: a check of the plumbing.

Protocol: every candidate (baselines and methods) lives in one process, all sharing the same weight tensors. Steps
are interleaved: in each round every candidate takes one step, in an order rotated from round to round, so slow
drifts of a shared machine hit all of them alike. The first `--warmup` rounds are not timed (allocator warm-up,
lazy setup such as AttendOut's generator); then `--reps` timed rounds; the table gives the median and the spread
(interquartile range / median).

Memory: one extra step per candidate after the warm-up. CUDA: `torch.cuda.max_memory_allocated` during the step
minus what was allocated just before it. CPU: the same quantity from the allocation events that
`torch.profiler.profile(profile_memory=True)` records (running sum of allocated minus freed bytes, its maximum).
Both are the step's transient memory (activations, gradients, temporaries) above the resident weights; state a
method keeps between steps is not in it (the extra-parameter column shows added parameters, and for AttendOut its
generator's).

The last columns judge each method against its cost target (a multiple of [eager]; the targets are for CUDA), and
`--profile` adds, for each method that misses it (or for the methods named), the top operators of one profiled step.
On a busy shared CPU `--threads 1` gives steadier numbers: oversubscribed OpenMP threads spin and wait.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import platform
import statistics
import sys
import time
from typing import Any, Callable

import torch

COMMAND = "bench"
SDPA, EAGER = "[sdpa]", "[eager]"
# Cost targets, as a multiple of transformers' eager attention step (the issue's targets for CUDA; AttendOut's from
# methods.md §3.3: about 3x a vanilla step with a generator update every step).
DROPOUT_FAMILY = ("vanilla", "no_dropout", "scores_dropout", "scores_dropout_naive", "scores_dropout_layerwise",
                  "scores_dropout_dynamic", "drophead", "dropattention_col")
TARGETS = {**{m: 1.3 for m in DROPOUT_FAMILY}, "topk": 1.3, "rela": 1.2, "sparsemax": 2.0, "entmax15": 2.0,
           "attendout": 3.0}
SHAPES = ("bert-base", "minilm", "tiny")
# The shapes are the CUDA defaults; a 2-core CPU needs minutes per BERT-base step at batch 32 x 512.
CUDA_DEFAULTS = {"shapes": "bert-base,minilm", "seq_len": "128,512", "batch_size": 32, "reps": 10}
CPU_DEFAULTS = {"shapes": "minilm", "seq_len": "128", "batch_size": 8, "reps": 5}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="training-step time and peak memory of each method vs vanilla attention",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="all", help="comma list of names, wildcards or 'all' (default all)")
    p.add_argument("--shapes", help=f"comma list of {', '.join(SHAPES)} (default: bert-base,minilm on CUDA, minilm "
                                    "on CPU); bert-base = 12 layers, hidden 768, 12 heads; minilm = the default "
                                    "model's config (6 layers, hidden 384, 12 heads); tiny = 2 layers, hidden 64, "
                                    "4 heads, for smoke tests")
    p.add_argument("--seq-len", help="comma list of sequence lengths (default: 128,512 on CUDA, 128 on CPU)")
    p.add_argument("--batch-size", type=int, help="default: 32 on CUDA, 8 on CPU")
    p.add_argument("--reps", type=int, help="timed rounds (default: 10 on CUDA, 5 on CPU)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    p.add_argument("--padding", type=float, default=0.0,
                   help="up to this share of each sequence is padding, drawn per row (default 0: full rows)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1 ...")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="auto: bf16 autocast on CUDA, fp32 on CPU")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="M.KEY=V",
                   help="a method's hyper-parameter (as in `run`)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory pass")
    p.add_argument("--profile", nargs="?", const="missed", metavar="METHODS",
                   help="profile one step of each method that misses its target (or of the given comma list) "
                        "with torch.profiler and add its top operators to the output")
    p.add_argument("--threads", type=int,
                   help="CPU threads for torch (default: torch's choice); 1 is steadier on a busy shared machine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the markdown to this file")


# ---------------------------------------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------------------------------------

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
    times: list[float] = dataclasses.field(default_factory=list)
    peak_mb: float | None = None
    error: str | None = None


def shape_config(name: str):
    from transformers import AutoConfig, BertConfig

    if name == "bert-base":
        cfg = BertConfig()  # bert-base-uncased: 12 layers, hidden 768, 12 heads, FFN 3072, dropout 0.1
    elif name == "minilm":
        from .config import default_model

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

    from .attention import AttentionMethod
    from .runner import StepContext, standard_step

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
        return StepContext(model, method, opt, sched, device, amp_dtype, grad_clip=0.0)

    out = []
    for impl, label in (("sdpa", SDPA), ("eager", EAGER)):
        model = copy_of_base()
        model.set_attn_implementation(impl)
        ctx = context(model, AttentionMethod())
        out.append(Candidate(label, lambda b, nb, c=ctx: standard_step(c, b, nb), ctx,
                             note=f"transformers {impl}, attention dropout {cfg.attention_probs_dropout_prob}"))
    for name, method in methods:
        cand = Candidate(name)
        try:
            model = copy_of_base()
            method.attach(model)
            model.to(device)  # parameters a method's prepare() created on the CPU
            cand.extra_parameters = (sum(p.numel() for p in model.parameters() if id(p) not in shared)
                                     + int(getattr(method, "training_only_parameters", 0) or 0))
            cand.ctx = ctx = context(model, method)
            if hasattr(method, "setup_training"):
                method.setup_training(ctx)
            if method.training_step is not None:
                cand.step = lambda b, nb, m=method, c=ctx: m.training_step(c, b, nb)
                cand.note = "its own training step (batch + next batch)"
            else:
                cand.step = lambda b, nb, c=ctx: standard_step(c, b, nb)
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

def _median(c: Candidate) -> float | None:
    return statistics.median(c.times) if c.times and c.error is None else None


def _spread(c: Candidate) -> str:
    if len(c.times) < 2 or c.error is not None:
        return "-"
    q = statistics.quantiles(c.times, n=4, method="inclusive")
    return f"{100 * (q[2] - q[0]) / statistics.median(c.times):.0f}%"


def _mb(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def _target(c: Candidate, t: float | None, t_eager: float | None) -> str:
    if c.name not in TARGETS:
        return "-"
    if t is None or not t_eager:
        return f"<= {TARGETS[c.name]}"
    return f"<= {TARGETS[c.name]} {'met' if t / t_eager <= TARGETS[c.name] else 'MISSED'}"


def missed_targets(cands: list[Candidate]) -> list[Candidate]:
    by = {c.name: c for c in cands}
    t_eager = _median(by[EAGER])
    return [c for c in cands if c.name in TARGETS and _median(c) is not None and t_eager
            and _median(c) / t_eager > TARGETS[c.name]]


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


def table(cands: list[Candidate]) -> str:
    from tabulate import tabulate

    by = {c.name: c for c in cands}
    t_sdpa, t_eager = _median(by[SDPA]), _median(by[EAGER])
    m_sdpa, m_eager = by[SDPA].peak_mb, by[EAGER].peak_mb
    rows = []
    for c in cands:
        t = _median(c)
        rows.append([c.name, f"{1000 * t:.1f}" if t is not None else "-", _spread(c), _ratio(t, t_sdpa),
                     _ratio(t, t_eager), _mb(c.peak_mb),
                     _ratio(c.peak_mb, m_sdpa), _ratio(c.peak_mb, m_eager),
                     f"{c.extra_parameters:,}" if c.extra_parameters else "0", _target(c, t, t_eager),
                     f"failed: {c.error}" if c.error else c.note])
    headers = ["method", "step ms (median)", "spread (IQR)", "time x sdpa", "time x eager", "step peak MB",
               "mem x sdpa", "mem x eager", "extra params", "CUDA target (x eager)", "note"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} torch threads"


def header(device, amp_dtype, shape: str, cfg, batch: int, seq: int, args, defaults_note: str) -> str:
    import transformers

    from .runner import precision_label

    prec = precision_label(amp_dtype)
    lines = [f"### {shape}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} "
             f"heads, FFN {cfg.intermediate_size}; batch {batch} x sequence {seq}"
             + (f", up to {args.padding:.0%} padding per row" if args.padding else ", no padding"),
             "",
             f"{machine(device)}; torch {torch.__version__}, transformers {transformers.__version__}; {prec}; "
             f"{args.warmup} warm-up + {args.reps} timed interleaved rounds, median; "
             f"{datetime.date.today().isoformat()}."
             + (" The targets are for CUDA; on a CPU they are indicative only." if device.type != "cuda" else "")]
    if defaults_note:
        lines.append(defaults_note)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Command
# ---------------------------------------------------------------------------------------------------------

def _ints(text: str, what: str) -> list[int]:
    from .cli import BadInput

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--{what}: expected a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise BadInput(f"--{what}: values must be >= 1, got {text!r}")
    return values


def _methods(args) -> list[tuple[str, Any]]:
    from .attention import METHODS
    from .cli import BadInput
    from .config import parse_assignment

    names = METHODS.select(args.methods)
    overrides: dict[str, dict[str, Any]] = {}
    for text in args.sets:
        target, key, values = parse_assignment(text, sweep=False)
        if target == "train":
            raise BadInput(f"--set {text}: bench has no training settings; use its own flags")
        overrides.setdefault(target, {})[key] = values[0]
    out = []
    for name in names:
        cls = METHODS.get(name)
        out.append((name, cls(dataclasses.replace(cls.Config(), **overrides.get(name, {})))))
    return out


def command(args, shapes: list[str], seq_lens: list[int]) -> str:
    """The command line that reproduces this table, with the defaults that were filled in spelled out."""
    import shlex

    parts = ["python -m suite bench", "--methods", args.methods, "--shapes", ",".join(shapes),
             "--seq-len", ",".join(map(str, seq_lens)), "--batch-size", str(args.batch_size),
             "--reps", str(args.reps), "--warmup", str(args.warmup), "--device", args.device]
    if args.padding:
        parts += ["--padding", str(args.padding)]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    if args.precision != "auto":
        parts += ["--precision", args.precision]
    for text in args.sets:
        parts += ["--set", text]
    if args.no_memory:
        parts.append("--no-memory")
    if args.profile:
        parts += ["--profile"] + ([args.profile] if args.profile != "missed" else [])
    return " ".join(parts[:1] + [shlex.quote(x) for x in parts[1:]])


def main(args) -> int:
    from .cli import BadInput
    from .runner import autocast_dtype, pick_device

    try:
        device = pick_device(args.device)
    except RuntimeError as exc:
        raise BadInput(str(exc)) from None
    defaults = CUDA_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    defaulted = [f"{flag} {defaults[key]}" for flag, key, given in
                 (("--shapes", "shapes", args.shapes), ("--seq-len", "seq_len", args.seq_len),
                  ("--batch-size", "batch_size", args.batch_size)) if given is None]
    note = ""
    if device.type != "cuda" and defaulted:
        note = (f"CPU defaults used: {', '.join(defaulted)} (a shared 2-core CPU cannot take BERT-base at 32 x 512 "
                "in minutes); the GPU shapes are `--shapes bert-base,minilm --seq-len 128,512 --batch-size 32`.")
    shapes = [s.strip() for s in (args.shapes or defaults["shapes"]).split(",") if s.strip()]
    for s in shapes:
        if s not in SHAPES:
            raise BadInput(f"--shapes: unknown shape {s!r}. Valid shapes: {', '.join(SHAPES)}")
    seq_lens = _ints(args.seq_len or defaults["seq_len"], "seq-len")
    args.batch_size = args.batch_size or defaults["batch_size"]
    args.reps = args.reps or defaults["reps"]
    if args.batch_size < 1 or args.reps < 1 or args.warmup < 0:
        raise BadInput("--batch-size and --reps must be >= 1, --warmup >= 0")
    if not 0 <= args.padding < 1:
        raise BadInput(f"--padding={args.padding} must lie in [0, 1)")
    if args.threads is not None:
        if args.threads < 1:
            raise BadInput("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    amp_dtype = autocast_dtype(args.precision, device)
    methods = _methods(args)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    sections = ["## Attention methods: training-step time and memory", "",
                f"Command (effective settings): `{command(args, shapes, seq_lens)}`"]
    configs = {shape: shape_config(shape) for shape in shapes}
    for shape, cfg in configs.items():
        if max(seq_lens) > cfg.max_position_embeddings:
            raise BadInput(f"--seq-len {max(seq_lens)} exceeds {shape}'s {cfg.max_position_embeddings} positions")
    for shape, cfg in configs.items():
        torch.manual_seed(args.seed)
        log(f"{shape}: building {len(methods) + 2} candidates on {device}")
        # fresh method objects per shape: prepare() and any training state belong to one model
        fresh = [(n, type(m)(copy.deepcopy(m.cfg))) for n, m in methods]
        cands = build_candidates(cfg, fresh, device, amp_dtype)
        for seq in seq_lens:
            log(f"{shape} batch {args.batch_size} x {seq}")
            b1, b2 = make_batches(cfg, args.batch_size, seq, args.padding, device, args.seed)
            run_shape(cands, b1, b2, device, args.warmup, args.reps, not args.no_memory, log)
            sections += ["", header(device, amp_dtype, shape, cfg, args.batch_size, seq, args, note), "",
                         table(cands)]
            if args.profile:
                chosen = (missed_targets(cands) if args.profile == "missed" else
                          [c for c in cands if c.name in set(args.profile.split(",")) and c.error is None])
                for c in chosen:
                    log(f"  profiling {c.name}")
                    sections += ["", f"Where the time of one `{c.name}` step goes ({shape}, batch {args.batch_size} "
                                     f"x {seq}; profiled step, so absolute times are inflated):", "",
                                 profile_step(c, b1, b2, device)]
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del cands
    text = "\n".join(sections) + "\n"
    print(text)
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        log(f"wrote {args.out}")
    return 0
