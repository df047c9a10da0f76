"""Which records each table uses.

Per method the leaderboard uses the runs its tuning selected (a study with a tuning stage), else its default
hyper-parameters (the method's `Config()`); a method run only with other settings shows the most-run one and says
so. Per (model, task) it uses one set of training settings for every method: the one the most methods ran (then most
ok runs, then the latest finished run). The ablation tables show every setting that differs within a task; a
data-efficiency curve is a task run at several training-set sizes.

A tuned study (docs/protocol.md): each (model, task, method) ran the configuration its tuning selected
(OUT/tuning/selection.json, read once into `Loaded.selections`), so learning rates and the methods' own rates differ
from cell to cell. The runs that match their cell's selection have the searched keys taken out of their `train` and
`hp` settings (`fold_selected`), so that every method's selected runs of a task share one leaderboard row and
column; which values each cell ran is the Tuning section's table. Runs of another configuration keep their settings
and show up as runs outside the leaderboard settings.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Mapping

import pandas as pd

from suite.report.load import Col, Loaded, Setting
from suite.report.state_checks import check_selection
from suite.report.vocabulary import default_hparams, key_of, reconstruction_note, same_value, task_order
from suite.run.settings import changed_settings, setting_value

__all__ = ["Selection", "curve_methods", "curve_runs", "fold_selected", "has_variation", "lookup",
           "leaderboard_selection", "setting_text", "setup_note", "size_curves", "train_diff", "varying_keys"]

TRAIN = "train."
SIZE = "max_train_samples"  # the training settings a data-efficiency curve varies
EPOCHS = "epochs"
DRAW = "data_seed"
MIN_SIZES = 3      # a task with this many training-set sizes has a data-efficiency curve


@dataclasses.dataclass
class Selection:
    model: str
    tasks: list[str]
    methods: list[str]
    train_by_task: dict[str, Setting]     # task -> the training settings the leaderboard uses
    hp_by_method: dict[str, Setting]      # method -> the hyper-parameters the leaderboard uses
    hp_is_default: dict[str, bool]
    reference_tasks: list[str] = dataclasses.field(default_factory=list)  # shown apart, never compared

    def board(self, df: pd.DataFrame, tasks: list[str] | None = None) -> pd.DataFrame:
        """The model's records that the leaderboard uses (or the reference table, given its tasks)."""
        tasks = set(self.tasks if tasks is None else tasks)
        keep = df.apply(lambda r: r[Col.TASK] in tasks and self.train_by_task.get(r[Col.TASK]) == r[Col.TRAIN]
                        and self.hp_by_method.get(r[Col.METHOD]) == r[Col.HP], axis=1)
        return df[keep.astype(bool)] if len(df) else df

    def label(self, method: str) -> str:
        """A method's row label: † for a reconstruction, its setting in brackets when it is not its own."""
        label = method + (" †" if reconstruction_note(method) else "")
        if not self.hp_is_default[method]:
            text = setting_text(self.hp_by_method[method].values, method)
            label += f" [{text}]" if text else ""
        return label


def _hparams_used(sub: pd.DataFrame, method: str) -> tuple[Setting, bool]:
    """The method's leaderboard setting and whether it counts as the method's own (no brackets in its label): the runs
    its tuning selected, else its defaults, else its most-run setting."""
    if Col.TUNED in sub:
        selected = sub[sub[Col.TUNED].map(bool)]
        if len(selected):
            return selected[Col.HP].value_counts().index[0], True
    default = default_hparams(method)
    found = {setting.key: setting for setting in sub[Col.HP]}
    if default is not None and default in found:
        return found[default], True
    counts = sub.assign(ok=sub[Col.STATUS] == "ok").groupby(Col.HP).agg(ok=("ok", "sum"), n=("ok", "size"))
    counts = counts.reset_index().sort_values(["ok", "n", Col.HP], ascending=[False, False, True])
    return counts[Col.HP].iloc[0], False


def _train_used(sub: pd.DataFrame) -> Setting:
    stats = (sub.assign(ok=sub[Col.STATUS] == "ok")
             .groupby(Col.TRAIN).agg(methods=(Col.METHOD, "nunique"), ok=("ok", "sum"), n=("ok", "size"),
                                   latest=(Col.FINISHED, "max")).reset_index())
    stats = stats.sort_values(["methods", "ok", "n", "latest", Col.TRAIN], ascending=[False, False, False, False, True])
    return stats[Col.TRAIN].iloc[0]


