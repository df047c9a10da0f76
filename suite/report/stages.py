"""The stages beside the records: the files a tuning stage and `run --until-decided` leave at an output root, and
the report's sections on them.

- Tuning (docs/protocol.md): OUT/tuning/selection.json, written by the run command after the tuning stage: each
  method's search space and budget, every configuration's tuning-split score (mean over the tuning seeds) and the
  configuration selected per (model, task, method). The tuning records themselves (OUT/tuning/runs/) never enter the
  leaderboard; the selected configurations tell which final runs a cell's leaderboard entry is
  (`suite.report.selection.fold_selected`).
- Seeds added until decided (docs/sequential.md): OUT/until_decided.json, written by the run command after every
  look (suite.grid.until_decided): each primary comparison's looks, seeds, stopping reason and verdict, which the
  comparisons report in place of the fixed-sample verdict.

Each section is '' when no reported folder has its file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from suite.api.errors import ReportError
from suite.report.tuning_budget import method_rows, seeds_warning, tuned_with
from suite.report.vocabulary import same_value
from suite.run.layout import (
    RUNS,
    SELECTION,
    TUNING,
    UNTIL_DECIDED,
    Look,
    SelectedCell,
    SelectionFile,
    TrackedComparison,
    UntilDecidedFile,
    read_state,
)

SELECTION_PATH = Path(TUNING) / SELECTION  # beside the records, at the output root
REASONS = {"efficacy": "efficacy (a difference)", "equivalence": "equivalence (within the margin)",
           "futility": "futility (no decision reachable by the cap)", "cap": "reached the cap undecided",
           "continue": "open (needs seeds not yet run: the loop is running, was interrupted, or was replayed)"}

__all__ = ["output_files", "selection_files", "selections", "sequential_markdown", "state_files", "tuning_markdown",
           "verdicts"]


def output_files(paths: Sequence[str | os.PathLike], name: str | Path) -> list[Path]:
    """The files called `name` at the output roots of the folders reported (a folder given as OUT/runs counts as OUT),
    where a stage beside the records left one (the tuning selection, the until-decided state)."""
    found = []
    for d in map(Path, paths):
        root = d.parent if d.name == RUNS and not (d / RUNS).is_dir() else d
        if (root / name).is_file():
            found.append(root / name)
    return found


def selections(paths: Sequence[str | os.PathLike]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(model, task, method) -> the selected configuration ({"train.lr": ..., "METHOD.KEY": ...}) of every tuning
    stage beside the folders reported, each file first held against its tuning records (`check_selection`)."""
    found = {}
    for path in output_files(paths, SELECTION_PATH):
        selection = read_state(path, SelectionFile)
        check_selection(path, selection)
        for cell in selection.cells:
            if cell.selected is not None:
                found[cell.key] = cell.selected
    return found


def check_selection(path: Path, selection: SelectionFile) -> None:
    """ReportError (exit 2, naming the file) when a cell's choice is not the configuration with the best mean of its
    scores, or a score is not what the tuning record of that configuration and seed holds (OUT/tuning/runs/): a stale
    or edited selection would otherwise be printed as the study's and decide which runs the tables show."""
    records = _tuning_scores(path.parent / RUNS)
    cells_with_records = {key[:3] for key in records}
    for cell in selection.cells:
        where = f"{path}: {cell.task}/{cell.method}"
        sign = 1 if cell.higher_is_better else -1
        complete = [c for c in cell.configurations if c.mean is not None]
        # a cell whose tuning records are not beside the file (copied without them) is checked for its choice only
        for c in cell.configurations if cell.key in cells_with_records else ():
            for seed, score in c.scores.items():
                held = _held_score(records, cell, seed, c.settings)
                if score is not None and not (score != score and held is not None and held != held) and \
                        (held is None or abs(score - held) > 1e-12):
                    raise ReportError(f"{where}: {_settings(c.settings)} at tuning seed {seed} scored {score} here, "
                                      f"but {'no tuning record holds it' if held is None else f'its record {held}'}; "
                                      "the file is stale or edited. " + _RESELECT)
        if cell.selected is not None and complete:
            best = max(complete, key=lambda c: sign * c.mean)  # ties: the first configuration, as the grid chose
            same = best.settings.keys() == cell.selected.keys() and all(
                same_value(best.settings[k], v) for k, v in cell.selected.items())
            if not same:
                raise ReportError(f"{where}: selects {_settings(cell.selected)}, but the best mean tuning-split "
                                  f"score is {_settings(best.settings)}'s; the file is edited. " + _RESELECT)


_RESELECT = "Give the study's command again to select anew from the tuning records"


def _held_score(records: dict, cell: SelectedCell, seed: str, settings: dict[str, Any]) -> float | None:
    """The tuning-split score of the record of `cell` at `seed` that ran `settings`; None when none did."""
    for values, score in records.get((cell.model, cell.task, cell.method, seed), []):
        if all(same_value(values.get(k.replace(f"{cell.method}.", "hp.", 1)), v) for k, v in settings.items()):
            return score
    return None


