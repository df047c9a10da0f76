"""Cost columns: from `python -m suite bench --json FILE` (time and memory measured interleaved, for that purpose).

In-run step times are shown only as context, labelled as such (`suite.report.leaderboard.in_run_costs`): they carry
the machine's load. CPU process RSS is never shown as a method's memory cost (it is a process-wide peak that also
covers earlier runs in the process).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from suite.api.errors import ReportError
from suite.report.vocabulary import DASH, fmt, slug, unique

__all__ = ["BenchCosts", "CostColumns", "GPU_MEMORY_KINDS", "cost_columns", "geometric_mean", "read_bench"]

GPU_MEMORY_KINDS = ("cuda_max_allocated",)    # in-run peaks that are one run's own


def geometric_mean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return float(np.exp(np.mean(np.log(xs)))) if xs else math.nan


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


@dataclasses.dataclass(frozen=True)
class CostColumns:
    """The leaderboard's cost columns: headers, each method's cells, and the note saying where they come from."""
    headers: list[str]
    cells: dict[str, list[str]]
    note: str


def cost_columns(bench: BenchCosts | None, costs_path: str | None, base: str, methods: list[str],
                 model: str) -> CostColumns:
    """The cost columns of one model's leaderboard, relative to the reference method `base`."""
    shape = bench_shape(bench, model) if bench is not None else None
    if bench is None or shape is None:
        where = f" (found {costs_path}, but no shape matching `{model}`)" if bench is not None else ""
        return CostColumns([], {}, (f"Costs: no measurement for this model{where}; `python -m suite bench --json "
                                    "FILE` measures step time and memory interleaved and `--costs FILE` puts them "
                                    "here."))
    ratios = bench_ratios(bench, shape, base)
    cells = {m: [f"{fmt(ratios[m][0])}×" if m in ratios and math.isfinite(ratios[m][0]) else DASH,
                 f"{fmt(ratios[m][1])}×" if m in ratios and math.isfinite(ratios[m][1]) else DASH]
             for m in methods}
    settings = sorted({(int(r.seq_len), int(r.batch_size)) for r in bench.rows[bench.rows["shape"] == shape]
                      .itertuples()})
    note = (f"Costs relative to `{base}` from `python -m suite bench` ({Path(bench.path).name}): training-step "
            f"time (median of interleaved steps) and the step's peak memory, on {bench.device}, shape `{shape}`, "
            + ", ".join(f"batch {b} x {s}" for s, b in settings) + " (geometric mean over these settings)"
            + (f"; {bench.note}" if bench.note else "") + (f"; measured {bench.date}" if bench.date else "")
            + (f" with `{bench.command}`" if bench.command else "") + ".")
    return CostColumns([f"step time vs {base} (bench)", f"step memory vs {base} (bench)"], cells, note)
