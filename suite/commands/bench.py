"""`python -m suite bench`: options, defaults per device, and the loop over shapes and sequence lengths."""
from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any

import torch

from suite.api.errors import BadInput
from suite.profiling.measure import SHAPES, build_candidates, make_batches, profile_step, run_shape, shape_config
from suite.profiling.output import _median, command_line, header, missed_targets, table, write_json

COMMAND = "bench"
# The shapes are the CUDA defaults; a 2-core CPU needs minutes per BERT-base step at batch 32 x 512.
CUDA_DEFAULTS = {"shapes": "bert-base,minilm", "seq_len": "128,512", "batch_size": 32, "reps": 10}
CPU_DEFAULTS = {"shapes": "minilm", "seq_len": "128", "batch_size": 8, "reps": 5}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="training-step time and peak memory of each method vs vanilla attention",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--methods", help="comma list of names, wildcards or 'all' (default all; with --loop: vanilla)")
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
                   help="auto: bf16 autocast where the device computes it natively (a GPU of compute capability "
                        "8.0+, a CPU with AVX512-BF16 or AMX), else fp32")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="M.KEY=V",
                   help="a method's hyper-parameter (as in `run`)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory pass")
    p.add_argument("--profile", nargs="?", const="missed", metavar="METHODS",
                   help="profile one step of each method that misses its target (or of the given comma list) "
                        "with torch.profiler and add its top operators to the output")
    p.add_argument("--threads", type=int,
                   help="CPU threads for torch (default: as a run's: $OMP_NUM_THREADS, else every core; idle "
                        "threads sleep unless OMP_WAIT_POLICY says otherwise); 1 is steadier on a busy machine")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights (default 0)")
    p.add_argument("--out", help="also write the markdown to this file")
    p.add_argument("--json", metavar="FILE", help="also write the measurements as JSON (`suite report --costs` "
                                                  "reads it for the leaderboard's cost columns)")
    loop = p.add_argument_group("--loop: the real training loop on a GLUE task (suite.profiling.loop)")
    loop.add_argument("--loop", action="store_true",
                      help="profile the run's own loop instead of one isolated step: host syncs per step, batch "
                           "shapes per epoch, dispatched operators per step, steps/s, tokens/s and (CUDA, bf16) MFU")
    loop.add_argument("--tasks", default="sst2", help="comma list of GLUE tasks whose training rows are used "
                                                      "(default sst2)")
    loop.add_argument("--model", default="minilm", help="minilm (default), bert-base (random-init BERT-base: no "
                                                         "download) or a model path / hub id")
    loop.add_argument("--steps", type=int, default=200, help="batches per epoch (default 200)")
    loop.add_argument("--data-dir", help="folder of GLUE TSVs (default: $SUITE_DATA_DIR, else the hub)")
    loop.add_argument("--pad-to", default="auto", choices=["auto", "buckets", "longest"],
                      help="train.pad_to (default auto: buckets on a GPU, longest on the CPU)")
    loop.add_argument("--capture", default="auto",
                      help="train.capture, or a comma list to compare side by side in one run (auto,off): auto "
                           "replays the standard step from CUDA graphs where it can (the table says why not)")
    loop.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for a GPU the table lacks")


# ---------------------------------------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------------------------------------

def _ints(text: str, what: str) -> list[int]:

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--{what}: expected a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise BadInput(f"--{what}: values must be >= 1, got {text!r}")
    return values


def _methods(args) -> list[tuple[str, Any]]:
    from suite.api.attention import METHODS
    from suite.grid.plan import parse_assignment

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


