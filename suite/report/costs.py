"""Cost columns: from `python -m suite bench --json FILE` (time and memory measured interleaved, for that purpose).

In-run step times are shown only as context, labelled as such: they carry the machine's load. CPU process RSS is
never shown as a method's memory cost (it is a process-wide peak that also covers earlier runs in the process).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd

from suite.api.errors import ReportError
from suite.report.cells import geometric_mean
from suite.report.formatting import DASH, fmt, slug, table, unique
from suite.report.registry_info import task_display, task_order

GPU_MEMORY_KINDS = ("cuda_max_allocated",)    # in-run peaks that are one run's own


@dataclasses.dataclass
class BenchCosts:
    path: str
    device: str
    note: str                                  # the bench's own description of where and how it measured
    rows: pd.DataFrame                         # shape, seq_len, batch_size, method, step_ms, peak_mb
    command: str = ""
    date: str = ""


def read_bench(path: str | Path | None) -> BenchCosts | None:
    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text())
        rows = pd.DataFrame(data["rows"])
        rows = rows[[c for c in ("shape", "seq_len", "batch_size", "method", "step_ms", "peak_mb") if c in rows]]
        return BenchCosts(str(path), str(data.get("device") or "unknown device"), str(data.get("note") or ""), rows,
                          str(data.get("command") or ""), str(data.get("date") or ""))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{path}: not a bench result written by `python -m suite bench --json` ({exc})") from None


def bench_shape(bench: BenchCosts, model: str) -> str | None:
    """The bench shape that stands for `model`: the same name, else the only one measured, else none."""
    shapes = unique(bench.rows["shape"])
    name = slug(model).lower()
    for s in shapes:
        if s.lower() == name or s.lower() in name:
            return s
    return shapes[0] if len(shapes) == 1 else None


def bench_ratios(bench: BenchCosts, shape: str, base: str) -> dict[str, tuple[float, float]]:
    """method -> (step time, peak memory) relative to `base`, geometric mean over the measured settings."""
    rows = bench.rows[bench.rows["shape"] == shape]
    out: dict[str, tuple[list, list]] = {}
    for _, setting in rows.groupby(["seq_len", "batch_size"]):
        ref = setting[setting["method"] == base]
        if not len(ref):
            continue
        for _, r in setting.iterrows():
            t, m = out.setdefault(r["method"], ([], []))
            t.append(r["step_ms"] / ref["step_ms"].iloc[0])
            m.append(r["peak_mb"] / ref["peak_mb"].iloc[0] if "peak_mb" in r else math.nan)
    return {k: (geometric_mean(t), geometric_mean(m)) for k, (t, m) in out.items()}


def cost_columns(rep, sel, model: str) -> tuple[list[str], dict[str, list[str]], str]:
    """(headers, {method: cells}, note) of the leaderboard's cost columns."""
    bench, base = rep.bench, rep.baseline
    shape = bench_shape(bench, model) if bench is not None else None
    if bench is None or shape is None:
        where = f" (found {rep.costs_path}, but no shape matching `{model}`)" if bench is not None else ""
        return [], {}, (f"Costs: no measurement for this model{where}; `python -m suite bench --json FILE` "
                        "measures step time and memory interleaved and `--costs FILE` puts them here.")
    ratios = bench_ratios(bench, shape, base)
    cells = {m: [f"{fmt(ratios[m][0])}×" if m in ratios and math.isfinite(ratios[m][0]) else DASH,
                 f"{fmt(ratios[m][1])}×" if m in ratios and math.isfinite(ratios[m][1]) else DASH]
             for m in sel.methods}
    settings = sorted({(int(r.seq_len), int(r.batch_size)) for r in bench.rows[bench.rows["shape"] == shape]
                      .itertuples()})
    note = (f"Costs relative to `{base}` from `python -m suite bench` ({Path(bench.path).name}): training-step "
            f"time (median of interleaved steps) and the step's peak memory, on {bench.device}, shape `{shape}`, "
            + ", ".join(f"batch {b} x {s}" for s, b in settings) + " (geometric mean over these settings)"
            + (f"; {bench.note}" if bench.note else "") + (f"; measured {bench.date}" if bench.date else "")
            + (f" with `{bench.command}`" if bench.command else "") + ".")
    return [f"step time vs {base} (bench)", f"step memory vs {base} (bench)"], cells, note


def in_run_context(rep, sel, board: pd.DataFrame) -> list[str]:
    """A labelled context table of in-run step times (and GPU peaks, never CPU RSS) relative to the reference."""
    ok = board[board["status"] == "ok"]
    base = rep.baseline
    if not (ok["method"] == base).any():
        return []
    gpu = ok["peak_kind"].isin(GPU_MEMORY_KINDS).all() and ok["peak_mb"].notna().any()
    means = ok.groupby(["method", "task"])[["step_s", "peak_mb"]].mean()
    rows = []
    for m in sel.methods:
        row = [rep.method_label(m, sel)]
        for col in ("step_s", "peak_mb") if gpu else ("step_s",):
            ratios = [means.loc[(m, t), col] / means.loc[(base, t), col] for t in sel.tasks
                      if (m, t) in means.index and (base, t) in means.index]
            g = geometric_mean(ratios)
            row.append(f"{fmt(g)}×" if math.isfinite(g) else DASH)
        rows.append(row)
    per_task = ok[ok["method"] == base].groupby("task")["step_s"].mean()
    own = "; ".join(f"{task_display(t)} {fmt(per_task[t] * 1000, 1)} ms/step" for t in task_order(per_task.index))
    headers = ["method", f"in-run step time vs {base}"] + ([f"in-run GPU peak vs {base}"] if gpu else [])
    return ["#### In-run step times (context, not a cost measurement)", "",
            table(rows, headers), "",
            f"- Wall-clock time per optimizer step inside each run, geometric mean over tasks of the ratio to "
            f"`{base}` ({own}). These carry whatever else the machine ran meanwhile (other runs of a `--workers` "
            "pool included)" + ("" if gpu else "; in-run memory is not shown: on CPU the runs recorded the "
                                           "process's peak resident set, which is not one method's cost") + ".",
            ""]
