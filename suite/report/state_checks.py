"""The report holds each state file beside the records against them, as `run` does when it writes them: nothing in a
state file reaches a table unless the records give it.

- OUT/until_decided.json: every comparison's looks are replayed from the reported records (`suite.stats.looks`, the
  code the loop decides with) at the file's schedule and seed order, the report's alpha and margin; the file must
  hold what the replay gives (seeds, difference, p-values, levels, reason and verdict of every look). In the middle
  of a round (`round_under_way`: some of the runs the next look needs have records, some not) a comparison whose
  runs are all in replays to one look more than the file holds, which the run writes when the round ends: the file
  must then hold the replay's looks up to its own last one.
- OUT/tuning/selection.json: each configuration's mean is the mean of its scores, a score is what its tuning record
  holds (NaN: a failed one), the choice is the best mean, the selection is what the cell's final runs trained with,
  and a cell has runs (tuning or final) at all.

A file that does not hold is refused (ReportError, exit 2) with its path, what differs and how to write it anew.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.api.errors import ReportError
from suite.report.load import Col
from suite.report.vocabulary import same_value, seed_ranges
from suite.run.layout import RUNS, SelectedCell, SelectionFile, TrackedComparison, UntilDecidedFile
from suite.run.record import InvalidRecord, read_record, record_files

__all__ = ["check_selection", "check_sequential", "round_under_way"]

_RESELECT = "Give the study's command again to select anew from the tuning records"
_REWRITE = ("Give the study's `run --until-decided` command again to write it from the records, or remove it to "
            "report the fixed-sample verdicts")
TOLERANCE = 1e-6   # relative, on numbers written to JSON and read back


# ---------------------------------------------------------------------------------------------------------
# OUT/tuning/selection.json
# ---------------------------------------------------------------------------------------------------------

def check_selection(path: Path, selection: SelectionFile, frame=None) -> None:
    """ReportError (exit 2, naming the file) when the selection does not follow from its own scores, from the tuning
    records beside it (OUT/tuning/runs/) or from the final runs of `frame` (the reported records)."""
    records = _tuning_scores(path.parent / RUNS)
    cells_with_records = {key[:3] for key in records}
    for cell in selection.cells:
        where = f"{path}: {cell.task}/{cell.method}"
        _check_means(where, cell)
        # a cell whose tuning records are not beside the file (copied without them) is checked by its final runs
        for c in cell.configurations if cell.key in cells_with_records else ():
            for seed, score in c.scores.items():
                held = _held_score(records, cell, seed, c.settings)
                if score is not None and not _same(score, held):
                    raise ReportError(f"{where}: {_settings(c.settings)} at tuning seed {seed} scored {score} here, "
                                      f"but {'no tuning record holds it' if held is None else f'its record {held}'}; "
                                      "the file is stale or edited. " + _RESELECT)
        complete = [c for c in cell.configurations if c.mean is not None]
        if cell.selected is not None and complete:
            sign = 1 if cell.higher_is_better else -1
            best = max(complete, key=lambda c: sign * c.mean)  # ties: the first configuration, as the grid chose
            if not _same_settings(best.settings, cell.selected):
                raise ReportError(f"{where}: selects {_settings(cell.selected)}, but the best mean tuning-split "
                                  f"score is {_settings(best.settings)}'s; the file is edited. " + _RESELECT)
        if frame is not None:
            _check_final_runs(where, cell, frame, cell.key in cells_with_records)


def _check_means(where: str, cell: SelectedCell) -> None:
    """A mean is that of its scores when every one is a finite number, else None (a failed or missing run)."""
    for c in cell.configurations:
        scores = list(c.scores.values())
        complete = bool(scores) and all(s is not None and math.isfinite(s) for s in scores)
        expected = sum(scores) / len(scores) if complete else None
        if (c.mean is None) != (expected is None) or (expected is not None and not _same(c.mean, expected)):
            raise ReportError(f"{where}: {_settings(c.settings)} has mean {c.mean}, but its scores "
                              f"{c.scores} give {expected}; the file is edited. " + _RESELECT)


def _check_final_runs(where: str, cell: SelectedCell, frame, tuned: bool) -> None:
    """The cell ran (tuning records or final runs), and its final runs trained with what it selects."""
    runs = frame[(frame[Col.MODEL] == cell.model) & (frame[Col.TASK] == cell.task) & (frame[Col.METHOD] == cell.method)]
    if not len(runs):
        if not tuned:
            raise ReportError(f"{where}: no run of this cell is among the records (tuning or final): {cell.method} "
                              f"never ran on {cell.task}; the file is edited or from another study. " + _RESELECT)
        return
    if cell.selected is None:
        return
    prefix = f"{cell.method}."
    for _, row in runs.iterrows():
        values = {**{f"train.{k}": v for k, v in row[Col.TRAIN].values.items()},
                  **{f"{prefix}{k}": v for k, v in row[Col.HP].values.items()}}
        if all(k in values and same_value(values[k], v) for k, v in cell.selected.items()):
            return
    ran = {k: runs.iloc[0][Col.TRAIN].get(k[len("train."):]) if k.startswith("train.") else
           runs.iloc[0][Col.HP].get(k[len(prefix):]) for k in cell.selected}
    raise ReportError(f"{where}: selects {_settings(cell.selected)}, but no final run of the cell trained with it "
                      f"(they ran e.g. {_settings(ran)}); the file is stale or edited. " + _RESELECT)


def _same(a: float | None, b: float | None) -> bool:
    """Equal as written to JSON and read back; NaN (a failed run) equals only NaN."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _same_settings(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(same_value(a[k], v) for k, v in b.items())


