"""`python -m suite report DIR [MORE_RUN_DIRS...]`: run records -> `DIR/leaderboard.md` and `DIR/figures/*.png`.

Everything here is derived from the records alone, so the same records give the same report: rows, columns and
legends are sorted, floats have a fixed format, PNGs carry no software/date metadata, and the only line that changes
between two regenerations is the one starting with `Generated` (set SOURCE_DATE_EPOCH to pin that too).

How records become cells
  * A cell is one (model, task, method, hyper-parameters, training settings): the headline score
    (`record["final"]["score"]`, x100) of its `ok` runs as mean ± sample std (n seeds), plus the count of failed runs.
  * The leaderboard uses, per method, its default hyper-parameters (the method's `Config()`); a method run only with
    other settings shows the most-run one and says so. Per (model, task) it uses one set of training settings for
    every method: the one that the most methods ran (then most ok runs, then the latest finished run).
  * Other settings appear in the ablation tables (one per method whose records differ in a hyper-parameter or a
    training field within a task); runs in neither place are listed at the end. Nothing is silently dropped.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import re
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from tabulate import tabulate

from .registry import normalise
from .store import iter_records

COMMAND = "report"
DEFAULT_BASELINE = "vanilla"
DEFAULT_ALPHA = 0.05
# Left out of the GLUE average by the usual convention, with the reason printed under the table. A task spec may
# override this with an `in_average` attribute.
EXCLUDED_FROM_AVERAGE = {"wnli": "its dev set is adversarial: fine-tuned models rarely beat the majority class"}
SCALE = 100.0                  # scores are stored in [0, 1] (correlations in [-1, 1]) and shown x100
FIGURES = "figures"
FIGURE_PREFIXES = ("curves_", "attention_", "drop_rate_")  # stale figures with these prefixes are removed
DASH = "–"                     # a cell with no run at all
# Column/panel order of the attention statistics (others follow alphabetically); mass_* go to their own figure.
ATTENTION_ORDER = ("sparsity", "entropy", "null_rows", "attended_keys", "head_diversity",
                   "mass_cls", "mass_sep", "mass_punct")
PANELS_PER_ROW = 3
RECONSTRUCTION_NOTE = "reconstruction from the paper's description, not the authors' code; its numbers are not the paper's"


class ReportError(RuntimeError):
    """Nothing to report, or a bad argument; the message says what to give instead."""


# ---------------------------------------------------------------------------------------------------------
# Formatting helpers (fixed formats: the markdown must not depend on locale or float noise)
# ---------------------------------------------------------------------------------------------------------

def fmt(x: float | None, digits: int = 2, sign: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return DASH
    x = round(float(x), digits) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def cell_text(text: str) -> str:
    """Markdown table cells cannot hold a bare pipe or a newline."""
    return text.replace("|", "\\|").replace("\n", " ")


def value_text(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return json.dumps(v) if not isinstance(v, str) else v


def _sort_key(v: Any) -> tuple:
    if v is None:
        return (0, 0, "")
    if isinstance(v, bool):
        return (1, int(v), "")
    if isinstance(v, (int, float)):
        return (2, float(v), "")
    return (3, 0, json.dumps(v, sort_keys=True, default=str))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.rstrip("/").split("/")[-1]).strip("-") or "model"


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _key(d: dict) -> str:
    return json.dumps(d, sort_keys=True, default=str)


# ---------------------------------------------------------------------------------------------------------
# Methods and tasks: what the registries know (records of unknown methods/tasks still report)
# ---------------------------------------------------------------------------------------------------------

def method_class(name: str):
    from .attention import METHODS

    try:
        return METHODS.get(name)
    except Exception:  # noqa: BLE001  a method from an uninstalled plugin: report it without its metadata
        return None


def default_hparams(method: str) -> str | None:
    cls = method_class(method)
    if cls is None:
        return None
    try:
        return _key(dataclasses.asdict(cls.Config()))
    except Exception:  # noqa: BLE001
        return None


def reconstruction_note(method: str) -> str | None:
    """None, or why the method's numbers are not a published method's own (class attribute `reconstruction`)."""
    mark = getattr(method_class(method), "reconstruction", False)
    if not mark:
        return None
    return mark if isinstance(mark, str) else RECONSTRUCTION_NOTE


def task_spec(name: str):
    from .data import get_task

    try:
        return get_task(name)
    except Exception:  # noqa: BLE001
        return None


def task_display(name: str) -> str:
    spec = task_spec(name)
    return spec.display if spec is not None else name


def task_in_average(name: str) -> bool:
    spec = task_spec(name)
    explicit = getattr(spec, "in_average", None)
    if explicit is not None:
        return bool(explicit)
    return normalise(name) not in {normalise(t) for t in EXCLUDED_FROM_AVERAGE}


def higher_is_better(task: str) -> bool:
    return getattr(task_spec(task), "higher_is_better", True)


def task_order(names: Iterable[str]) -> list[str]:
    """Registered groups' order first (GLUE's usual column order), then other registered tasks, then unknown ones."""
    from .data import TASK_GROUPS, TASKS

    TASKS.load()
    rank: dict[str, int] = {}
    for members in TASK_GROUPS.values():
        for m in members:
            rank.setdefault(normalise(m), len(rank))
    return sorted(set(names), key=lambda n: (rank.get(normalise(n), len(rank)), n))


def metric_order(task: str, keys: Iterable[str]) -> list[str]:
    spec = task_spec(task)
    official = spec.metric_keys() if spec is not None else []
    keys = set(keys) - {"score"}
    return [k for k in official if k in keys] + sorted(keys - set(official))


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------

def run_folders(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, Path]]:
    """(output root, folder of records) for each path: an output folder with runs/, or a runs folder itself."""
    out = []
    for p in map(Path, paths):
        if (p / "runs").is_dir():
            out.append((p, p / "runs"))
        elif p.is_dir() and any(p.glob("*.json")):
            out.append((p.parent, p))
        else:
            raise ReportError(f"{p}: no run records (expected {p / 'runs'}/*.json, as written by "
                              f"`python -m suite run --out {p}`)")
    return out


def _flatten(rec: dict[str, Any]) -> dict[str, Any] | None:
    cfg = rec.get("config") or {}
    if not cfg.get("task") or not cfg.get("method"):
        return None
    train = dict(cfg.get("train") or {})
    train_all = {**train, "data_source": cfg.get("data_source")}
    hp = dict(cfg.get("hparams") or {})
    status = rec.get("status") or "unknown"
    final = rec.get("final") or {}
    timing = rec.get("timing") or {}
    params = rec.get("parameters") or {}
    history = rec.get("history") or []
    gap = _num(rec.get("generalisation_gap"))
    if math.isnan(gap) and history:
        last = history[-1]
        gap = _num((last.get("train_subset") or {}).get("score")) - _num((last.get("dev") or {}).get("score"))
    return {
        "model": str(cfg.get("model")), "task": str(cfg["task"]), "method": str(cfg["method"]),
        "hp": _key(hp), "hp_dict": hp, "train": _key(train_all), "train_dict": train_all,
        "seed": cfg.get("seed"), "status": status,
        "score": _num(final.get("score")) if status == "ok" else math.nan,
        "final": final if status == "ok" else {}, "best": rec.get("best") or {},
        "gap": gap if status == "ok" else math.nan,
        "step_s": _num(timing.get("step_s")), "peak_mb": _num(timing.get("peak_memory_mb")),
        "peak_kind": timing.get("peak_memory_kind"),
        "total_params": _num(params.get("total")), "extra": _num(params.get("extra")),
        "training_only": _num(params.get("training_only")),
        "history": history if status == "ok" else [], "attention": rec.get("attention") if status == "ok" else None,
        "method_record": rec.get("method_record") or {}, "env": rec.get("environment") or {},
        "data": rec.get("data") or {}, "started": rec.get("started") or "", "finished": rec.get("finished") or "",
        "label": rec.get("label") or f"{cfg['task']}/{cfg['method']}/seed{cfg.get('seed')}",
        "error": rec.get("error") or "", "hash": rec.get("hash") or rec.get("_path", ""),
        "file": Path(rec.get("_path", "")).name,
    }


@dataclasses.dataclass
class Loaded:
    frame: pd.DataFrame
    unreadable: list[str]          # record files that could not be parsed or lack a configuration
    duplicates: int                # records of the same job found more than once (the best one is kept)
    commands: list[str]


def load(paths: Sequence[str | os.PathLike]) -> Loaded:
    folders = run_folders(paths)
    rows, unreadable, commands = [], [], []
    for root, runs in folders:
        files = sorted(runs.glob("*.json"))
        parsed = set()
        for rec in iter_records(runs):
            parsed.add(Path(rec["_path"]).name)
            row = _flatten(rec)
            if row is None:
                unreadable.append(str(Path(rec["_path"]).name))
            else:
                rows.append(row)
        unreadable += [f.name for f in files if f.name not in parsed]
        cmd_file = root / "commands.txt"
        if cmd_file.is_file():
            for line in cmd_file.read_text().splitlines():
                if line.strip() and line.strip() not in commands:
                    commands.append(line.strip())
    if not rows:
        raise ReportError("no readable run records in " + ", ".join(str(r) for _, r in folders))
    frame = pd.DataFrame(rows)
    # The same job found twice (overlapping run folders): keep one, preferring an ok record, then the latest.
    frame["_ok"] = frame["status"] == "ok"
    frame = frame.sort_values(["hash", "_ok", "finished", "file"], kind="mergesort")
    before = len(frame)
    frame = frame.drop_duplicates("hash", keep="last").drop(columns="_ok")
    frame["_seed"] = pd.to_numeric(frame["seed"], errors="coerce")
    frame = frame.sort_values(["model", "task", "method", "hp", "train", "_seed", "file"], kind="mergesort")
    return Loaded(frame.drop(columns="_seed").reset_index(drop=True), sorted(unreadable), before - len(frame), commands)


# ---------------------------------------------------------------------------------------------------------
# Cells and the significance test
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Cell:
    values: np.ndarray            # finite per-seed values, display scale
    failed: int = 0               # runs whose status is not ok
    no_score: int = 0             # ok runs without a finite value (e.g. a correlation of constant predictions)

    @classmethod
    def of(cls, sub: pd.DataFrame, column: str = "score", scale: float = SCALE) -> "Cell":
        ok = sub[sub["status"] == "ok"]
        vals = ok[column].astype(float).to_numpy() * scale
        finite = np.sort(vals[np.isfinite(vals)])
        return cls(finite, int((sub["status"] != "ok").sum()), int(len(vals) - len(finite)))

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

    def text(self, bold: bool = False, with_n: bool = True) -> str:
        if self.empty:
            return DASH
        parts = []
        if self.n:
            body = f"{fmt(self.mean)} ± {fmt(self.std)}"
            body = f"**{body}**" if bold else body
            parts.append(body + (f" ({self.n})" if with_n else ""))
        if self.failed:
            parts.append(f"failed ({self.failed})")
        if self.no_score:
            parts.append(f"no score ({self.no_score})")
        return ", ".join(parts)


def welch_p(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sided Welch's t-test over seeds; None with fewer than 2 values on either side or an undefined test."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical seeds: scipy warns and returns nan (no mark)
        p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def delta_text(cell: Cell, base: Cell, alpha: float) -> tuple[str, float | None]:
    if not cell.n or not base.n:
        return DASH, None
    p = welch_p(cell.values, base.values)
    return fmt(cell.mean - base.mean, sign=True) + ("*" if p is not None and p < alpha else ""), p


def best_flags(cells: dict[str, Cell], higher: bool, eligible: Iterable[str] | None = None) -> set[str]:
    """Keys of the best cells (ties at the displayed precision all count as best)."""
    shown = {k: round(c.mean, 2) for k, c in cells.items() if c.n and (eligible is None or k in eligible)}
    if not shown:
        return set()
    best = max(shown.values()) if higher else min(shown.values())
    return {k for k, v in shown.items() if v == best}


def geometric_mean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return float(np.exp(np.mean(np.log(xs)))) if xs else math.nan


# ---------------------------------------------------------------------------------------------------------
# Which records the leaderboard uses
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Selection:
    model: str
    tasks: list[str]
    methods: list[str]
    train_by_task: dict[str, str]     # task -> training-settings key used in the leaderboard
    hp_by_method: dict[str, str]      # method -> hyper-parameter key used in the leaderboard
    hp_is_default: dict[str, bool]

    def board(self, df: pd.DataFrame) -> pd.DataFrame:
        """The model's records that the leaderboard uses."""
        keep = df.apply(lambda r: self.train_by_task.get(r["task"]) == r["train"]
                        and self.hp_by_method.get(r["method"]) == r["hp"], axis=1)
        return df[keep.astype(bool)] if len(df) else df


