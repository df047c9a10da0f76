"""Sections under the leaderboard: setup, per-task metrics, ablations, failed runs and runs outside the tables."""
from __future__ import annotations

import json

import pandas as pd

from suite.report.cells import Cell
from suite.report.facts import ModelFacts
from suite.report.formatting import DASH, key_of, num, sort_key, table, value_text
from suite.report.leaderboard import difference_text
from suite.report.registry_info import metric_order, task_display
from suite.report.selection import Selection, lookup, setting_text, train_diff, varying_keys
from suite.report.tuned import setup_note


def setup(rep, sel: Selection, board: pd.DataFrame) -> None:
    trains = {t: json.loads(sel.train_by_task[t]) for t in sel.tasks}
    fields = sorted({k for d in trains.values() for k in d})
    common = {k: trains[sel.tasks[0]].get(k) for k in fields
              if len({key_of({"v": d.get(k)}) for d in trains.values()}) == 1}
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
    rep.add("### Setup", "", "Training settings of the leaderboard runs: "
            + ", ".join(f"{k}={value_text(v)}" for k, v in common.items()) + "." + setup_note(board), "",
            table(rows, ["task", "train examples", "dev examples", "train subset (gap)", *varying]), "")


def per_task_row(rep, facts: ModelFacts, sub: pd.DataFrame, keys: list[str], method: str) -> list[str]:
    headline = Cell.of(sub)
    metric_cells = [Cell.of(sub.assign(_m=[num(f.get(k)) for f in sub["final"]]), "_m").text(with_n=False)
                    for k in keys]
    best = Cell.of(sub.assign(_b=[num(b.get("score")) for b in sub["best"]]), "_b")
    c = facts.comparisons.get((method, sub["task"].iloc[0]))
    stats = [DASH] if c is None else [difference_text(c)]
    return [rep.method_label(method, facts.sel), *metric_cells, headline.text(with_n=False), str(headline.n),
            str(headline.failed), best.text(with_n=False), *stats]


def per_task(rep, facts: ModelFacts) -> None:
    sel, board = facts.sel, facts.board
    rep.add("### Per-task results", "",
            "Every official metric x100 (mean ± std over seeds) for the leaderboard runs; best epoch: the "
            "headline metric at the best epoch (for reference only: picking it uses the dev set); "
            f"Δ: the verdict and the mean paired difference to `{rep.baseline}` [95% interval over seeds and dev "
            "examples]; every statistic of each comparison is in the comparisons table above and in "
            "`comparisons.csv`.",
            "")
    for t in sel.tasks:
        bt = board[board["task"] == t]
        keys = metric_order(t, {k for f in bt["final"] for k in f})
        rows = [per_task_row(rep, facts, bt[bt["method"] == m], keys, m)
                for m in sel.methods if (bt["method"] == m).any()]
        if rows:
            rep.add(f"#### {task_display(t)}", "",
                    table(rows, ["method", *keys, "headline", "seeds", "failed", "best epoch",
                                 f"Δ vs {rep.baseline}"]), "")


def ablation_block(rep, sel: Selection, method: str, sub: pd.DataFrame, keys: list[str]) -> list[str]:
    tasks = [t for t in sel.tasks if t in set(sub["task"])]
    values = sub.apply(lambda r: tuple(lookup(r, k) for k in keys), axis=1)
    sub = sub.assign(_row=values.map(lambda v: json.dumps(v, default=str)))
    row_values = {json.dumps(v, default=str): v for v in values}
    rows = []
    for rk in sorted(row_values, key=lambda k: tuple(sort_key(v) for v in row_values[k])):
        rs = sub[sub["_row"] == rk]
        in_board = all(sel.train_by_task.get(r["task"]) == r["train"] and sel.hp_by_method[method] == r["hp"]
                       for _, r in rs.iterrows())
        rows.append([*[value_text(v) for v in row_values[rk]],
                     *[Cell.of(rs[rs["task"] == t]).text() for t in tasks], "✓" if in_board else ""])
    return [f"#### {rep.method_label(method, sel)}", "",
            table(rows, [*keys, *[task_display(t) for t in tasks], "in leaderboard"]), ""]


def ablations(rep, sel: Selection, df: pd.DataFrame) -> None:
    """`df`: the records the ablation tables draw from (`ModelFacts.ablation`: a curve's runs are left to it)."""
    blocks = []
    for m in sel.methods:
        sub = df[df["method"] == m]
        keys = varying_keys(sub)
        if keys:
            blocks += ablation_block(rep, sel, m, sub, keys)
    if blocks:
        rep.add("### Ablations", "",
                "Per method, every setting that differs within a task (hyper-parameters by name, training "
                "settings as `train.*`): headline metric x100 as mean ± std (seeds). ✓: the setting the "
                "leaderboard uses.", "", *blocks)


def skipped_records(rep) -> None:
    problems = rep.loaded.problems
    if problems:
        rep.add("## Skipped record files", "", "Files in the runs folders that are not valid run records (fix or "
                "remove them):", "", *[f"- {problems[name]}" for name in sorted(problems)], "")


def failures(rep) -> None:
    failed = rep.df[rep.df["status"] != "ok"].sort_values(["model", "label", "file"])
    if len(failed):
        rows = [[r["label"], r["model"], r["status"], (r["error"].splitlines() or [""])[0][:200], r["file"]]
                for _, r in failed.iterrows()]
        rep.add("## Failed runs", "", table(rows, ["run", "model", "status", "error", "record"]), "")
    shown = frozenset().union(*(f.shown for f in rep.facts.values()))
    rest = rep.df[~rep.df["hash"].isin(shown)]
    if len(rest):
        rows = []
        for (model, task, method, hp, train), sub in rest.groupby(["model", "task", "method", "hp", "train"]):
            sel_train = rep.facts[model].sel.train_by_task.get(task)
            diff = train_diff(json.loads(train), json.loads(sel_train) if sel_train else {})
            setting = ", ".join(filter(None, [setting_text(json.loads(hp), method), diff]))
            rows.append([model, task_display(task), method, setting or DASH, Cell.of(sub).text()])
        rep.add("## Runs outside the leaderboard settings", "",
                "Runs whose hyper-parameters or training settings differ from those the leaderboard uses for "
                "their method and task, and that no ablation table shows:", "",
                table(rows, ["model", "task", "method", "setting", "headline x100"]), "")