def _tuning_scores(folder: Path) -> dict[tuple, list[tuple[dict[str, Any], float]]]:
    """(model, task, method, seed as text) -> (every setting of the run as `train.KEY` / `hp.KEY`, its tuning-split
    score) of each ok tuning record."""
    import json

    found: dict[tuple, list] = {}
    for file in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(file.read_text())
            cfg, score = rec["config"], (rec.get("tune") or {}).get("score")
            if rec.get("status") != "ok" or not isinstance(score, (int, float)):
                continue
            values = {**{f"train.{k}": v for k, v in cfg["train"].items()},
                      **{f"hp.{k}": v for k, v in cfg["hparams"].items()}}
            found.setdefault((cfg["model"], cfg["task"], cfg["method"], str(cfg["seed"])), []).append(
                (values, float(score)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # the loader names broken records; here they only cannot vouch for a score
    return found


def state_files(run_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The state files of the output folders reported."""
    return output_files(run_dirs, UNTIL_DECIDED)


def verdicts(run_dirs: Sequence[str | os.PathLike], frame=None
             ) -> dict[tuple[str, str, str, str], tuple[str, str, Look | None]]:
    """{(model, method, task, reference): (verdict, stopping reason, last look)} of every comparison the state files
    hold; with the reported records (`frame`), each file is first held against them (`check_against_records`)."""
    found = {}
    for path in state_files(run_dirs):
        state = read_state(path, UntilDecidedFile)
        if frame is not None:
            check_against_records(path, state, frame)
        for c in state.comparisons:
            found[c.model, c.method, c.task, c.reference] = (c.verdict, c.reason, c.looks[-1] if c.looks else None)
    return found


def check_against_records(path: Path, state: UntilDecidedFile, frame) -> None:
    """ReportError (exit 2, naming the file) when a comparison's verdict does not follow from its own last look
    (efficacy needs p below the look's level and the sign of the difference; equivalence, TOST p below its level;
    every other stop, undecided), or its last look's seeds and difference are not what the reported records give:
    an edited or stale state file would otherwise put its verdicts, marked ‡, into the tables."""
    from suite.api.tasks import get_task

    ok = frame[frame["status"] == "ok"]
    for c in state.comparisons:
        if not c.looks:
            continue
        last, where = c.looks[-1], f"{path}: {c.task}/{c.method} vs {c.reference}"
        sign = 1 if get_task(c.task).higher_is_better else -1
        expected = {"efficacy": ("better" if (last.diff or 0) * sign > 0 else "worse")
                    if last.p is not None and last.level is not None and last.p < last.level else None,
                    "equivalence": "equivalent" if last.p_equiv is not None and last.level_equiv is not None
                    and last.p_equiv < last.level_equiv else None}.get(c.reason, "undecided")
        if c.verdict != expected or last.n != len(last.seeds):
            raise ReportError(f"{where}: the verdict {c.verdict!r} (stopped for {c.reason}) does not follow from "
                              f"its last look (n {last.n}, p {last.p}, level {last.level}, TOST p {last.p_equiv}, "
                              "level {last.level_equiv}); the file was edited or damaged. "
                              + _REWRITE)
        if last.diff is not None and not _records_give(ok, c, last):
            raise ReportError(f"{where}: no set of the reported records gives its last look ({last.n} paired seeds "
                              f"{', '.join(map(str, last.seeds))}, difference {last.diff:+.4f}); the file is stale "
                              "(from other records) or edited. " + _REWRITE)


_REWRITE = ("Give the study's `run --until-decided` command again to write it from the records, or remove it to "
            "report the fixed-sample verdicts")


def _records_give(ok, c: TrackedComparison, last: Look) -> bool:
    """Whether the records of one shared training setting hold both arms at the look's seeds with its difference
    (x100, method minus reference; any hyper-parameter setting of either arm)."""
    cell = ok[(ok["model"] == c.model) & (ok["task"] == c.task) & ok["method"].isin([c.method, c.reference])]
    for _, group in cell.groupby("train", sort=False):
        arms = [[g.drop_duplicates("seed").set_index("seed")["score"] for _, g in
                 group[group["method"] == m].groupby("hp", sort=False)] for m in (c.method, c.reference)]
        for a in arms[0]:
            for b in arms[1]:
                if set(last.seeds) <= set(a.index) & set(b.index) and \
                        abs(100 * (a.loc[last.seeds] - b.loc[last.seeds]).mean() - last.diff) <= 1e-6:
                    return True
    return False


def _num(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _row(c: TrackedComparison) -> str:
    last = c.looks[-1] if c.looks else Look(look=0, planned_seeds=0, n=0, seeds=[], reason="", verdict="")
    evidence = (f"{_num(last.diff, '+.2f')} [{_num(last.low, '+.2f')}, {_num(last.high, '+.2f')}]"
                if last.diff is not None else "—")
    p = f"{_num(last.p, '.2g')} (< {_num(last.level, '.2g')})" if last.level else "—"
    if last.level and getattr(last, "p_sign", None) is not None:   # state files from before the sign test lack it
        p += f"; sign {_num(last.p_sign, '.2g')}"
    tost = (f"{_num(last.p_equiv, '.2g')} (< {_num(last.level_equiv, '.2g')}, ±{last.margin:g})"
            if last.level_equiv and last.margin is not None else "—")
    ns = " → ".join(str(lk.n) for lk in c.looks)
    return (f"| {c.task} | {c.method} vs {c.reference} | {len(c.looks)} | {ns} | "
            f"{REASONS.get(c.reason, c.reason)} | **{c.verdict}** | {evidence} | {p} | {tost} |")


def sequential_markdown(run_dirs: Sequence[str | os.PathLike]) -> str:
    """The section as markdown ('' when no folder was run with --until-decided)."""
    lines: list[str] = []
    for path in state_files(run_dirs):
        state = read_state(path, UntilDecidedFile)
        looks = ", ".join(map(str, state.looks))
        lines += ["", "## Seeds added until decided", "",
                  f"`run --until-decided` looked at the primary comparisons at {looks} seeds and gave further seeds "
                  f"only to those still undecided. Rule: {state.rule}; alpha {state.alpha:g} over "
                  f"{state.primary} primary comparison(s), {state.alpha_each:.3g} each (`{path}`).", "",
                  "A comparison's verdict here is the one whose error rate holds over the looks, and the one the "
                  "difference and comparison tables report (marked ‡); their intervals and p-values treat the same "
                  "seeds as one fixed-size sample and do not account for the looks.", "",
                  "| task | comparison | looks | paired seeds per look | stopped for | verdict | diff [95% interval] "
                  "| p (look's level); sign test p | TOST p (level, margin) |",
                  "|---|---|---:|---|---|---|---|---|---|"]
        lines += [_row(c) for c in state.comparisons]
    return "\n".join(lines) + ("\n" if lines else "")


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) or v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in settings.items()) or "defaults"


def _score(x: float | None) -> str:
    """A score x 100; a failed run's is NaN, a run without a record yet (or a mean it lacks) None."""
    return "—" if x is None else "failed" if x != x else f"{100 * x:.2f}"


def _short(settings: dict[str, Any], method: str) -> str:
    """Selected settings without the method's own prefix (`vanilla.p` -> `p`, `train.lr` -> `lr`)."""
    def key(k: str) -> str:
        return k.split(".", 1)[1] if k.startswith((f"{method}.", "train.")) else k
    return ", ".join(f"{key(k)}={_value(v)}" for k, v in settings.items()) or "defaults"


def _selected_table(cells: list[SelectedCell]) -> list[str]:
    """One row per method, one column per task: each cell's selected settings and its tuning-split score."""
    tasks = list(dict.fromkeys(c.task for c in cells))
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for c in cells:
        best = next((x.mean for x in c.configurations if x.settings == c.selected), None)
        rows.setdefault((c.model, c.method), {})[c.task] = (
            f"{_short(c.selected, c.method)} ({_score(best)})" if c.selected is not None else "none selected")
    lines = ["| model | method | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    lines += [f"| {model} | {method} | " + " | ".join(by_task.get(t, "–") for t in tasks) + " |"
              for (model, method), by_task in rows.items()]
    return lines


def selection_files(run_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The selection files of the output folders reported."""
    return output_files(run_dirs, SELECTION_PATH)


def tuning_markdown(run_dirs: Sequence[str | os.PathLike]) -> str:
    """The section as markdown ('' when no folder has a tuning stage)."""
    lines: list[str] = []
    for path in selection_files(run_dirs):
        data = read_state(path, SelectionFile)
        p = data.protocol
        lines += ["", "## Tuning", "",
                  f"Each method was tuned {tuned_with(p)} on a tuning split carved from the training data "
                  f"(train.holdout={_value(p.holdout)}), never on dev; the configuration with the best mean "
                  "tuning-split score is the one the tables above report, run on other seeds and scored on dev "
                  f"(`{path}`).", "", *seeds_warning(p), *method_rows(p, data.cells)]
        lines += ["", "Selected per task (tuning-split score x 100 in brackets):", "",
                  *_selected_table(data.cells), "", "### Every configuration tried"]
        for cell in data.cells:
            lines += ["", f"**{cell.task} / {cell.method}** (`{cell.model}`; tuning-split score x 100, "
                      f"{'higher' if cell.higher_is_better else 'lower'} is better): "
                      + (f"selected {_settings(cell.selected)}" if cell.selected is not None
                         else f"nothing selected ({cell.reason})"), "",
                      "| configuration | mean | per tuning seed | selected |", "|---|---:|---|:---:|"]
            for c in cell.configurations:
                seeds = ", ".join(f"{s}: {_score(v)}" for s, v in c.scores.items())
                chosen = "✓" if c.settings == cell.selected else ""
                lines.append(f"| {_settings(c.settings)} | {_score(c.mean)} | {seeds} | {chosen} |")
    return "\n".join(lines) + ("\n" if lines else "")
