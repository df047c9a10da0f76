"""The tuning stage of a study (`tune:`, docs/protocol.md): every method gets its whole grid (`budget: all`: the
shared settings' grid, e.g. the learning rates, crossed with its own hyper-parameters) or the same number of
configurations drawn from it (stratified: every point of the shared grid at least once), each trained on the tuning
seeds and scored on the tuning split carved from the train set, never on dev. Each (model, task, method) keeps the
configuration with the best mean tuning-split score; the final grid runs it on the study's own seeds (disjoint from
the tuning seeds) and is scored on dev. Fewer than MIN_SEEDS tuning seeds still run, with a warning: one seed's luck
can pick the configuration (Bouthillier et al. 2021).

Tuning records live in OUT/tuning/runs/, where no leaderboard looks; the selection, with every configuration's
scores, in OUT/tuning/selection.json. A rerun skips the tuning runs that have records and selects again.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from pathlib import Path
from typing import Any, Callable, Sequence

from suite.api.errors import BadInput, SuiteError
from suite.api.method_facts import METHODS
from suite.api.tasks import get_task
from suite.grid.plan import parse_assignment
from suite.grid.store import Store, atomic_write
from suite.run.layout import SELECTION, OutputFolder, SelectionFile, own_folder, state_json
from suite.run.settings import RunConfig, check_seeds
from suite.stats.evp import MIN_TUNING_SEEDS

__all__ = ["ALL", "MIN_SEEDS", "TuningIncomplete", "TuningPlan", "apply_settings", "budget_text", "check_space",
           "configurations", "plan_tuning_runs", "protocol_train", "run_tuning_stage", "select_configurations",
           "selected_jobs", "selected_where_known", "settings_text", "tuning_notes", "write_selection"]
# (what the rest of the suite uses; other names are this module's own)

DEFAULT_SPACE = "default"         # the space every method gets; a method's own entries add to it (or replace a key)
ALL = "all"                       # `budget: all`: every method's whole grid
MAX_CONFIGURATIONS = 10_000       # configurations one method's space may hold (300 x 300 x 300: 6.2 GB in a dry run)
MIN_SEEDS = MIN_TUNING_SEEDS      # fewer tuning seeds than this: the selection may be one seed's luck
# settings that change which rows are tuned on or scored: the protocol fixes them, a search space may not vary them
FIXED_BY_PROTOCOL = ("holdout", "holdout_seed", "test_holdout", "carve", "data_seed", "subset_draw",
                     "max_eval_samples")

Cell = tuple[str, str, str]  # (model, task, method): what one selection is made for


class TuningIncomplete(SuiteError):
    """Some (model, task, method) has no selected configuration (tuning runs missing or all failed): its final runs
    cannot start."""


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def _assignment(key: str, values: list) -> str:
    return f"{key}={','.join(_text(v) for v in values)}"


def check_space(tune, grids: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
    """The search space names registered methods, and each key is a training setting or the owning method's own
    hyper-parameter (the default space: training settings only) with values of the right type. `grids`: (where,
    the training settings it gives) of the study's `also:` grids, none of which may set a searched training setting:
    the selected value replaces it in every grid that runs the cell, so a grid's own epochs (a data-efficiency
    curve's) would be lost without a word."""
    check_seeds(list(tune.seeds))
    searched = {key.split(".", 1)[1]: f"tune.space.{owner}.{key}" for owner, entries in tune.space.items()
                for key in entries if key.startswith("train.")}
    for where, train in grids:
        for name in sorted(set(train) & set(searched)):
            raise BadInput(f"{searched[name]}: {where} sets {name} on purpose, and the value tuning selects replaces "
                           f"it in every grid that runs the cell; search it only where no grid sets it, or drop "
                           f"{where}.{name}")
    for owner, entries in tune.space.items():
        method = None if owner == DEFAULT_SPACE else METHODS.canonical(owner)
        if not entries:
            raise BadInput(f"tune.space.{owner}: no keys; give KEY: [values], e.g. train.lr: [5.0e-5, 1.0e-4]")
        for key, values in entries.items():
            where = f"tune.space.{owner}.{key}"
            if not values:
                raise BadInput(f"{where}: no values to try")
            try:
                target, name, _ = parse_assignment(_assignment(key, values), sweep=True)
            except BadInput as exc:
                raise BadInput(f"{where}: {exc}") from None
            if target == "train" and name in FIXED_BY_PROTOCOL:
                raise BadInput(f"{where}: the protocol fixes which rows are tuned on and scored; "
                               f"{', '.join('train.' + k for k in FIXED_BY_PROTOCOL)} cannot be searched")
            if target != "train" and target != method:
                own = f"train.KEY and {method}.KEY" if method else "training settings (train.KEY) only; a method's " \
                                                                    "own hyper-parameters go under its name"
                raise BadInput(f"{where}: the {owner} space holds {own}")


