"""The compact leaderboard `run` prints at the end of a grid: method x task, mean ± sample std over seeds (x100),
the majority-class baseline, and each method's difference to the reference method.

Rows are methods, named as the report names them (`suite.run.settings.setting_name`: the method and its non-default
hyper-parameters); when the grid varies a training setting (learning rate, model ...) within a task, the varying
values join the row name, so runs with different settings are never averaged together. The full report (every
metric, significance tests, figures) is `python -m suite report OUT`.
"""
from __future__ import annotations

import dataclasses
import math
import shlex
import statistics
from collections import defaultdict
from typing import Any, Iterable

from tabulate import tabulate

from suite.run.record import RunRecord
from suite.run.settings import setting_name, setting_value

# what the rest of the suite uses; other names are this module's own
__all__ = ["DASH", "compact_leaderboard", "grid_records"]

SCALE = 100.0
DASH = "–"
MAJORITY_ROW = "majority class"


def _setting(rec: RunRecord) -> dict[str, Any]:
    """Everything of a record's config that may differ between runs of a task, except the seed."""
    flat = {"model": rec.model, "data_source": rec.data_source}
    flat.update({f"train.{k}": v for k, v in rec.train.items()})
    return flat


def _varying(dicts: Iterable[dict[str, Any]]) -> list[str]:
    dicts = list(dicts)
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({repr(d.get(k)) for d in dicts}) > 1]


def _short(key: str, value: Any) -> str:
    name = key.removeprefix("train.")
    if key == "model" and isinstance(value, str):
        value = value.rstrip("/").split("/")[-1]
    return f"{name}={setting_value(value)}"


def _defaults(method: str) -> dict[str, Any] | None:
    """The method's default hyper-parameters; None when it is not installed here (its rows then name every value)."""
    from suite.api.attention import METHODS

    return dataclasses.asdict(METHODS.get(method).Config()) if method in METHODS else None


def _row_keys(records: list[RunRecord]) -> list[tuple[str, str, str]]:
    """Per record: (task, the method's setting name, the training settings that vary within its task)."""
    by_task: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in records:
        by_task[rec.task].append(rec)
    varying_settings = {t: _varying(_setting(r) for r in recs) for t, recs in by_task.items()}
    defaults = {m: _defaults(m) for m in {r.method for r in records}}
    keys = []
    for rec in records:
        settings = _setting(rec)
        tr = [_short(k, settings.get(k)) for k in varying_settings[rec.task]]
        keys.append((rec.task, setting_name(rec.method, rec.hparams, defaults[rec.method]), ",".join(tr)))
    return keys


def _task_display(task: str) -> str:
    try:
        from suite.api.tasks import get_task

        return get_task(task).display
    except Exception:  # noqa: BLE001  an unregistered task keeps its name
        return task


def _constant_score(rec: RunRecord) -> float | None:
    """The record's majority-class dev score (regression: the constant dev-mean predictor's), or None."""
    baseline = rec.baselines.recorded
    return None if baseline is None or math.isnan(baseline.constant) else baseline.constant


def _majority(records: list[RunRecord]) -> float | None:
    """The constant baseline's dev score (x100) the runner stored with the records of one task; None if none did."""
    values = sorted({round(s * SCALE, 6) for s in map(_constant_score, records) if s is not None})
    if not values:
        return None
    return statistics.fmean(values)  # one value unless the grid varies the dev subset


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else math.nan)


def _num(x: float) -> str:
    return DASH if x is None or not math.isfinite(x) else f"{round(x, 1) + 0.0:.1f}"


def _diff(x: float, ref: float | None) -> str:
    if ref is None or x is None or not (math.isfinite(x) and math.isfinite(ref)):
        return ""
    return f" ({round(x - ref, 1) + 0.0:+.1f})"


