"""Sections under the leaderboard: setup, per-task metrics, ablations, failed runs and runs outside the tables."""
from __future__ import annotations

import json

import pandas as pd

from suite.report.comparisons import difference_text
from suite.report.facts import Cell, ModelFacts, Options, ReportFacts
from suite.report.load import Col
from suite.report.selection import Selection, lookup, setting_text, setup_note, train_diff, varying_keys
from suite.report.vocabulary import DASH, Part, key_of, metric_order, sort_key, table, task_display, value_text
from suite.run.record_parts import DataSizes

__all__ = ["ablations", "failures", "per_task", "setup", "skipped_records"]


def setup(facts: ModelFacts, options: Options) -> Part:
    sel, board, part = facts.sel, facts.board, Part()
    sizes = {t: _data_sizes(board, t) for t in sel.tasks}
    trains = {t: _effective(sel.train_by_task[t].values, sizes[t]) for t in sel.tasks}
    fields = sorted({k for d in trains.values() for k in d})
    common = {k: trains[sel.tasks[0]].get(k) for k in fields
              if len({key_of({"v": d.get(k)}) for d in trains.values()}) == 1}
    varying = [k for k in fields if k not in common]
    rows = []
    for t in sel.tasks:
        data = sizes[t]
        dev_txt = ", ".join(f"{k or 'dev'} {v:,}" for k, v in sorted(data.dev.items())) if data.dev else DASH
        if data.heldout is not None:  # train.test_holdout: the split the runs are scored on
            dev_txt += f"; held-out test {data.heldout:,} (scored)"
        rows.append([task_display(t), f"{data.train:,}" if data.train is not None else DASH, dev_txt,
                     f"{data.train_subset:,}" if data.train_subset is not None else DASH,
                     *[value_text(trains[t].get(k)) for k in varying]])
    part.add("### Setup", "", "Training settings of the leaderboard runs: "
             + ", ".join(f"{k}={value_text(v)}" for k, v in common.items()) + "." + setup_note(board), "",
             table(rows, ["task", "train examples", "dev examples", "train subset (gap)", *varying]), "")
    return part


def _data_sizes(board: pd.DataFrame, task: str) -> DataSizes:
    sub = board[(board[Col.TASK] == task) & (board[Col.STATUS] == "ok")]
    return sub[Col.DATA].iloc[0] if len(sub) else DataSizes()


def _effective(train: dict, data: DataSizes) -> dict:
    """The settings as the runs had them: the train subset is drawn from the training set, so it holds at most as
    many examples as that set (train_eval_samples=512 on 128 training examples evaluates 128)."""
    asked = train.get("train_eval_samples")
    if isinstance(asked, int) and data.train is not None and asked > data.train:
        return {**train, "train_eval_samples": data.train}
    return train


def _per_task_row(facts: ModelFacts, sub: pd.DataFrame, keys: list[str], method: str, dev: bool = False
                  ) -> list[str]:
    headline = Cell.of(sub)
    metric_cells = [Cell.of(sub.assign(_m=[f.get(k) for f in sub[Col.FINAL]]), "_m").text(with_n=False)
                    for k in keys]
    best = Cell.of(sub, Col.BEST_SCORE)
    c = facts.comparisons.get((method, sub[Col.TASK].iloc[0]))
    stats = [DASH] if c is None else [difference_text(c)]
    beside = [Cell.of(sub, Col.DEV_SCORE).text(with_n=False)] if dev else []
    return [facts.label(method), *metric_cells, headline.text(with_n=False), *beside, str(headline.n),
            str(headline.failed), best.text(with_n=False), *stats]


def per_task(facts: ModelFacts, options: Options) -> Part:
    sel, board, part = facts.sel, facts.board, Part()
    part.add("### Per-task results", "",
             "Every official metric x100 (mean ± std over seeds) for the leaderboard runs; best epoch: the "
             "headline metric at the best epoch (for reference only: picking it uses the dev set); "
             f"Δ: the verdict and the mean paired difference to `{options.baseline}` [95% interval over seeds and dev "
             "examples]; every statistic of each comparison is in the comparisons table above and in "
             "`comparisons.csv`.",
             "")
    for t in sel.tasks:
        bt = board[board[Col.TASK] == t]
        keys = metric_order(t, {k for f in bt[Col.FINAL] for k in f.names})
        heldout = bool((bt.get(Col.SCORED_ON, pd.Series(dtype=object)) == "heldout").any())
        rows = [_per_task_row(facts, bt[bt[Col.METHOD] == m], keys, m, heldout)
                for m in sel.methods if (bt[Col.METHOD] == m).any()]
        if rows:
            note = ["Scored on the held-out test split carved from the train set (train.test_holdout); dev: the "
                    "dev headline of the same runs, beside." + _makeup(_data_sizes(board, t)), ""] if heldout else []
            part.add(f"#### {task_display(t)}", "", *note,
                     table(rows, ["method", *keys, "headline", *(["dev"] if heldout else []), "seeds", "failed",
                                  "best epoch", f"Δ vs {options.baseline}"]), "")
    return part