def select(df: pd.DataFrame, model: str, baseline: str) -> Selection:
    dm = df[df["model"] == model]
    tasks = task_order(dm["task"].unique())
    methods = sorted(dm["method"].unique(), key=lambda m: (m != baseline, m))
    hp_by_method, is_default = {}, {}
    for method in methods:
        sub = dm[dm["method"] == method]
        default = default_hparams(method)
        if default is not None and default in set(sub["hp"]):
            hp_by_method[method], is_default[method] = default, True
        else:
            counts = sub.assign(ok=sub["status"] == "ok").groupby("hp").agg(ok=("ok", "sum"), n=("ok", "size"))
            counts = counts.reset_index().sort_values(["ok", "n", "hp"], ascending=[False, False, True])
            hp_by_method[method], is_default[method] = counts["hp"].iloc[0], False
    train_by_task = {}
    for task in tasks:
        sub = dm[(dm["task"] == task) & (dm["hp"] == dm["method"].map(hp_by_method))]
        if not len(sub):  # this task only has other hyper-parameter settings: they are listed after the tables
            sub = dm[dm["task"] == task]
        stats = (sub.assign(ok=sub["status"] == "ok")
                 .groupby("train").agg(methods=("method", "nunique"), ok=("ok", "sum"), n=("ok", "size"),
                                       latest=("finished", "max")).reset_index())
        stats = stats.sort_values(["methods", "ok", "n", "latest", "train"],
                                  ascending=[False, False, False, False, True])
        train_by_task[task] = stats["train"].iloc[0]
    return Selection(model, tasks, methods, train_by_task, hp_by_method, is_default)