def _held_score(records: dict, cell: SelectedCell, seed: str, settings: dict[str, Any]) -> float | None:
    """The tuning-split score of the record of `cell` at `seed` that ran `settings` (NaN: it failed); None when none
    did."""
    for values, score in records.get((cell.model, cell.task, cell.method, seed), []):
        if all(same_value(values.get(k.replace(f"{cell.method}.", "hp.", 1)), v) for k, v in settings.items()):
            return score
    return None


def _tuning_scores(folder: Path) -> dict[tuple, list[tuple[dict[str, Any], float]]]:
    """(model, task, method, seed as text) -> (every setting of the run as `train.KEY` / `hp.KEY`, its tuning-split
    score as the grid selected by: `RunRecord.tune_score`, NaN for a failed run) of each tuning record."""
    found: dict[tuple, list] = {}
    for file in record_files(folder) if folder.is_dir() else []:
        try:
            rec = read_record(file)
        except (OSError, InvalidRecord):
            continue  # the loader names broken records; here they only cannot vouch for a score
        values = {**{f"train.{k}": v for k, v in rec.train.items()}, **{f"hp.{k}": v for k, v in rec.hparams.items()}}
        found.setdefault((rec.model, rec.task, rec.method, str(rec.seed)), []).append((values, rec.tune_score))
    return found


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) or v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in settings.items()) or "defaults"


# ---------------------------------------------------------------------------------------------------------
# OUT/until_decided.json
# ---------------------------------------------------------------------------------------------------------

LOOK_FIELDS = ("n", "seeds", "reason", "verdict", "diff", "p", "p_equiv", "level", "level_equiv", "margin")
MAX_LOOKS = 50   # what a schedule may plan (suite.grid.until_decided); a file claiming more is not one run wrote