def _makeup(data: DataSizes) -> str:
    """The held-out split's make-up beside dev's (records before version 3 do not say it)."""
    draw = data.draw
    if draw is None or draw.heldout_groups is None or data.heldout is None:
        return ""
    return (f" The held-out split holds {data.heldout:,} rows from {draw.heldout_groups:,} sources (a sentence "
            f"with its phrases, or rows of equal text: its example-level se is jackknifed by source), a median "
            f"row of {draw.heldout_median_words:g} words against dev's {draw.dev_median_words:g}: a held-out "
            "score is not comparable to a dev score.")


def _ablation_block(sel: Selection, method: str, sub: pd.DataFrame, keys: list[str]) -> list[str]:
    tasks = [t for t in sel.tasks if t in set(sub[Col.TASK])]
    values = sub.apply(lambda r: tuple(lookup(r, k) for k in keys), axis=1)
    sub = sub.assign(_row=values.map(lambda v: json.dumps(v, default=str)))
    row_values = {json.dumps(v, default=str): v for v in values}
    rows = []
    for rk in sorted(row_values, key=lambda k: tuple(sort_key(v) for v in row_values[k])):
        rs = sub[sub["_row"] == rk]
        in_board = all(sel.train_by_task.get(r[Col.TASK]) == r[Col.TRAIN] and sel.hp_by_method[method] == r[Col.HP]
                       for _, r in rs.iterrows())
        rows.append([*[value_text(v) for v in row_values[rk]],
                     *[Cell.of(rs[rs[Col.TASK] == t]).text() for t in tasks], "✓" if in_board else ""])
    return [f"#### {sel.label(method)}", "",
            table(rows, [*keys, *[task_display(t) for t in tasks], "in leaderboard"]), ""]


def ablations(facts: ModelFacts, options: Options) -> Part:
    """From the records the ablation tables draw from (`ModelFacts.ablation`: a curve's runs are left to it)."""
    sel, df, part = facts.sel, facts.ablation, Part()
    blocks = []
    for m in sel.methods:
        sub = df[df[Col.METHOD] == m]
        keys = varying_keys(sub)
        if keys:
            blocks += _ablation_block(sel, m, sub, keys)
    if blocks:
        part.add("### Ablations", "",
                 "Per method, every setting that differs within a task (hyper-parameters by name, training "
                 "settings as `train.*`): headline metric x100 as mean ± std (seeds). ✓: the setting the "
                 "leaderboard uses.", "", *blocks)
    return part


def skipped_records(report: ReportFacts, options: Options) -> Part:
    problems, part = report.loaded.problems, Part()
    if problems:
        part.add("## Skipped record files", "", "Files in the runs folders that are not valid run records (fix or "
                 "remove them):", "", *[f"- {problems[name]}" for name in sorted(problems)], "")
    return part


def failures(report: ReportFacts, options: Options) -> Part:
    df, part = report.frame, Part()
    failed = df[df[Col.STATUS] != "ok"].sort_values([Col.MODEL, Col.LABEL, Col.FILE])
    if len(failed):
        rows = [[r[Col.LABEL], r[Col.MODEL], r[Col.STATUS], (r[Col.ERROR].splitlines() or [""])[0][:200], r[Col.FILE]]
                for _, r in failed.iterrows()]
        part.add("## Failed runs", "", table(rows, ["run", "model", "status", "error", "record"]), "")
    shown = frozenset().union(*(f.shown for f in report.models.values()))
    rest = df[~df[Col.HASH].isin(shown)]
    if len(rest):
        rows = []
        for (model, task, method, hp, train), sub in rest.groupby([Col.MODEL, Col.TASK, Col.METHOD, Col.HP, Col.TRAIN]):
            sel_train = report.models[model].sel.train_by_task.get(task)
            diff = train_diff(train.values, sel_train.values if sel_train else {})
            setting = ", ".join(filter(None, [setting_text(hp.values, method), diff]))
            rows.append([model, task_display(task), method, setting or DASH, Cell.of(sub).text()])
        part.add("## Runs outside the leaderboard settings", "",
                 "Runs whose hyper-parameters or training settings differ from those the leaderboard uses for "
                 "their method and task, and that no ablation table shows:", "",
                 table(rows, ["model", "task", "method", "setting", "headline x100"]), "")
    return part