def setting_text(hp: dict, method: str) -> str:
    """The hyper-parameters that differ from the method's defaults (all of them for unknown methods)."""
    default = default_hparams(method)
    base = json.loads(default) if default else {}
    diff = {k: v for k, v in sorted(hp.items()) if base.get(k, object()) != v}
    return ", ".join(f"{k}={value_text(v)}" for k, v in diff.items())


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _colors(methods: Sequence[str]) -> dict[str, Any]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(methods)}


def _save(fig, path: Path) -> None:
    # No "Software" entry (matplotlib's version) and no date: identical data gives identical PNG bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    _pyplot().close(fig)


def _band(ax, x, mean, std, color, style="-", label=None):
    ax.plot(x, mean, style, color=color, label=label, linewidth=1.6, marker="o", markersize=3)
    if np.isfinite(std).any():
        s = np.nan_to_num(std)
        ax.fill_between(x, mean - s, mean + s, color=color, alpha=0.15, linewidth=0)


def plot_curves(board_task: pd.DataFrame, methods: list[str], colors: dict, title: str, path: Path) -> bool:
    """Train/dev loss and dev/train-subset headline metric per epoch; mean line and ±std band over seeds."""
    rows = []
    for _, r in board_task[board_task["status"] == "ok"].iterrows():
        for e in r["history"]:
            rows.append({"method": r["method"], "epoch": e.get("epoch"), "train_loss": _num(e.get("train_loss")),
                         "dev_loss": _num(e.get("dev_loss")),
                         "dev_score": _num((e.get("dev") or {}).get("score")) * SCALE,
                         "train_subset_score": _num((e.get("train_subset") or {}).get("score")) * SCALE})
    if not rows:
        return False
    curves = pd.DataFrame(rows).groupby(["method", "epoch"]).agg(["mean", "std"])
    plt = _pyplot()
    from matplotlib.lines import Line2D

    with plt.style.context("default"):
        fig, (ax_loss, ax_score) = plt.subplots(1, 2, figsize=(12, 4), layout="constrained")
        for m in methods:
            if m not in curves.index.get_level_values(0):
                continue
            c = curves.loc[m]
            x = c.index.to_numpy(dtype=float)
            _band(ax_loss, x, c[("train_loss", "mean")].to_numpy(), c[("train_loss", "std")].to_numpy(), colors[m])
            _band(ax_loss, x, c[("dev_loss", "mean")].to_numpy(), c[("dev_loss", "std")].to_numpy(), colors[m], "--")
            _band(ax_score, x, c[("dev_score", "mean")].to_numpy(), c[("dev_score", "std")].to_numpy(), colors[m],
                  label=m)
            _band(ax_score, x, c[("train_subset_score", "mean")].to_numpy(),
                  c[("train_subset_score", "std")].to_numpy(), colors[m], "--")
        ax_loss.set(xlabel="epoch", ylabel="loss", title="loss: train (solid), dev (dashed)")
        ax_score.set(xlabel="epoch", ylabel="headline metric x100",
                     title="metric: dev (solid), train subset (dashed)")
        for ax in (ax_loss, ax_score):
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        handles = [Line2D([], [], color=colors[m], label=m) for m in methods if m in curves.index.get_level_values(0)]
        fig.legend(handles=handles, loc="outside right center", frameon=False)
        fig.suptitle(title)
        _save(fig, path)
    return True


def _per_layer(records: pd.DataFrame, getter) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """method -> (mean, std) over records of a per-layer list; records of another depth are left out."""
    out = {}
    for m, sub in records.groupby("method", sort=True):
        arrays = [np.asarray([_num(v) for v in vals], dtype=float) for vals in map(getter, sub.to_dict("records"))
                  if isinstance(vals, list) and vals]
        if not arrays:
            continue
        depth = Counter(len(a) for a in arrays).most_common(1)[0][0]
        stack = np.stack([a for a in arrays if len(a) == depth])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # all-nan layers, single records
            out[m] = (np.nanmean(stack, axis=0), np.nanstd(stack, axis=0, ddof=1) if len(stack) > 1
                      else np.full(depth, np.nan))
    return out