def protocol_train(tune, train: dict[str, Any]) -> dict[str, Any]:
    """A study's train: section with the tuning split declared by its tune: block (the final runs carve it too, so
    that both stages train on the same rows and early stopping has a split to read)."""
    given = train.get("holdout")
    if given is not None and given != tune.holdout:
        raise BadInput(f"train.holdout={given:g} and tune.holdout={tune.holdout:g} disagree: declare the tuning "
                       "split once, in tune:")
    protocol = {"holdout": tune.holdout}
    if tune.holdout_seed is not None:
        protocol["holdout_seed"] = tune.holdout_seed
    return {**train, **protocol}


def method_space(tune, method: str) -> dict[str, list]:
    """The default space with the method's own entries added (an own entry for the same key replaces it)."""
    space = dict(tune.space.get(DEFAULT_SPACE, {}))
    for owner, entries in tune.space.items():
        if owner != DEFAULT_SPACE and METHODS.canonical(owner) == method:
            space.update(entries)
    return space


def shared_keys(tune, space: dict[str, list]) -> list[str]:
    """The keys of a method's space whose every value each method must try: the default space's (training settings
    every method searches), and train.lr in any case."""
    shared = set(tune.space.get(DEFAULT_SPACE, {})) | {"train.lr"}
    return [k for k in space if k in shared]


def configurations(tune, method: str) -> list[dict[str, Any]]:
    """The method's configurations: its whole grid under `budget: all`; else exactly `tune.budget` of them, all of
    its points when it has that many, a seeded draw when it has more (`tune.draw`: stratified, each point of the
    shared grid at least once, or uniform); fewer is refused (the budget must be the same for every method)."""
    space = method_space(tune, method)
    if "train.lr" not in space:
        raise BadInput(f"tune.space: {method} has no train.lr to search; give it in tune.space.default (every "
                       "method) or tune.space.{method}")
    keys = list(space)
    size = math.prod(len(dict.fromkeys(space[k])) for k in keys)
    if size > MAX_CONFIGURATIONS:
        raise BadInput(f"tune.space: {method}'s space has {size:,} configurations "
                       f"({' x '.join(f'{len(set(space[k]))} {k}' for k in keys)}), beyond the suite's limit of "
                       f"{MAX_CONFIGURATIONS:,} per method; give fewer values")
    points = [dict(zip(keys, combo)) for combo in itertools.product(*(list(dict.fromkeys(space[k])) for k in keys))]
    if tune.budget == ALL or len(points) == tune.budget:
        return points
    if len(points) < tune.budget:
        raise BadInput(f"tune.budget={tune.budget}: {method}'s space has only {len(points)} configuration(s) "
                       f"({' x '.join(f'{len(set(space[k]))} {k}' for k in keys)}); every method gets the same "
                       "budget, so lower the budget, give its space more values, or give `budget: all` (every "
                       "method its whole grid)")
    import numpy as np

    rng = np.random.default_rng([tune.draw_seed, zlib.crc32(method.encode())])  # repeatable: seed and name
    if tune.draw == "uniform":  # the draw the quick-preset study ran
        return [points[i] for i in sorted(rng.choice(len(points), size=tune.budget, replace=False))]
    return _stratified(tune, method, space, points, rng)


