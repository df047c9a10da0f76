"""A table cell: the per-seed values of one (method, task) and how they are shown; and the benchmark averages
of the leaderboard's cells."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from suite.report.formatting import DASH, SCALE, fmt
from suite.report.registry_info import task_benchmark, task_in_average
from suite.stats import collapse


@dataclasses.dataclass
class Cell:
    values: np.ndarray            # finite per-seed values, display scale, sorted
    failed: int = 0               # runs whose status is not ok
    no_score: int = 0             # ok runs without a finite value (e.g. a correlation of constant predictions)
    seeds: np.ndarray | None = None   # the seed of each value (same order), for pairing by seed

    @classmethod
    def of(cls, sub: pd.DataFrame, column: str = "score", scale: float = SCALE) -> "Cell":
        ok = sub[sub["status"] == "ok"]
        vals = ok[column].astype(float).to_numpy() * scale
        seeds = pd.to_numeric(ok["seed"], errors="coerce").to_numpy(dtype=float) if "seed" in ok else None
        finite = np.isfinite(vals)
        order = np.argsort(vals[finite], kind="mergesort")
        return cls(vals[finite][order], int((sub["status"] != "ok").sum()), int(len(vals) - finite.sum()),
                   seeds[finite][order] if seeds is not None else None)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.n else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.values, ddof=1)) if self.n > 1 else math.nan

    @property
    def empty(self) -> bool:
        return self.n == 0 and self.failed == 0 and self.no_score == 0

    def by_seed(self) -> dict[float, float]:
        return {} if self.seeds is None else dict(zip(self.seeds.tolist(), self.values.tolist()))

    def text(self, bold: bool = False, with_n: bool = True, mark: str = "", floor: float = math.nan,
             higher: bool = True) -> str:
        """mean ± std (n); where runs both collapsed (not above `floor`) and did not, the median and how many
        collapsed instead: a mean of two modes describes neither."""
        if self.empty:
            return DASH
        parts = []
        if self.n:
            body = f"{fmt(self.mean)} ± {fmt(self.std)}"
            if collapse.bimodal(self.values, floor, higher):
                down, _ = collapse.rate(self.values, floor, higher)
                body = f"median {fmt(float(np.median(self.values)))}, {down} of {self.n} collapsed"
            body = f"**{body}**" if bold else body
            parts.append(body + mark + (f" ({self.n})" if with_n else ""))
        if self.failed:
            parts.append(f"failed ({self.failed})")
        if self.no_score:
            parts.append(f"no score ({self.no_score})")
        return ", ".join(parts)


def geometric_mean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return float(np.exp(np.mean(np.log(xs)))) if xs else math.nan


@dataclasses.dataclass
class Average:
    """One benchmark's average column: the tasks it averages and each method's (mean, number of tasks)."""
    benchmark: str
    tasks: list[str]
    left_out: list[str]
    values: dict[str, tuple[float, int]]

    @property
    def header(self) -> str:
        return f"{self.benchmark} avg"

    def full(self, methods) -> list[str]:
        """Methods with results on every averaged task (only their averages are comparable)."""
        return [m for m in methods if self.values[m][1] == len(self.tasks) and self.tasks]


def averages(sel, cells: dict) -> list[Average]:
    out = []
    for bench in dict.fromkeys(task_benchmark(t) for t in sel.tasks if task_benchmark(t)):
        members = [t for t in sel.tasks if task_benchmark(t) == bench]
        tasks = [t for t in members if task_in_average(t)]
        values = {}
        for m in sel.methods:
            means = [cells[m, t].mean for t in tasks if cells[m, t].n]
            values[m] = (float(np.mean(means)) if means else math.nan, len(means))
        out.append(Average(bench, tasks, [t for t in members if t not in tasks], values))
    return out