def plot_layers(records: pd.DataFrame, stats: list[str], getter, methods: list[str], colors: dict, title: str,
                path: Path, ylabels: dict[str, str] | None = None) -> bool:
    panels = [(s, _per_layer(records, lambda r, s=s: getter(r, s))) for s in stats]
    panels = [(s, d) for s, d in panels if d]
    if not panels:
        return False
    plt = _pyplot()
    with plt.style.context("default"):
        ncols = min(len(panels), PANELS_PER_ROW)
        nrows = math.ceil(len(panels) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols + 1.8, 3.4 * nrows), squeeze=False,
                                 layout="constrained")
        axes = axes.ravel()
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        for ax, (stat, data) in zip(axes, panels):
            for m in methods:
                if m in data:
                    mean, std = data[m]
                    _band(ax, np.arange(len(mean)), mean, std, colors[m], label=m)
            ax.set(xlabel="layer", ylabel=(ylabels or {}).get(stat, stat), title=stat)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        seen = set(labels)
        for ax in axes[1:len(panels)]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in seen:
                    handles.append(h), labels.append(lab), seen.add(lab)
        fig.legend(handles, labels, loc="outside right center", frameon=False)
        fig.suptitle(title)
        _save(fig, path)
    return True


def plot_drop_rates(records: pd.DataFrame, tasks: list[str], title: str, path: Path) -> bool:
    """Final drop rate per layer per task (±std over seeds), and per epoch averaged over tasks and seeds."""
    final = _per_layer(records.assign(method=records["task"]),
                       lambda r: (r["method_record"] or {}).get("drop_rate_per_layer"))
    epochs: dict[int, list[list]] = {}
    for r in records.to_dict("records"):
        for e in r["history"]:
            rates = (e.get("method") or {}).get("drop_rate_per_layer")
            if isinstance(rates, list) and rates:
                epochs.setdefault(int(e.get("epoch", 0)), []).append(rates)
    if not final and not epochs:
        return False
    plt = _pyplot()
    with plt.style.context("default"):
        fig, (ax_f, ax_e) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
        colors = _colors(tasks)
        for t in tasks:
            if t in final:
                mean, std = final[t]
                _band(ax_f, np.arange(len(mean)), mean, std, colors[t], label=task_display(t))
        ax_f.set(xlabel="layer", ylabel="drop rate", title="last epoch, per task")
        if final:
            ax_f.legend(frameon=False, fontsize="small")
        cmap = plt.get_cmap("viridis")
        keys = sorted(epochs)
        for i, e in enumerate(keys):
            depth = Counter(len(a) for a in epochs[e]).most_common(1)[0][0]
            stack = np.asarray([[_num(v) for v in a] for a in epochs[e] if len(a) == depth], dtype=float)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax_e.plot(np.arange(depth), np.nanmean(stack, axis=0), color=cmap(i / max(len(keys) - 1, 1)),
                          label=f"epoch {e}")
        ax_e.set(xlabel="layer", ylabel="drop rate", title="per epoch (mean over tasks and seeds)")
        if keys:
            ax_e.legend(frameon=False, fontsize="small")
        for ax in (ax_f, ax_e):
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        _save(fig, path)
    return True


# ---------------------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------------------

def table(rows: list[list[str]], headers: list[str]) -> str:
    return tabulate([[cell_text(str(c)) for c in r] for r in rows], headers=[cell_text(h) for h in headers],
                    tablefmt="github", disable_numparse=True)


def _unique(values: Iterable[Any]) -> list[Any]:
    """Sorted distinct values, without None, "" and NaN (what pandas puts in cells a record lacks)."""
    return sorted({v for v in values if v not in (None, "") and not (isinstance(v, float) and math.isnan(v))},
                  key=_sort_key)