def compact_leaderboard(records: list[RunRecord], baseline: str = "vanilla", out: str | None = None) -> str:
    """A plain-text table: one row per method (and varying setting), one column per task (in the grid's order);
    a cell is `mean ± std` of the final dev headline score x100 over the `ok` seeds, then in brackets its
    difference to `baseline` with the same training settings; `n/m ok` marks cells with failed seeds. The last
    row is the majority-class baseline of each task's dev set. `out`: the run folder named in the closing hint."""
    if not records:
        return "no run records to summarise"
    keys = _row_keys(records)
    tasks = list(dict.fromkeys(k[0] for k in keys))
    cells: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for rec, key in zip(records, keys):
        counts[key] += 1
        if rec.ok and math.isfinite(rec.final.score):
            cells[key].append(rec.final.score * SCALE)
    rows_named = list(dict.fromkeys((k[1], k[2]) for k in keys))
    rows_named.sort(key=lambda r: (r[1], r[0].split("[")[0] != baseline, r[0]))
    table = []
    for method, settings in rows_named:
        line = [method + (f" {{{settings}}}" if settings else "")]
        for task in tasks:
            key = (task, method, settings)
            if not counts.get(key):
                line.append(DASH)
                continue
            values = cells.get(key, [])
            ref = cells.get((task, baseline, settings))
            ref_mean = _mean_std(ref)[0] if ref and method != baseline else None
            mean, std = _mean_std(values) if values else (math.nan, math.nan)
            text = _num(mean) + ("" if len(values) < 2 else f" ± {_num(std)}") + _diff(mean, ref_mean)
            if len(values) < counts[key]:
                text += f" {len(values)}/{counts[key]} ok"
            line.append(text)
        table.append(line)
    majority_line, warnings = [MAJORITY_ROW], []
    for task in tasks:
        maj = _majority([r for r, k in zip(records, keys) if k[0] == task])
        ref = [(k[2], v) for k, v in cells.items() if k[0] == task and k[1] == baseline]
        ref_mean = _mean_std(ref[0][1])[0] if len(ref) == 1 else None
        majority_line.append(DASH if maj is None else _num(maj) + _diff(maj, ref_mean))
        warnings += [_at_majority(baseline, task, settings, _mean_std(v)[0], maj) for settings, v in ref]
    table.append(majority_line)
    headers = ["method"] + [_task_display(t) for t in tasks]
    where = shlex.quote(str(out)) if out is not None else "OUT"
    return ("Dev score x100, mean ± std over seeds (difference to " + baseline + "):\n"
            + tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)
            + f"\n{MAJORITY_ROW}: always the dev set's most frequent class (regression: its mean label)"
            + "".join(f"\n{w}" for w in warnings if w)
            + f"\nFull report with every metric, significance tests and figures: python -m suite report {where}")


def _at_majority(baseline: str, task: str, settings: str, mean: float, majority: float | None) -> str:
    """A warning when the reference's mean is not above the majority class by the collapse margin: the differences
    to it are then differences to a predictor that learned nothing."""
    from suite.api.tasks import get_task
    from suite.stats.collapse import DEFAULT_MARGIN, collapsed, floor

    if majority is None or not math.isfinite(mean):
        return ""
    higher = get_task(task).higher_is_better
    if not collapsed([mean], floor(majority, DEFAULT_MARGIN, higher), higher)[0]:
        return ""
    where = _task_display(task) + (f" {{{settings}}}" if settings else "")
    return (f"warning: the reference {baseline} scores at the majority class on {where} ({_num(mean)} vs "
            f"{_num(majority)}, within {DEFAULT_MARGIN:g} point): it learned nothing there, so every difference to "
            "it is one to a constant predictor; train longer (--epochs) or on more examples (--max-train-samples)")


def grid_records(jobs: Iterable[Any], store: Any) -> list[RunRecord]:
    """The stored records of a grid's jobs (run now or found from an earlier run), in the grid's order."""
    return [rec for rec in (store.read(job.filename) for job in jobs) if rec is not None]