def leaderboard_selection(df: pd.DataFrame, model: str, baseline: str, reference_tasks=()) -> Selection:
    """`reference_tasks` (e.g. tasks the model does not learn) get their own table, out of comparisons and averages."""
    dm = df[df[Col.MODEL] == model]
    tasks = task_order(dm[Col.TASK].unique())
    methods = sorted(dm[Col.METHOD].unique(), key=lambda m: (m != baseline, m))
    hp_by_method, is_default = {}, {}
    for method in methods:
        hp_by_method[method], is_default[method] = _hparams_used(dm[dm[Col.METHOD] == method], method)
    train_by_task = {}
    for task in tasks:
        sub = dm[(dm[Col.TASK] == task) & (dm[Col.HP] == dm[Col.METHOD].map(hp_by_method))]
        if not len(sub):  # this task only has other hyper-parameter settings: they are listed after the tables
            sub = dm[dm[Col.TASK] == task]
        train_by_task[task] = _train_used(sub)
    reference = [t for t in tasks if t in set(reference_tasks)]
    return Selection(model, [t for t in tasks if t not in reference], methods, train_by_task, hp_by_method,
                     is_default, reference)


def setting_text(hp: Mapping[str, Any], method: str) -> str:
    """The hyper-parameters that differ from the method's defaults (all of them for unknown methods), written by the
    rule that also names the rows of `run`'s closing summary (`suite.run.settings.changed_settings`)."""
    default = default_hparams(method)
    return changed_settings(dict(hp), json.loads(default) if default else None)


def lookup(row, key: str):
    """A run's value of an ablation key (`train.*` or a hyper-parameter's name); "tuned" where its cell's tuning
    chose it (the value per cell is in the Tuning section)."""
    if (key if key.startswith(TRAIN) else f"{row[Col.METHOD]}.{key}") in (row.get(Col.TUNED) or ()):
        return "tuned"
    if key.startswith(TRAIN):
        return row[Col.TRAIN].get(key[len(TRAIN):])
    return row[Col.HP].get(key)


def varying_keys(sub: pd.DataFrame) -> list[str]:
    """Hyper-parameters (by name) and training fields (`train.*`) taking two or more values within one task."""
    keys: set[str] = set()
    for _, t in sub.groupby([Col.MODEL, Col.TASK]):
        for col, prefix in ((Col.HP, ""), (Col.TRAIN, TRAIN)):
            names = {k for setting in t[col] for k in setting.values}
            for k in names:
                if len({key_of({"v": setting.get(k)}) for setting in t[col]}) > 1:
                    keys.add(prefix + k)
    return sorted(keys, key=lambda k: (k.startswith(TRAIN), k))


def has_variation(df: pd.DataFrame, model: str, method: str) -> bool:
    return bool(varying_keys(df[(df[Col.MODEL] == model) & (df[Col.METHOD] == method)]))