class Report:
    def __init__(self, loaded: Loaded, out: Path, baseline: str, alpha: float, date_line: str):
        self.df = loaded.frame
        self.loaded = loaded
        self.out = out
        self.fig_dir = out / FIGURES
        self.baseline = baseline
        self.alpha = alpha
        self.date_line = date_line
        self.lines: list[str] = []
        self.figures: list[Path] = []
        self.used_hashes: set[str] = set()      # records shown in the leaderboard or an ablation table
        self.notes: dict[str, str] = {}         # method -> reconstruction note

    # -- helpers -------------------------------------------------------------------------------------
    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, name: str) -> Path:
        self.fig_dir.mkdir(parents=True, exist_ok=True)
        return self.fig_dir / name

    def link(self, path: Path, alt: str) -> None:
        self.figures.append(path)
        self.add(f"![{alt}]({FIGURES}/{path.name})", "")

    def method_label(self, method: str, sel: Selection) -> str:
        label = method
        if reconstruction_note(method):
            self.notes[method] = reconstruction_note(method)
            label += " †"
        if not sel.hp_is_default[method]:
            text = setting_text(json.loads(sel.hp_by_method[method]), method)
            label += f" [{text}]" if text else ""
        return label

    # -- sections ------------------------------------------------------------------------------------
    def header(self) -> None:
        df = self.df
        ok = df[df["status"] == "ok"]
        self.add("# Leaderboard", "", self.date_line, "")
        models = []
        for m in _unique(df["model"]):
            totals = _unique(df.loc[(df["model"] == m), "total_params"].dropna().astype(int))
            size = (f"{totals[0]:,}" if len(totals) == 1 else f"{totals[0]:,}–{totals[-1]:,}") if totals else ""
            models.append(f"`{m}`" + (f" ({size} parameters{' by task head' if len(totals) > 1 else ''})"
                                      if totals else ""))
        sources = _unique(v.get("data_source") for v in df["train_dict"])
        seeds = _unique(df["seed"])
        counts = Counter(df["status"])
        self.add(f"- **Model{'s' if len(models) > 1 else ''}:** {', '.join(models)}",
                 f"- **Data:** GLUE tasks {', '.join(task_display(t) for t in task_order(df['task'].unique()))}; "
                 f"source: {', '.join(map(str, sources)) or 'unknown'} (local: GLUE TSVs; hub: nyu-mll/glue); "
                 "dev split as the test set; sizes in the setup tables",
                 f"- **Seeds:** {', '.join(map(str, seeds))} ({len(seeds)} distinct; "
                 f"{self.seeds_per_cell()} per leaderboard cell)",
                 f"- **Runs:** {len(df)} records: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                 + (f"; {len(self.loaded.unreadable)} unreadable record files skipped: "
                    + ", ".join(self.loaded.unreadable) if self.loaded.unreadable else "")
                 + (f"; {self.loaded.duplicates} duplicate records of the same job ignored"
                    if self.loaded.duplicates else ""))
        started, finished = _unique(df["started"]), _unique(df["finished"])
        if started and finished:
            self.add(f"- **Run dates:** {started[0]} to {finished[-1]}")
        machines = Counter()
        software = Counter()
        libs = Counter()
        for env in df["env"]:
            machines[(env.get("device", "?"), env.get("gpu") or "", env.get("platform", "?"),
                      str(env.get("cpu_threads", "?")))] += 1
            software[(str(env.get("suite", "?")), str(env.get("git_commit") or "unknown"))] += 1
            libs[(f"python {env.get('python', '?')}, torch {env.get('torch', '?')}, "
                  f"transformers {env.get('transformers', '?')}")] += 1
        for (device, gpu, plat, threads), n in sorted(machines.items()):
            self.add(f"- **Machine:** {device}{' (' + gpu + ')' if gpu else ''}, {plat}, {threads} CPU threads "
                     f"({n} run{'s' if n != 1 else ''})")
        for (version, commit), n in sorted(software.items()):
            self.add(f"- **Suite:** version {version}, git commit `{commit}` ({n} run{'s' if n != 1 else ''})")
        for text, n in sorted(libs.items()):
            self.add(f"- **Software:** {text} ({n} run{'s' if n != 1 else ''})")
        self.add(f"- **Reference:** `{self.baseline}`; significance: two-sided Welch's t-test over seeds, "
                 f"p < {self.alpha:g}, no correction for multiple comparisons", "")
        if self.loaded.commands:
            self.add("Commands that produced the runs:", "", "```", *self.loaded.commands, "```", "")
        else:
            self.add("Commands that produced the runs: not recorded (no commands.txt next to the runs).", "")
        if len(ok) == 0:
            self.add("**No run finished successfully.**", "")

    def seeds_per_cell(self) -> str:
        counts = []
        for model, sel in self.selections.items():
            board = sel.board(self.df[self.df["model"] == model])
            ok = board[(board["status"] == "ok") & board["score"].notna()]
            counts += ok.groupby(["method", "task"]).size().tolist()
        if not counts:
            return "none"
        return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"

    def model_section(self, model: str) -> None:
        df = self.df[self.df["model"] == model]
        sel = self.selections[model]
        board = sel.board(df)
        self.used_hashes.update(board["hash"])
        mslug = slug(model)
        self.add(f"## Model `{model}`", "")
        self.leaderboard(sel, board)
        self.setup(sel, board)
        self.per_task(sel, board)
        self.ablations(sel, df)
        self.overfitting(sel, board, mslug)
        self.attention(sel, board, mslug, model)

    def cells(self, sel: Selection, board: pd.DataFrame, column: str = "score", scale: float = SCALE):
        out = {}
        for m in sel.methods:
            for t in sel.tasks:
                out[m, t] = Cell.of(board[(board["method"] == m) & (board["task"] == t)], column, scale)
        return out

    def leaderboard(self, sel: Selection, board: pd.DataFrame) -> None:
        cells = self.cells(sel, board)
        avg_tasks = [t for t in sel.tasks if task_in_average(t)]
        left_out = [t for t in sel.tasks if not task_in_average(t)]
        averages: dict[str, tuple[float, int]] = {}
        for m in sel.methods:
            means = [cells[m, t].mean for t in avg_tasks if cells[m, t].n]
            averages[m] = (float(np.mean(means)) if means else math.nan, len(means))
        full = [m for m in sel.methods if averages[m][1] == len(avg_tasks) and avg_tasks]
        best_avg = best_flags({m: Cell(np.array([averages[m][0]])) for m in full}, True)
        best = {t: best_flags({m: cells[m, t] for m in sel.methods}, higher_is_better(t)) for t in sel.tasks}
        has_base = self.baseline in sel.methods
        cost = self.costs(sel, board) if has_base else {}

        headers = ["method", *[task_display(t) for t in sel.tasks], "GLUE avg"]
        if has_base:
            headers += [f"step time vs {self.baseline}", f"peak memory vs {self.baseline}"]
        headers += ["extra params", "training-only params"]
        rows = []
        for m in sel.methods:
            avg, k = averages[m]
            avg_txt = DASH if not k else fmt(avg)
            if k and m in best_avg:
                avg_txt = f"**{avg_txt}**"
            if k and k < len(avg_tasks):
                avg_txt += f" ({k} of {len(avg_tasks)})"
            row = [self.method_label(m, sel), *[cells[m, t].text(bold=m in best[t]) for t in sel.tasks], avg_txt]
            if has_base:
                row += list(cost.get(m, (DASH, DASH)))
            row += [self.param_text(board, m, "extra"), self.param_text(board, m, "training_only")]
            rows.append(row)
        self.add("### Leaderboard", "", table(rows, headers), "")
        combined = [f"{task_display(t)}: mean of {', '.join(keys)}" for t in sel.tasks
                    if len(keys := metric_order(t, {k for f in board.loc[board['task'] == t, 'final'] for k in f}))
                    > 1]
        notes = ["Cells: headline dev metric x100 at the last epoch (the task's official metric, or the mean of its "
                 "official metrics" + (f": {'; '.join(combined)}" if combined else "") + "), as mean ± sample std "
                 "(number of seeds); \"–\" in place of a std: a single seed; a \"–\" cell: no run; failed (k): runs "
                 "that failed; no score (k): finished runs without a finite score. Bold: the best mean per column."]
        avg_names = ", ".join(task_display(t) for t in avg_tasks) or "none"
        notes.append(f"GLUE avg: unweighted mean of the per-task means over {avg_names}"
                     + "".join(f"; {task_display(t)} left out of the average by the usual convention"
                               + (f" ({EXCLUDED_FROM_AVERAGE[normalise(t)]})" if normalise(t) in EXCLUDED_FROM_AVERAGE
                                  else "") for t in left_out)
                     + "; (k of N): the method has results for only k of those tasks, so its average is not "
                       "comparable (and not bolded).")
        if has_base:
            kinds = _unique(board["peak_kind"])
            notes.append(f"Costs relative to `{self.baseline}`: geometric mean over the tasks both ran of the ratio "
                         "of mean training time per optimizer step and of mean peak memory"
                         + (f" (peak memory measured as {', '.join(kinds)}"
                            + ("; on CPU that is the process's peak resident set, which also covers earlier runs "
                               "in the same process" if "process_max_rss" in kinds else "") + ")" if kinds else "")
                         + ". Step times are wall-clock inside each run, so they carry whatever else the machine "
                           "ran meanwhile (other runs of a `--workers` pool included); `python -m suite bench` "
                           "measures the methods interleaved in one process. " + self.baseline_costs(board))
        notes.append("Extra params: parameters the method adds to the model (saved with it); training-only params: "
                     "parameters used only while training (e.g. a generator network).")
        swept = [m for m in sel.methods if df_has_variation(self.df, sel.model, m)]
        for m in sel.methods:
            if not sel.hp_is_default[m]:
                text = setting_text(json.loads(sel.hp_by_method[m]), m) or "(as recorded)"
                notes.append(f"`{m}`: no runs with its default hyper-parameters; the row shows {text}.")
        if swept:
            notes.append("Methods with several settings (see the ablation tables): "
                         + ", ".join(f"`{m}`" for m in swept)
                         + "; the leaderboard uses their default hyper-parameters where present.")
        methods_with_notes = [m for m in sel.methods if reconstruction_note(m)]
        for m in methods_with_notes:
            notes.append(f"† `{m}`: {reconstruction_note(m)}.")
        self.add(*[f"- {n}" for n in notes], "")

        if not has_base:
            self.add(f"No `{self.baseline}` runs for this model: no differences or relative costs "
                     f"(choose another reference with --baseline).", "")
            return
        rows = []
        base_cells = {t: cells[self.baseline, t] for t in sel.tasks}
        for m in sel.methods:
            if m == self.baseline:
                continue
            row = [self.method_label(m, sel)]
            for t in sel.tasks:
                row.append(delta_text(cells[m, t], base_cells[t], self.alpha)[0])
            common = [t for t in avg_tasks if cells[m, t].n and base_cells[t].n]
            if common:
                d = np.mean([cells[m, t].mean for t in common]) - np.mean([base_cells[t].mean for t in common])
                row.append(fmt(d, sign=True) + (f" ({len(common)} of {len(avg_tasks)})"
                                                 if len(common) < len(avg_tasks) else ""))
            else:
                row.append(DASH)
            rows.append(row)
        if rows:
            self.add(f"### Difference to `{self.baseline}`", "",
                     table(rows, ["method", *[task_display(t) for t in sel.tasks], "GLUE avg"]), "",
                     f"- Mean difference in the headline metric x100. `*`: two-sided Welch's t-test over seeds, "
                     f"p < {self.alpha:g} (no correction for multiple comparisons; p-values in the per-task tables). "
                     "No mark with fewer than 2 seeds on either side. GLUE avg: difference of the averages over the "
                     "tasks both ran (no test).", "")

    def param_text(self, board: pd.DataFrame, method: str, column: str) -> str:
        vals = _unique(board.loc[(board["method"] == method) & (board["status"] == "ok"), column].dropna()
                       .astype(int))
        if not vals:
            return DASH
        return f"{vals[0]:,}" if len(vals) == 1 else f"{vals[0]:,}–{vals[-1]:,}"

    def costs(self, sel: Selection, board: pd.DataFrame) -> dict[str, tuple[str, str]]:
        ok = board[board["status"] == "ok"]
        means = ok.groupby(["method", "task"])[["step_s", "peak_mb"]].mean()
        out = {}
        for m in sel.methods:
            texts = []
            for col in ("step_s", "peak_mb"):
                ratios = []
                for t in sel.tasks:
                    if (m, t) in means.index and (self.baseline, t) in means.index:
                        ratios.append(means.loc[(m, t), col] / means.loc[(self.baseline, t), col])
                g = geometric_mean(ratios)
                texts.append(f"{fmt(g)}×" if math.isfinite(g) else DASH)
            out[m] = tuple(texts)
        return out

    def baseline_costs(self, board: pd.DataFrame) -> str:
        ok = board[(board["status"] == "ok") & (board["method"] == self.baseline)]
        if not len(ok):
            return f"`{self.baseline}` has no finished run."
        per_task = ok.groupby("task")[["step_s", "peak_mb"]].mean()
        parts = [f"{task_display(t)} {fmt(r['step_s'] * 1000, 1)} ms/step, {fmt(r['peak_mb'], 0)} MB"
                 for t, r in per_task.loc[task_order(per_task.index)].iterrows()]
        return f"`{self.baseline}` itself: " + "; ".join(parts) + "."

    def setup(self, sel: Selection, board: pd.DataFrame) -> None:
        trains = {t: json.loads(sel.train_by_task[t]) for t in sel.tasks}
        fields = sorted({k for d in trains.values() for k in d})
        common = {k: trains[sel.tasks[0]].get(k) for k in fields
                  if len({_key({"v": d.get(k)}) for d in trains.values()}) == 1}
        varying = [k for k in fields if k not in common]
        rows = []
        for t in sel.tasks:
            sub = board[(board["task"] == t) & (board["status"] == "ok")]
            data = sub["data"].iloc[0] if len(sub) else {}
            dev = data.get("dev") or {}
            dev_txt = ", ".join(f"{k or 'dev'} {v:,}" for k, v in sorted(dev.items())) if dev else DASH
            rows.append([task_display(t), f"{data['train']:,}" if "train" in data else DASH, dev_txt,
                         f"{data['train_subset']:,}" if "train_subset" in data else DASH,
                         *[value_text(trains[t].get(k)) for k in varying]])
        self.add("### Setup", "", "Training settings of the leaderboard runs: "
                 + ", ".join(f"{k}={value_text(v)}" for k, v in common.items()) + ".", "",
                 table(rows, ["task", "train examples", "dev examples", "train subset (gap)", *varying]), "")

    def per_task(self, sel: Selection, board: pd.DataFrame) -> None:
        self.add("### Per-task results", "",
                 "Every official metric x100 (mean ± std over seeds) for the leaderboard runs; best epoch: the "
                 "headline metric at the best epoch (for reference only: picking it uses the dev set); "
                 f"p: Welch's t-test of the headline metric against `{self.baseline}`.", "")
        for t in sel.tasks:
            bt = board[board["task"] == t]
            keys = metric_order(t, {k for f in bt["final"] for k in f})
            rows = []
            base = Cell.of(bt[bt["method"] == self.baseline])
            for m in sel.methods:
                sub = bt[bt["method"] == m]
                if not len(sub):
                    continue
                headline = Cell.of(sub)
                metric_cells = []
                for k in keys:
                    metric_cells.append(Cell.of(sub.assign(_m=[_num(f.get(k)) for f in sub["final"]]), "_m")
                                        .text(with_n=False))
                best = Cell.of(sub.assign(_b=[_num(b.get("score")) for b in sub["best"]]), "_b")
                d, p = delta_text(headline, base, self.alpha) if m != self.baseline else ("", None)
                rows.append([self.method_label(m, sel), *metric_cells, headline.text(with_n=False),
                             str(headline.n), str(headline.failed), best.text(with_n=False), d or DASH,
                             fmt(p, 4) if p is not None else DASH])
            if rows:
                self.add(f"#### {task_display(t)}", "",
                         table(rows, ["method", *keys, "headline", "seeds", "failed", "best epoch",
                                   f"Δ vs {self.baseline}", "p"]), "")

    def ablations(self, sel: Selection, df: pd.DataFrame) -> None:
        blocks = []
        for m in sel.methods:
            sub = df[df["method"] == m]
            keys = varying_keys(sub)
            if not keys:
                continue
            self.used_hashes.update(sub["hash"])
            tasks = [t for t in sel.tasks if t in set(sub["task"])]
            values = sub.apply(lambda r: tuple(_lookup(r, k) for k in keys), axis=1)
            sub = sub.assign(_row=values.map(lambda v: json.dumps(v, default=str)))
            row_values = {json.dumps(v, default=str): v for v in values}
            rows = []
            for rk in sorted(row_values, key=lambda k: tuple(_sort_key(v) for v in row_values[k])):
                rs = sub[sub["_row"] == rk]
                in_board = all(sel.train_by_task.get(r["task"]) == r["train"] and sel.hp_by_method[m] == r["hp"]
                               for _, r in rs.iterrows())
                rows.append([*[value_text(v) for v in row_values[rk]],
                             *[Cell.of(rs[rs["task"] == t]).text() for t in tasks], "✓" if in_board else ""])
            title = self.method_label(m, sel)
            blocks += [f"#### {title}", "",
                       table(rows, [k for k in keys] + [task_display(t) for t in tasks] + ["in leaderboard"]), ""]
        if blocks:
            self.add("### Ablations", "",
                     "Per method, every setting that differs within a task (hyper-parameters by name, training "
                     "settings as `train.*`): headline metric x100 as mean ± std (seeds). ✓: the setting the "
                     "leaderboard uses.", "", *blocks)

    def overfitting(self, sel: Selection, board: pd.DataFrame, mslug: str) -> None:
        cells = self.cells(sel, board, "gap")
        colors = _colors(sel.methods)
        self.add("### Overfitting", "",
                 "Generalisation gap at the last epoch: headline metric on a fixed train subset minus on dev, x100 "
                 "(mean ± std over seeds; larger: more overfitting).", "",
                 table([[self.method_label(m, sel), *[cells[m, t].text() for t in sel.tasks]]
                        for m in sel.methods], ["method", *[task_display(t) for t in sel.tasks]]), "")
        for t in sel.tasks:
            path = self.figure(f"curves_{mslug}_{slug(t)}.png")
            if plot_curves(board[board["task"] == t], sel.methods, colors, f"{task_display(t)}, {sel.model}", path):
                self.add(f"#### {task_display(t)}", "",
                         "Per epoch, mean over seeds with a ±std band: training loss (running mean over the epoch, "
                         "with dropout) and dev loss; headline metric on dev and on the fixed train subset.", "")
                self.link(path, f"{task_display(t)} training curves")

    def attention(self, sel: Selection, board: pd.DataFrame, mslug: str, model: str) -> None:
        ok = board[board["status"] == "ok"]
        with_stats = ok[ok["attention"].map(lambda a: isinstance(a, dict) and bool(a.get("per_layer")))]
        colors = _colors(sel.methods)
        blocks = []
        if len(with_stats):
            names = sorted({k for a in with_stats["attention"] for k in a["per_layer"]})
            ordered = [s for s in ATTENTION_ORDER if s in names] + [s for s in names if s not in ATTENTION_ORDER]
            shape = [s for s in ordered if not s.startswith("mass_")]
            mass = [s for s in ordered if s.startswith("mass_")]
            getter = lambda r, s: r["attention"]["per_layer"].get(s)  # noqa: E731
            rows = []
            for m in sel.methods:
                sub = with_stats[with_stats["method"] == m]
                if not len(sub):
                    continue
                row = [self.method_label(m, sel)]
                for s in shape + mass:
                    vals = np.asarray([_num((a.get("mean") or {}).get(s)) for a in sub["attention"]], dtype=float)
                    vals = vals[np.isfinite(vals)]
                    row.append(fmt(float(np.mean(vals)), 3) if len(vals) else DASH)
                rows.append(row + [str(len(sub))])
            blocks += ["Attention statistics of the fine-tuned models on dev batches (see `suite/stats.py`), mean "
                       "over layers, tasks and seeds:", "", table(rows, ["method", *shape, *mass, "runs"]), ""]
            path = self.figure(f"attention_{mslug}.png")
            if plot_layers(with_stats, shape, getter, sel.methods, colors, f"attention per layer, {model} "
                           "(mean over tasks and seeds, ±std)", path):
                self.figures.append(path)
                blocks += [f"![attention statistics per layer]({FIGURES}/{path.name})", ""]
            path = self.figure(f"attention_mass_{mslug}.png")
            if mass and plot_layers(with_stats, mass, getter, sel.methods, colors,
                                    f"attention mass per layer, {model} (mean over tasks and seeds, ±std)", path,
                                    {s: "share of attention" for s in mass}):
                self.figures.append(path)
                blocks += [f"![attention mass on special tokens and punctuation]({FIGURES}/{path.name})", ""]
        for m in sel.methods:
            sub = ok[ok["method"] == m]
            has = sub["method_record"].map(lambda r: isinstance(r.get("drop_rate_per_layer"), list)).any() or any(
                isinstance((e.get("method") or {}).get("drop_rate_per_layer"), list)
                for h in sub["history"] for e in h)
            if not has:
                continue
            path = self.figure(f"drop_rate_{mslug}_{slug(m)}.png")
            if plot_drop_rates(sub, sel.tasks, f"{m}: drop rate per layer, {model}", path):
                self.figures.append(path)
                blocks += [f"Drop rate per layer of `{m}`:", "", f"![{m} drop rate per layer]({FIGURES}/{path.name})",
                           ""]
        if blocks:
            self.add("### Attention", "", *blocks)

    def failures(self) -> None:
        failed = self.df[self.df["status"] != "ok"].sort_values(["model", "label", "file"])
        if len(failed):
            rows = [[r["label"], r["model"], r["status"], (r["error"].splitlines() or [""])[0][:200], r["file"]]
                    for _, r in failed.iterrows()]
            self.add("## Failed runs", "", table(rows, ["run", "model", "status", "error", "record"]), "")
        rest = self.df[~self.df["hash"].isin(self.used_hashes)]
        if len(rest):
            groups = rest.groupby(["model", "task", "method", "hp", "train"], sort=True)
            rows = []
            for (model, task, method, hp, train), sub in groups:
                sel_train = self.selections[model].train_by_task.get(task)
                diff = _dict_diff(json.loads(train), json.loads(sel_train) if sel_train else {})
                setting = ", ".join(filter(None, [setting_text(json.loads(hp), method), diff]))
                rows.append([model, task_display(task), method, setting or DASH, Cell.of(sub).text()])
            self.add("## Runs outside the leaderboard settings", "",
                     "Runs whose hyper-parameters or training settings differ from those the leaderboard uses for "
                     "their method and task, and that no ablation table shows:", "", table(rows, ["model", "task", "method", "setting", "headline x100"]), "")

    def build(self) -> str:
        self.selections = {m: select(self.df, m, self.baseline) for m in _unique(self.df["model"])}
        self.header()
        for model in _unique(self.df["model"]):
            self.model_section(model)
        self.failures()
        text = "\n".join(self.lines).rstrip("\n") + "\n"
        return re.sub(r"\n{3,}", "\n\n", text)