def check_sequential(path: Path, state: UntilDecidedFile, frame, alpha: float, margin=None) -> None:
    """ReportError (exit 2, naming the file) unless every comparison's looks, reason and verdict are what replaying
    the design on the reported records (`frame`) gives, at the report's `alpha` and `margin` (a number, or task ->
    number with an optional default; None: 1 point)."""
    from suite.stats.evidence import per_task
    from suite.stats.sequential import Design, family_alpha, plan_looks

    _check_design(path, state, alpha)
    looks = tuple(plan_looks(state.schedule.start, state.schedule.step, state.schedule.cap))
    design = Design(looks, family_alpha(alpha, len(state.comparisons)), spending=state.schedule.spending,
                    futility=state.schedule.futility)
    under_way = bool(round_under_way(state, frame))
    for c in state.comparisons:
        where = f"{path}: {c.task}/{c.method} vs {c.reference}"
        used = next((look.margin for look in c.looks if look.margin is not None), None)
        if used is not None and not _agrees(used, per_task(margin, c.task)):
            raise ReportError(f"{where}: its looks tested equivalence within ±{used:g}, this report within "
                              f"±{per_task(margin, c.task):g}: " + _margin_hint(state, used))
        replayed = replay(c, design, state.seed_order, frame, per_task(margin, c.task))
        if under_way and c.looks and c.reason == "continue" and len(replayed) == len(c.looks) + 1:
            replayed = replayed[:len(c.looks)]   # the look its round's records give is written when the round ends
        end = (replayed[-1]["reason"], replayed[-1]["verdict"]) if replayed else ("continue", "undecided")
        if (c.reason, c.verdict) != end:
            raise ReportError(f"{where}: the file says {c.verdict} (stopped for {c.reason}), but its looks replayed "
                              f"from the reported records give {end[1]} ({end[0]}, {len(replayed)} look(s)); the file "
                              "was edited, or is stale (from other records). " + _REWRITE)
        if len(c.looks) != len(replayed):
            raise ReportError(f"{where}: the file holds {len(c.looks)} look(s), the reported records give "
                              f"{len(replayed)}; the file was edited or is stale. " + _REWRITE)
        for held, given in zip(c.looks, replayed):
            differs = next((k for k in LOOK_FIELDS if not _agrees(getattr(held, k), given.get(k))), None)
            if differs is not None:
                raise ReportError(f"{where}: look {given['look']} holds {differs} {getattr(held, differs)!r}, but no "
                                  f"set of the reported records gives it (they give {given.get(differs)!r}); the "
                                  "file was edited or is stale. " + _REWRITE)


def _margin_hint(state: UntilDecidedFile, used: float) -> str:
    """How to report at the margins the looks used: --margin takes one number, a study file one per task."""
    margins = {c.task: next((lk.margin for lk in c.looks if lk.margin is not None), None) for c in state.comparisons}
    given = {t: m for t, m in margins.items() if m is not None}
    if len(set(given.values())) > 1:
        where = "give the study's margins (" + ", ".join(f"{t} ±{m:g}" for t, m in given.items()) + \
                "): report --study FILE, whose report: margin: names one per task (--margin takes one for every task)"
    else:
        where = f"give the study's margin (report --study FILE, or --margin {used:g})"
    return where + ", or " + _REWRITE[0].lower() + _REWRITE[1:]


@dataclass(frozen=True)
class Round:
    """The runs `run --until-decided` gives the open comparisons before their next look, some of them recorded."""
    look: int        # the look they lead to (1 = the first)
    seeds: str       # the seeds they add, as text
    recorded: int    # runs among them with a record (ok or failed)
    runs: int        # runs in all (an arm shared by comparisons counted once)


def round_under_way(state: UntilDecidedFile, frame) -> tuple[Round, ...]:
    """The rounds the open comparisons of `state` are in (one per next look; one when the loop wrote the file), where
    some but not all of their runs have records in `frame` among the settings the looks compare (`_arm`); empty when
    none has, or every one has: then the run takes the looks, or has."""
    from suite.stats.sequential import plan_looks

    looks = plan_looks(state.schedule.start, state.schedule.step, state.schedule.cap)
    wanted: dict[int, dict[tuple, bool]] = {}   # next look -> (model, task, method, seed) -> recorded
    for c in state.comparisons:
        if c.reason != "continue" or not c.looks or len(c.looks) >= len(looks):
            continue
        seeds = state.seed_order[looks[len(c.looks) - 1]:looks[len(c.looks)]]
        for method in (c.method, c.reference):
            arm = _arm(frame, c.model, c.task, method, state.seed_order)
            wanted.setdefault(len(c.looks) + 1, {}).update({(c.model, c.task, method, s): s in arm for s in seeds})
    rounds = tuple(Round(look=look, seeds=seed_ranges({key[3] for key in runs}), recorded=sum(runs.values()),
                         runs=len(runs)) for look, runs in sorted(wanted.items()))
    recorded = sum(r.recorded for r in rounds)
    return () if recorded in (0, sum(r.runs for r in rounds)) else rounds