def _stratified(tune, method: str, space: dict[str, list], points: list[dict[str, Any]], rng) -> list[dict]:
    """`tune.budget` points, every stratum (a point of the shared keys: a learning rate) at least once and the
    strata as even as the budget allows: rounds that take one point from each stratum, strata and points within
    them in a seeded order."""
    keys = shared_keys(tune, space)
    strata: dict[tuple, list[int]] = {}
    for i, point in enumerate(points):
        strata.setdefault(tuple(_text(point[k]) for k in keys), []).append(i)
    if tune.budget < len(strata):
        raise BadInput(f"tune.budget={tune.budget}: the stratified draw gives every method each of the "
                       f"{len(strata)} points of {' x '.join(keys)} at least once, which {method} cannot have in "
                       f"{tune.budget} configurations; raise the budget to {len(strata)} or more, or give "
                       "`budget: all` (every method its whole grid)")
    queues = [[int(i) for i in rng.permutation(idx)] for idx in strata.values()]
    chosen: list[int] = []
    while len(chosen) < tune.budget:
        for q in rng.permutation(len(queues)):
            if queues[q] and len(chosen) < tune.budget:
                chosen.append(queues[q].pop(0))
    return [points[i] for i in sorted(chosen)]


def tuning_notes(tune, points: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Warnings on a tuning stage that still runs: fewer than MIN_SEEDS tuning seeds; methods that never try some
    value of the shared grid (a uniform draw). `points`: method -> its configurations."""
    notes = []
    if len(tune.seeds) < MIN_SEEDS:
        notes.append(f"the selection rests on {len(tune.seeds)} tuning seed(s), fewer than {MIN_SEEDS}: one seed's "
                     "luck can pick the configuration (Bouthillier et al. 2021); give tune.seeds at least "
                     f"{MIN_SEEDS} seeds")
    unseen = []
    for method, tried in points.items():
        space = method_space(tune, method)
        missing = [f"{k}={_text(v)}" for k in shared_keys(tune, space) for v in dict.fromkeys(space[k])
                   if not any(p[k] == v for p in tried)]
        if missing:
            unseen.append(f"{method} never tries {', '.join(missing)}")
    if unseen:
        notes.append(f"the {tune.draw} draw of {tune.budget} configurations is equal in count, "
                     f"not in kind: {'; '.join(unseen)}. `draw: stratified` or `budget: all` gives every method "
                     "each of them")
    return notes


def budget_text(tune, counts: dict[str, int]) -> str:
    """How many configurations each method gets (`counts`: method -> number)."""
    if tune.budget != ALL:
        return f"{tune.budget} configurations per method"
    return "every method's whole grid (" + ", ".join(f"{m} {n}" for m, n in counts.items()) + " configurations)"


def apply_settings(job: RunConfig, settings: dict[str, Any]) -> RunConfig:
    """The job with a configuration's training settings and method hyper-parameters, checked as the grid checks."""
    train, hparams = {}, dict(job.hparams)
    for key, value in settings.items():
        target, name, (converted,) = parse_assignment(f"{key}={_text(value)}", sweep=False)
        if target == "train":
            train[name] = converted
        elif target == job.method:
            hparams[name] = converted
    cls = METHODS.get(job.method)
    cls(cls.Config(**hparams))  # validates
    t = dataclasses.replace(job.train, **train)
    t.validate()
    return dataclasses.replace(job, hparams=hparams, train=t)


@dataclasses.dataclass
class Candidate:
    settings: dict[str, Any]          # assignment key (train.lr, scores_dropout.p) -> value
    jobs: dict[int, RunConfig]        # tuning seed -> its run


@dataclasses.dataclass
class TuningPlan:
    tune: Any
    store: Store
    cells: dict[Cell, list[Candidate]]
    notes: list[str] = dataclasses.field(default_factory=list)  # warnings: it runs, but see docs/protocol.md

    @property
    def jobs(self) -> list[RunConfig]:
        found = {j.hash: j for cands in self.cells.values() for c in cands for j in c.jobs.values()}
        return list(found.values())

    @property
    def selection_path(self) -> Path:
        return self.store.root / SELECTION  # OUT/tuning/selection.json (suite.run.layout)


def plan_tuning_runs(tune, final_jobs: list[RunConfig], final_seeds: list[int], out: str | Path) -> TuningPlan:
    """The tuning runs of every (model, task, method) of the final grid: its configurations x the tuning seeds,
    each based on the cell's first final job (its grid's training settings, the tuning split included)."""
    overlap = sorted(set(tune.seeds) & set(final_seeds))
    if overlap:
        raise BadInput(f"tune.seeds and the final grid's seeds share {', '.join(map(str, overlap))}: a configuration "
                       "selected on a seed would be scored on it again. Give the final grid (seeds:, --seeds) seeds "
                       "that tune.seeds does not list")
    bases: dict[Cell, RunConfig] = {}
    for job in final_jobs:
        bases.setdefault((job.model, job.task, job.method), job)
    points, errors = {}, []
    for method in dict.fromkeys(cell[2] for cell in bases):
        try:
            points[method] = configurations(tune, method)
        except BadInput as exc:
            errors.append(str(exc))
    if errors:
        raise BadInput("\n".join(errors))
    cells = {}
    for cell, base in bases.items():
        base = dataclasses.replace(base, outputs=None)  # tuning runs leave no model or test predictions
        cells[cell] = [Candidate(settings, {seed: apply_settings(dataclasses.replace(base, seed=seed), settings)
                                            for seed in tune.seeds})
                       for settings in points[cell[2]]]
    return TuningPlan(tune, Store(OutputFolder(out).tuning.root), cells, tuning_notes(tune, points))


def _tune_score(store: Store, job: RunConfig) -> float | None:
    """A tuning run's tuning-split score (`RunRecord.tune_score`: NaN when it failed); None when it has no record
    yet."""
    rec = store.read(job.filename)
    return None if rec is None else rec.tune_score


def select_configurations(plan: TuningPlan) -> dict[str, Any]:
    """Every configuration's tuning-split scores and each cell's choice by the mean over tuning seeds (dev is never
    read). A configuration with a failed run cannot be chosen; a cell with runs still missing has no choice yet."""
    import numpy as np

    cells = []
    for (model, task, method), candidates in plan.cells.items():
        sign = 1.0 if get_task(task).higher_is_better else -1.0
        rows, missing = [], 0
        for c in candidates:
            scores = {seed: _tune_score(plan.store, job) for seed, job in c.jobs.items()}
            missing += sum(v is None for v in scores.values())
            complete = all(v is not None and not math.isnan(v) for v in scores.values())
            rows.append({"settings": c.settings, "scores": {str(s): v for s, v in scores.items()},
                         "mean": float(np.mean(list(scores.values()))) if complete else None})
        eligible = [r for r in rows if r["mean"] is not None]
        if missing:
            selected, reason = None, f"{missing} tuning run(s) have no record yet"
        elif not eligible:
            selected, reason = None, "every configuration has a failed tuning run"
        else:
            best = max(eligible, key=lambda r: sign * r["mean"])  # ties: the first configuration
            selected, reason = best["settings"], "best mean tuning-split score"
        cells.append({"model": model, "task": task, "method": method, "higher_is_better": sign > 0,
                      "configurations": rows, "selected": selected, "reason": reason})
    tune = plan.tune
    protocol = {"holdout": tune.holdout, "holdout_seed": tune.holdout_seed, "seeds": list(tune.seeds),
                "budget": tune.budget, "draw_seed": tune.draw_seed, "draw": tune.draw if tune.budget != ALL else None,
                "space": {method: method_space(tune, method) for method in dict.fromkeys(c[2] for c in plan.cells)},
                "scored_on": "tuning split (train.holdout), never dev"}
    return {"protocol": protocol, "cells": cells}


def with_other_cells(own: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    """A picked run's selection merged into the whole study's: its own cells replace the study's (they are what it
    ran), in the study's order, so that the file and the report's tuning section read the same whichever part ran
    last; cells only the run has come after. Search spaces of both, in the study's order."""
    def key(cell: dict) -> Cell:
        return cell["model"], cell["task"], cell["method"]

    mine = {key(c): c for c in own["cells"]}
    theirs = {key(c) for c in whole["cells"]}
    space = {**whole["protocol"]["space"], **own["protocol"]["space"]}
    return {"protocol": {**own["protocol"], "space": space},
            "cells": [mine.get(key(c), c) for c in whole["cells"]]
            + [c for c in own["cells"] if key(c) not in theirs]}


def write_selection(plan: TuningPlan, selection: dict[str, Any]) -> Path:
    """Through its model (suite.run.layout.SelectionFile), which the report reads it with."""
    path = plan.selection_path
    own_folder(path.parent)  # OUT/tuning: a link planted there is replaced, never written through
    blob = state_json(SelectionFile.model_validate(selection))
    atomic_write(path, lambda fh: fh.write(blob))
    return path


def selected_jobs(final_jobs: list[RunConfig], selection: dict[str, Any]) -> list[RunConfig]:
    """The final grid with each cell's selected configuration; TuningIncomplete names the cells without one."""
    chosen = {(c["model"], c["task"], c["method"]): c for c in selection["cells"]}
    lacking = [c for c in chosen.values() if c["selected"] is None]
    if lacking:
        raise TuningIncomplete("no configuration selected for " + "; ".join(
            f"{c['task']}/{c['method']} ({c['reason']})" for c in lacking)
            + ". Give the same command again to run what is missing; a configuration whose tuning runs failed is "
              "never selected")
    jobs = [apply_settings(j, chosen[(j.model, j.task, j.method)]["selected"]) for j in final_jobs]
    return list({j.hash: j for j in jobs}.values())


def selected_where_known(final_jobs: list[RunConfig], tuning: TuningPlan) -> list[RunConfig]:
    """The final grid as far as its tuning records decide it: each cell with a selection at its selected
    configuration, a cell whose tuning is unfinished at the grid's own settings (a job no record can have yet)."""
    chosen = {(c["model"], c["task"], c["method"]): c["selected"] for c in select_configurations(tuning)["cells"]}
    jobs = [apply_settings(j, chosen[j.model, j.task, j.method]) if chosen.get((j.model, j.task, j.method)) else j
            for j in final_jobs]
    return list({j.hash: j for j in jobs}.values())


def run_tuning_stage(tuning: TuningPlan, final_jobs: list[RunConfig], run_jobs: Callable,
                     whole: TuningPlan | None = None, say: Callable[[str], None] = print) -> list[RunConfig]:
    """Run the tuning jobs that have no record (`run_jobs(jobs, store)` -> GridResult), write the selection, and
    return the final grid's jobs with it. `whole`: the whole study's tuning plan when the flags picked part of it:
    the selection file holds this run's cells and, beside them, the study's other cells as its records select them
    (none dropped, none kept from an older file)."""
    from suite.grid.executors import status_table

    tune = tuning.tune
    counts = {cell[2]: len(cands) for cell, cands in tuning.cells.items()}
    say(f"tuning: {len(tuning.jobs)} runs ({budget_text(tune, counts)} x {len(tune.seeds)} tuning seed(s)) -> "
        f"{tuning.store.runs}")
    for note in tuning.notes:
        say(f"warning: {note}")
    say(status_table(run_jobs(tuning.jobs, tuning.store)))
    own = select_configurations(tuning)
    written = write_selection(tuning, with_other_cells(own, select_configurations(whole)) if whole is not None
                              else own)
    say(f"tuning: selection written to {written}")
    return selected_jobs(final_jobs, own)


def settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_text(v)}" for k, v in settings.items())
