"""What a bench run prints and saves: the table against SDPA/eager, targets, the header, the command, JSON."""
from __future__ import annotations

import datetime
import statistics

import torch

from suite.profiling.measure import EAGER, SDPA, Candidate
from suite.run.device import machine

# what the rest of the suite uses; other names are this module's own
__all__ = ["command_line", "header", "missed_targets", "table", "write_json"]


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
    if c.target is None:
        return "-"
    if t is None or not t_eager:
        return f"<= {c.target}"
    return f"<= {c.target} {'met' if t / t_eager <= c.target else 'MISSED'}"


def missed_targets(cands: list[Candidate]) -> list[Candidate]:
    by = {c.name: c for c in cands}
    t_eager = _median(by[EAGER])
    return [c for c in cands if c.target is not None and _median(c) is not None and t_eager
            and _median(c) / t_eager > c.target]


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


def header(device, amp_dtype, shape: str, cfg, batch: int, seq: int, args, defaults_note: str) -> str:
    import transformers

    from suite.run.device import precision_label

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

def command_line(args, shapes: list[str], seq_lens: list[int]) -> str:
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


def write_json(path: str, rows: list[dict], device, amp_dtype, command_line: str) -> None:
    """The measurements as JSON: one row per (shape, sequence length, candidate), with the device and settings."""
    import json
    from pathlib import Path

    from suite.run.device import precision_label

    doc = {"device": machine(device), "precision": precision_label(amp_dtype), "command": command_line,
           "date": datetime.date.today().isoformat(),
           "note": f"{precision_label(amp_dtype)}; median of interleaved steps; peak: the step's own memory",
           "rows": rows}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