def main(args) -> int:
    from suite.run.device import autocast_dtype, pick_device, torch_threads

    device = pick_device(args.device)
    if args.threads is not None and args.threads < 1:
        raise BadInput("--threads must be >= 1")
    args.threads = args.threads or torch_threads()  # the rule a single run follows (docs/cost.md)
    torch.set_num_threads(args.threads)
    if args.loop:
        return loop_main(args, device)
    shapes, seq_lens, note = _resolved_options(args, device)
    amp_dtype = autocast_dtype(args.precision, device)
    methods = _methods(args)
    sections = ["## Attention methods: training-step time and memory", "",
                f"Command (effective settings): `{command_line(args, shapes, seq_lens)}`"]
    configs = {shape: shape_config(shape) for shape in shapes}
    for shape, cfg in configs.items():
        if max(seq_lens) > cfg.max_position_embeddings:
            raise BadInput(f"--seq-len {max(seq_lens)} exceeds {shape}'s {cfg.max_position_embeddings} positions")
    measured: list[dict] = []
    for shape, cfg in configs.items():
        lines, rows = _measure_shape(args, shape, cfg, methods, seq_lens, device, amp_dtype, note)
        sections, measured = sections + lines, measured + rows
    text = "\n".join(sections) + "\n"
    print(text)
    if args.json:
        write_json(args.json, measured, device, amp_dtype, command_line(args, shapes, seq_lens))
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        _log(f"wrote {args.out}")
    return 0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _resolved_options(args, device) -> tuple[list[str], list[int], str]:
    """(shapes, sequence lengths, a note on the CPU defaults used): the device's defaults for what the flags left
    out (filled into `args`), each checked."""
    args.methods = args.methods or "all"
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
    return shapes, seq_lens, note


def _measure_shape(args, shape: str, cfg, methods, seq_lens: list[int], device, amp_dtype, note: str
                   ) -> tuple[list[str], list[dict]]:
    """Every method's step on one model shape at each sequence length: (the report's lines, the JSON rows)."""
    torch.manual_seed(args.seed)
    _log(f"{shape}: building {len(methods) + 2} candidates on {device}")
    # fresh method objects per shape: prepare() and any training state belong to one model
    fresh = [(n, type(m)(copy.deepcopy(m.cfg))) for n, m in methods]
    cands = build_candidates(cfg, fresh, device, amp_dtype)
    lines, rows = [], []
    for seq in seq_lens:
        _log(f"{shape} batch {args.batch_size} x {seq}")
        b1, b2 = make_batches(cfg, args.batch_size, seq, args.padding, device, args.seed)
        run_shape(cands, b1, b2, device, args.warmup, args.reps, not args.no_memory, _log)
        lines += ["", header(device, amp_dtype, shape, cfg, args.batch_size, seq, args, note), "", table(cands)]
        rows += [{"shape": shape, "seq_len": seq, "batch_size": args.batch_size, "method": c.name,
                  "step_ms": 1000 * _median(c) if _median(c) is not None else None,
                  "peak_mb": c.peak_mb, "error": c.error} for c in cands]
        if args.profile:
            chosen = (missed_targets(cands) if args.profile == "missed" else
                      [c for c in cands if c.name in set(args.profile.split(",")) and c.error is None])
            for c in chosen:
                _log(f"  profiling {c.name}")
                lines += ["", f"Where the time of one `{c.name}` step goes ({shape}, batch {args.batch_size} "
                              f"x {seq}; profiled step, so absolute times are inflated):", "",
                          profile_step(c, b1, b2, device)]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return lines, rows


def loop_main(args, device) -> int:
    """`bench --loop`: each task x method profiled through the real loop; a table, and JSON with --json."""
    import json
    from pathlib import Path

    from suite.api.attention import METHODS
    from suite.api.tasks import TASKS
    from suite.profiling.loop import LoopSpec, loop_table, profile_loop
    from suite.run.device import git_commit

    if args.steps < 1:
        raise BadInput("--steps must be >= 1")
    methods = METHODS.select(args.methods or "vanilla")
    tasks = TASKS.select(args.tasks)
    batch_size = args.batch_size or (32 if device.type == "cuda" else 16)
    captures = [c.strip() for c in args.capture.split(",") if c.strip()]
    if not captures or set(captures) - {"auto", "off"}:
        raise BadInput(f"--capture {args.capture!r}: give auto, off or both (auto,off)")
    rows = []
    for task in tasks:
        for method in methods:
            for capture in captures:
                print(f"{task} / {method} / capture {capture}: {args.steps} steps counted, then {args.steps} "
                      "timed", file=sys.stderr, flush=True)
                spec = LoopSpec(task=task, method=method, model=args.model, steps=args.steps,
                                batch_size=batch_size, precision=args.precision, pad_to=args.pad_to,
                                peak_tflops=args.peak_tflops, capture=capture)
                rows.append(profile_loop(spec, args.data_dir, device))
    command = "python -m suite bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:])
    text = "\n".join(["## The training loop, profiled", "", f"Command: `{command}`", "",
                      f"Device: {rows[0]['device']}; batch {batch_size}; {args.steps} steps per epoch", "",
                      loop_table(rows)]) + "\n"
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"command": command, "code": git_commit(), "rows": rows},
                                              indent=1) + "\n")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0