def _check_design(path: Path, state: UntilDecidedFile, alpha: float) -> None:
    """The file's design is one a run could have written, at the alpha this report tests at."""
    s = state.schedule
    ok_counts = 1 <= s.start <= s.cap <= len(state.seed_order) and s.step >= 1 and len(state.looks) <= MAX_LOOKS
    if not ok_counts or len(set(state.seed_order)) != len(state.seed_order):
        raise ReportError(f"{path}: its schedule (start {s.start}, step {s.step}, cap {s.cap}, {len(state.looks)} "
                          f"looks, {len(state.seed_order)} seeds in order) is not one `run --until-decided` writes; "
                          "the file was edited. " + _REWRITE)
    if not math.isclose(state.alpha, alpha, rel_tol=TOLERANCE) or state.primary != len(state.comparisons):
        raise ReportError(f"{path}: its looks spent alpha {state.alpha:g} over {state.primary} primary comparison(s) "
                          f"({len(state.comparisons)} in the file), and this report tests at alpha {alpha:g}: give "
                          f"the study's alpha (report --study FILE, or --alpha {state.alpha:g}), or " +
                          _REWRITE[0].lower() + _REWRITE[1:])


def _agrees(held: Any, given: Any) -> bool:
    if isinstance(given, float) or isinstance(held, float):
        if held is None or given is None:
            return held is None and given is None
        return math.isclose(float(held), float(given), rel_tol=TOLERANCE, abs_tol=1e-12)
    return held == given


def replay(c: TrackedComparison, design, seed_order: list[int], frame, margin: float) -> list[dict[str, Any]]:
    """The looks `run --until-decided --replay` would write for `c` from the reported records: each arm's runs of
    one setting (the one with records at most seeds of the order), looked at up to the first look with a seed
    neither run nor failed."""
    from suite.stats.evidence import bootstrap_seed, compare_runs
    from suite.stats.looks import next_look

    arms = [_arm(frame, c.model, c.task, m, seed_order) for m in (c.method, c.reference)]
    seed = bootstrap_seed(c.task, c.method, c.reference)

    def evaluate(ours, theirs):
        return compare_runs(c.task, ours, theirs, margin, seed=seed)

    looks: list[dict[str, Any]] = []
    for look, n in enumerate(design.looks):
        wanted = seed_order[:n]
        if (looks and looks[-1]["reason"] != "continue") or any(s not in arm for arm in arms for s in wanted):
            break
        ours, theirs = ({s: arm[s] for s in wanted if arm[s] is not None} for arm in arms)
        looks.append(next_look(looks, design, ours, theirs, evaluate, look, wanted))
    return looks


def _arm(frame, model: str, task: str, method: str, seed_order: list[int]) -> dict[int, Any]:
    """seed -> the outcome of an ok run (`RunOutcome.of`, as the loop read it), or None for a failed one, of the arm's
    setting that has records at the most seeds of the order (the loop compares the one setting planned at every
    seed)."""
    runs = frame[(frame[Col.MODEL] == model) & (frame[Col.TASK] == task) & (frame[Col.METHOD] == method)]
    order = set(seed_order)
    best: dict[int, Any] = {}
    for _, group in runs.groupby([Col.TRAIN, Col.HP], sort=False):
        found = {int(r[Col.SEED]): r[Col.OUTCOME] if r[Col.STATUS] == "ok" else None
                 for _, r in group.iterrows() if r[Col.SEED] in order}
        if len(found) > len(best):
            best = found
    return best