def train_diff(d: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    return ", ".join(f"train.{k}={setting_value(v)}" for k, v in sorted(d.items()) if ref.get(k, object()) != v)


def _split(method: str, selected: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training settings, the method's hyper-parameters) of a selected configuration."""
    train = {k[len(TRAIN):]: v for k, v in selected.items() if k.startswith(TRAIN)}
    own = {k[len(method) + 1:]: v for k, v in selected.items() if k.startswith(method + ".")}
    return train, own


def selections(loaded: Loaded) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(model, task, method) -> the selected configuration ({"train.lr": ..., "METHOD.KEY": ...}) of every tuning
    stage beside the folders reported, each file first held against its tuning records and the reported final runs
    (`suite.report.state_checks.check_selection`)."""
    found = {}
    for path, selection in loaded.selections:
        check_selection(path, selection, loaded.frame)
        for cell in selection.cells:
            if cell.selected is not None:
                found[cell.key] = cell.selected
    return found


def fold_selected(loaded: Loaded) -> pd.DataFrame:
    """The loaded frame with each selected run's searched keys taken out of its settings (see the module's text);
    unchanged when no folder has a tuning stage."""
    frame = loaded.frame
    chosen = selections(loaded)
    if not chosen or not len(frame):
        return frame
    missing = sorted({f"{t}/{m}" for t, m in zip(frame[Col.TASK], frame[Col.METHOD])}
                     - {f"{t}/{m}" for _, t, m in chosen})
    if missing:  # runs of cells whose tuning stage never ran, or a selection file written before they were tuned
        print(f"warning: no tuning selection for {', '.join(missing)}: their runs are reported as they ran; give "
              "the study's command again (it writes every cell's selection) to fold them", file=sys.stderr)
    frame = frame.assign(**{Col.TUNED: [()] * len(frame)})
    for i, row in frame.iterrows():
        selected = chosen.get((row[Col.MODEL], row[Col.TASK], row[Col.METHOD]))
        if selected is None:
            continue
        train, own = _split(row[Col.METHOD], selected)
        if not (all(same_value(row[Col.TRAIN].get(k), v) for k, v in train.items())
                and all(same_value(row[Col.HP].get(k), v) for k, v in own.items())):
            continue
        frame.at[i, Col.TRAIN] = row[Col.TRAIN].without(train)
        frame.at[i, Col.HP] = row[Col.HP].without(own)
        frame.at[i, Col.TUNED] = tuple(selected)
    return frame


def setup_note(board: pd.DataFrame) -> str:
    """The Setup section's sentence on what was tuned per cell ('' for an untuned study)."""
    if Col.TUNED not in board or not len(board):
        return ""
    keys = sorted({k for ks in board[Col.TUNED] for k in ks}, key=lambda k: (not k.startswith(TRAIN), k))
    if not keys:
        return ""
    return (" Tuned per task and method, each cell's values in the Tuning section below: "
            + ", ".join(f"`{k}`" for k in keys) + ".")


def _rest(train: Setting) -> Setting:
    """Training settings without the train-set size, the epochs (which may scale with it) and the data draw."""
    return train.without((SIZE, EPOCHS, DRAW))


def _one_epochs_per_size(sub: pd.DataFrame, leaderboard_epochs) -> pd.DataFrame:
    """Where a size ran at several epoch counts, the one with the most runs (ties: the leaderboard's, then the
    fewest epochs)."""
    keep = []
    for _, at in sub.groupby(Col.SIZE):
        counts = at[Col.EPOCHS].value_counts()
        pick = min(counts.index, key=lambda e: (-counts[e], e != leaderboard_epochs, e))
        keep.append(at[at[Col.EPOCHS] == pick])
    return pd.concat(keep)


def size_curves(sel: Selection, df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """{task: its ok records at every train-set size (columns `size`, `epochs`, `draw`)} for tasks with at least
    MIN_SIZES sizes, at the leaderboard's other training settings and each method's leaderboard hyper-parameters.

    A curve may fix its data draws (`train.data_seed`): where a task's curve runs have fixed draws, only those are
    used (the leaderboard's runs, drawn per seed, are a different design)."""
    ok = df[(df[Col.STATUS] == "ok") & (df[Col.HP] == df[Col.METHOD].map(sel.hp_by_method))]
    found = {}
    for task in sel.tasks:
        sub = ok[ok[Col.TASK] == task]
        if task not in sel.train_by_task or not len(sub):
            continue
        sub = sub[sub[Col.TRAIN].map(_rest) == _rest(sel.train_by_task[task])]
        sizes = sub[Col.TRAIN].map(lambda s: s.get(SIZE))
        sub = sub.assign(**{Col.SIZE: sizes, Col.EPOCHS: sub[Col.TRAIN].map(lambda s: s.get(EPOCHS)),
                            Col.DRAW: sub[Col.TRAIN].map(lambda s: s.get(DRAW))})
        sub = sub[sizes.notna()]  # `null` (the whole train set) has no place on the axis
        if sub[Col.DRAW].notna().any():  # a curve with fixed draws: the runs drawn per seed are another design
            sub = sub[sub[Col.DRAW].notna()]
        if sub[Col.SIZE].nunique() >= MIN_SIZES:
            found[task] = _one_epochs_per_size(sub, sel.train_by_task[task].get(EPOCHS))
    return found


def curve_methods(sel: Selection, sub: pd.DataFrame) -> list[str]:
    """The methods a curve shows: those run at two sizes or more."""
    return [m for m in sel.methods if sub[sub[Col.METHOD] == m][Col.SIZE].nunique() >= 2]


def curve_runs(sel: Selection, df: pd.DataFrame, curves: dict[str, pd.DataFrame]) -> pd.Index:
    """The index of the records the data-efficiency section shows, failed runs included (the ablation tables leave
    them to it): per curve task, the runs of each method the curve draws at a training setting its curve has.
    `curves`: `size_curves(sel, df)`."""
    keep = []
    for task, sub in curves.items():
        for m in curve_methods(sel, sub):
            settings = set(sub.loc[sub[Col.METHOD] == m, Col.TRAIN])
            keep.append(df.index[(df[Col.TASK] == task) & (df[Col.METHOD] == m) & (df[Col.HP] == sel.hp_by_method[m])
                                 & df[Col.TRAIN].isin(settings)])
    return keep[0].append(keep[1:]) if keep else pd.Index([])