def _lookup(row, key: str):
    if key.startswith("train."):
        return row["train_dict"].get(key[len("train."):])
    return row["hp_dict"].get(key)


def varying_keys(sub: pd.DataFrame) -> list[str]:
    """Hyper-parameters (by name) and training fields (`train.*`) taking two or more values within one task."""
    keys: set[str] = set()
    for _, t in sub.groupby(["model", "task"]):
        for col, prefix in (("hp_dict", ""), ("train_dict", "train.")):
            names = {k for d in t[col] for k in d}
            for k in names:
                if len({_key({"v": d.get(k)}) for d in t[col]}) > 1:
                    keys.add(prefix + k)
    return sorted(keys, key=lambda k: (k.startswith("train."), k))


def df_has_variation(df: pd.DataFrame, model: str, method: str) -> bool:
    return bool(varying_keys(df[(df["model"] == model) & (df["method"] == method)]))


def _dict_diff(d: dict, ref: dict) -> str:
    return ", ".join(f"train.{k}={value_text(v)}" for k, v in sorted(d.items()) if ref.get(k, object()) != v)


def _date_line() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch and epoch.isdigit()
            else dt.datetime.now(dt.timezone.utc))
    return f"Generated {when:%Y-%m-%d %H:%M} UTC by `python -m suite report`."


def build_report(run_dirs: Sequence[str | os.PathLike], out: str | os.PathLike | None = None,
                 baseline: str = DEFAULT_BASELINE, alpha: float = DEFAULT_ALPHA) -> Path:
    """Read the records under each run folder and write `out/leaderboard.md` and `out/figures/*.png`.

    `out` defaults to the first folder. Returns the path of the markdown file.
    """
    if not run_dirs:
        raise ReportError("give at least one folder of runs")
    if not 0 < alpha < 1:
        raise ReportError(f"--alpha {alpha} is impossible: it must lie in (0, 1)")
    loaded = load(run_dirs)
    out_dir = Path(out) if out is not None else Path(run_dirs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(loaded, out_dir, baseline, alpha, _date_line())
    text = report.build()
    path = out_dir / "leaderboard.md"
    path.write_text(text)
    produced = {p.name for p in report.figures}
    if report.fig_dir.is_dir():
        for stale in sorted(report.fig_dir.glob("*.png")):
            if stale.name.startswith(FIGURE_PREFIXES) and stale.name not in produced:
                stale.unlink()  # a figure of a task or method no longer in the records
    return path


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, help="leaderboard markdown and figures from run records",
                       description="Reads DIR/runs/*.json (and the run folders after it) and writes "
                                   "DIR/leaderboard.md and DIR/figures/*.png.")
    p.add_argument("dir", help="output folder of `python -m suite run` (holds runs/)")
    p.add_argument("more", nargs="*", help="more run folders whose records join the report")
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help=f"reference method (default {DEFAULT_BASELINE})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance threshold of Welch's t-test (default {DEFAULT_ALPHA})")
    p.add_argument("--out", help="write the report here instead of DIR")


def main(args: argparse.Namespace) -> int:
    try:
        path = build_report([args.dir, *args.more], args.out, args.baseline, args.alpha)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0
