"""The power table of `python -m suite plan`: before anything runs, how likely each task's primary comparisons are
to end in each verdict under the study's design (its seeds, or its until-decided looks), at a true difference of 0,
at the margin and at twice the margin, and what it would take to decide a true difference of 0 with the study's
`power: target:` probability (default 80%): the seeds (a sequential design: the cap), or the margin at the planned
seeds.

The probabilities are simulated (`suite.stats.design_power`) from each task's noise: `seed_sd`, the sd of one seed's
paired difference, and `example_se`, the sd of the dev-set offset every seed shares. Declared in the study's
`power: tasks:` section, or else estimated from pilot records (`plan --pilot DIR`, else the study's `power: pilot:`,
else its own `out`):

- from the pilot's comparisons of the primary methods with the reference on the task: the median of their seed
  variances (paired seeds, scores only) and the median of their shared dev-example variances (`compare_runs` over the
  prediction sidecars of their first `PILOT_SEEDS` paired seeds, for at most `PILOT_COMPARISONS` comparisons: the
  jackknife of a correlation metric takes seconds per comparison);
- else from the reference's own seeds split in two halves compared with each other (at least 4 seeds): two runs of
  one method differ only by noise, but identical methods share no dev-set part, so that part is a lower bound.

A pilot folder's runs are grouped per task and method by their setting (everything but the seed); the setting with
the most seeds is the one compared (the study's own grid, not a data-efficiency curve beside it).
"""
from __future__ import annotations

import json
import math
import statistics
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.api.errors import BadInput
from suite.stats.design_power import (
    MOST_SEEDS,
    SIMULATIONS,
    Chances,
    Noise,
    equivalence_limit,
    margin_to_decide,
    seeds_to_decide,
    simulate,
)
from suite.stats.sequential import Design, family_alpha

__all__ = ["TaskPlan", "power_lines", "task_plans"]  # what the rest of the suite uses; other names are its own

TARGET = 0.8
PILOT_SEEDS = 5          # paired seeds per comparison for the pilot's dev-example part
PILOT_COMPARISONS = 3    # comparisons per task for it
SEED = 20260101          # of the simulations: the same study prints the same table


@dataclass
class TaskPlan:
    """One task's primary comparisons as the design will test them: their count, margin, noise and its source."""

    task: str
    comparisons: int
    margin: float
    noise: Noise | None
    source: str


def _setting(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True, default=str)


def _pilot_runs(folder: Path) -> dict[tuple[str, str], dict[int, dict]]:
    """{(task, method): {seed: ok record}} of the setting with the most seeds, from a folder's runs/."""
    from suite.grid.store import iter_records
    from suite.run.layout import OutputFolder

    by_setting: dict[tuple[str, str], dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a damaged record is the report's to name; here it is left out
        for rec in iter_records(OutputFolder(folder).runs):
            config = rec.get("config") or {}
            if rec.get("status") == "ok" and "task" in config and "method" in config:
                by_setting[config["task"], config["method"]][_setting(config)][int(config["seed"])] = rec
    return {cell: max(settings.values(), key=len) for cell, settings in by_setting.items()}


def _outcome(rec: dict):
    from suite.stats.evidence import RunOutcome

    sidecar = rec.get("predictions")
    return RunOutcome(rec["final"]["score"] * 100, Path(rec["_path"]).parent / sidecar if sidecar else None)


def _shared_se(task: str, a: dict[int, dict], b: dict[int, dict], identity: tuple) -> float:
    """The shared dev-example se of a comparison's first PILOT_SEEDS paired seeds (NaN without sidecars)."""
    from suite.stats.evidence import bootstrap_seed, compare_runs

    seeds = sorted(set(a) & set(b))[:PILOT_SEEDS]
    ev = compare_runs(task, {s: _outcome(a[s]) for s in seeds}, {s: _outcome(b[s]) for s in seeds},
                      seed=bootstrap_seed(*identity))
    return ev.example_se if ev.has_examples else math.nan


def _seed_sd(a: dict[int, dict], b: dict[int, dict]) -> float:
    seeds = sorted(set(a) & set(b))
    diffs = [a[s]["final"]["score"] * 100 - b[s]["final"]["score"] * 100 for s in seeds]
    return statistics.stdev(diffs) if len(diffs) >= 2 else math.nan


def _from_comparisons(task: str, methods: list[str], reference: str, runs) -> tuple[Noise, str] | None:
    ref = runs.get((task, reference), {})
    pairs = [(m, runs[task, m]) for m in methods if len(set(runs.get((task, m), {})) & set(ref)) >= 2]
    if not pairs:
        return None
    seed_var = statistics.median(_seed_sd(a, ref) ** 2 for _, a in pairs)
    shared = [_shared_se(task, a, ref, (task, m, reference)) for m, a in pairs[:PILOT_COMPARISONS]]
    shared = [s ** 2 for s in shared if math.isfinite(s)]
    counts = sorted(len(set(a) & set(ref)) for _, a in pairs)
    seeds = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
    where = (f"{len(pairs)} comparison(s), {seeds} seeds; dev-set part from "
             + (f"{len(shared)}" if shared else "none (no prediction sidecars): 0"))
    return Noise(math.sqrt(seed_var), math.sqrt(statistics.median(shared)) if shared else 0.0), where


def _from_halves(task: str, reference: str, runs) -> tuple[Noise, str] | None:
    from suite.stats.evidence import bootstrap_seed, compare_runs

    ref = runs.get((task, reference), {})
    seeds = sorted(ref)
    half = len(seeds) // 2
    if half < 2:
        return None
    a = {i: _outcome(ref[s]) for i, s in enumerate(seeds[:half])}
    b = {i: _outcome(ref[s]) for i, s in enumerate(seeds[half:2 * half])}
    ev = compare_runs(task, a, b, seed=bootstrap_seed(task, reference, "halves"))
    if not math.isfinite(ev.seed_sd):
        return None
    return (Noise(ev.seed_sd, ev.example_se),
            f"{reference}'s {2 * half} seeds in two halves (dev-set part: a lower bound)")


def _primary(plan) -> list:
    from suite.grid.until_decided import primary_comparisons

    return primary_comparisons(plan)


def task_plans(plan, primary: list, pilot: str | None = None) -> list[TaskPlan]:
    """Each task of the primary comparisons with its margin and noise (declared, else from the pilot records in
    `pilot`, else in the study's `power: pilot:`, else in its own output folder)."""
    from suite.grid.until_decided import margin_for

    study = plan.request.study
    section = study.power
    folder = Path(pilot or (section.pilot if section is not None and section.pilot else plan.request.out))
    reference = primary[0].reference
    by_task: dict[str, list[str]] = defaultdict(list)
    for c in primary:
        by_task[c.task].append(c.method)
    declared = declared_noise(section.tasks if section is not None else {}, list(by_task), plan.request.source)
    runs = None
    out = []
    for task, methods in by_task.items():
        margin = margin_for(study.report.margin, task)
        given = declared.get(task) or declared.get("default")
        if given is not None:
            out.append(TaskPlan(task, len(methods), margin, Noise(given.seed_sd, given.example_se),
                                "declared (power: tasks:)"))
            continue
        if runs is None:
            runs = _pilot_runs(folder)
        found = _from_comparisons(task, methods, reference, runs) or _from_halves(task, reference, runs)
        noise, where = found if found else (None, f"no records in {folder}: declare power: tasks: {task}: or "
                                                   "give --pilot DIR")
        out.append(TaskPlan(task, len(methods), margin, noise, f"{folder}: {where}" if found else where))
    return out


def declared_noise(declared: dict, tasks: list[str], source: str | None = None) -> dict:
    """The `power: tasks:` section keyed by task name (`SST-2` read as `sst2`); BadInput naming the valid names for
    a key that is no task of the primary comparisons (a misspelt one was ignored, and the real task printed `?`)."""
    from suite.api.errors import UnknownNameError
    from suite.api.tasks import get_task

    where = f"{source}: power: tasks" if source else "power: tasks"
    out = {}
    for key, noise in declared.items():
        if key == "default":
            out[key] = noise
            continue
        try:
            name = get_task(key).name
        except UnknownNameError as exc:
            raise BadInput(f"{where}: {exc}, or default") from None
        if name not in tasks:
            raise BadInput(f"{where}: {key!r} is not a task of the study's primary comparisons; declare the noise of "
                           f"{', '.join(tasks)} (or default)")
        out[name] = noise
    return out


def design_of(plan, primary: list) -> tuple[Design, str]:
    """The design each primary comparison is decided by, and a line that says what it is."""
    report = plan.request.study.report
    alpha = 0.05 if report.alpha is None else report.alpha
    each = family_alpha(alpha, len(primary))
    schedule = plan.request.schedule
    head = f"{len(primary)} primary comparison(s), alpha {alpha:g} over the family,"
    if schedule is not None:
        design = Design(schedule.looks, each, spending=schedule.spending, futility=schedule.futility)
        return design, (f"{head} Bonferroni ({each:.3g} each) spent over looks at "
                        f"{', '.join(map(str, schedule.looks))} seeds ({schedule.spending}, futility "
                        f"{schedule.futility:g})")
    seeds = len(plan.request.seeds)
    design = Design((seeds,), each, futility=0.0)
    return design, (f"{head} Holm (the table tests at its first step, {each:.3g} each: later steps are looser, so "
                    f"decisions can only be likelier); one look at {seeds} seeds")


def _percent(p: float) -> str:
    return f"{100 * p:.1f}%"


def _chance_rows(t: TaskPlan, design: Design) -> list[list[str]]:
    sequential = len(design.looks) > 1
    rows = []
    for factor, label in ((0.0, "0"), (1.0, "margin"), (2.0, "2x margin")):
        c: Chances = simulate(t.noise, design, factor * t.margin, t.margin, SIMULATIONS, SEED)
        row = [t.task, f"{factor * t.margin:g} ({label})" if factor else "0", _percent(c.difference),
               _percent(c.equivalent), _percent(c.undecided)]
        rows.append(row + ([_percent(c.futility), f"{c.mean_seeds:.1f}"] if sequential else []))
    return rows


def _reach(t: TaskPlan, design: Design, target: float) -> list[str]:
    seeds = seeds_to_decide(t.noise, design, t.margin, target, seed=SEED)
    margin = margin_to_decide(t.noise, design, target, seed=SEED)
    if math.isfinite(seeds):
        text = f"{seeds:.0f}"
    elif equivalence_limit(t.noise, design, t.margin) + design.alpha < target:
        text = "never (dev set)"
    else:
        text = f"over {MOST_SEEDS}"
    return [text, f"{margin:.2f}"]


def power_lines(plan, pilot: str | None = None, target: float | None = None) -> list[str]:
    """The power table as lines (BadInput when the grid has no primary comparison to plan). `pilot`: a folder of
    records that replaces the study's `power: pilot:`; `target`: its `power: target:`."""
    from tabulate import tabulate

    try:
        primary = _primary(plan)
    except BadInput as exc:   # no primary comparison, a sweep in one's arm, no reference on a task
        raise BadInput(f"plan: no power table: {exc}") from None
    design, head = design_of(plan, primary)
    section = plan.request.study.power
    if target is None:
        target = TARGET if section is None or section.target is None else section.target
    tasks = task_plans(plan, primary, pilot)
    known = [t for t in tasks if t.noise is not None]
    sequential = len(design.looks) > 1
    what = "cap" if sequential else "seeds"
    inputs = [[t.task, t.comparisons, f"{t.noise.seed_sd:.2f}" if t.noise else "?",
               f"{t.noise.example_se:.2f}" if t.noise else "?", f"{t.margin:g}",
               *(_reach(t, design, target) if t.noise else ["", ""]), t.source] for t in tasks]
    lines = ["power before running (docs/statistics.md, \"Power before running\"):", f"  design: {head}",
             f"  {SIMULATIONS} simulated comparisons per probability: Monte-Carlo error at most "
             f"{50 / math.sqrt(SIMULATIONS):.1f} points", "",
             tabulate(inputs, headers=["task", "comparisons", "seed_sd", "example_se", "margin",
                                       f"{what} for {target:.0%} at 0", f"margin for {target:.0%} at 0", "noise from"],
                      tablefmt="simple")]
    if known:
        headers = ["task", "true difference", "better or worse", "equivalent", "undecided"]
        headers += ["of which futility", "mean seeds"] if sequential else []
        rows = [row for t in known for row in _chance_rows(t, design)]
        lines += ["", "probability of each verdict of one comparison, by its true difference (x100):",
                  tabulate(rows, headers=headers, tablefmt="simple")]
    lines += ["", f"better or worse: a difference is claimed (at a true difference of 0, falsely); equivalent: "
                  f"within the margin; {what} for {target:.0%} at 0: the fewest "
                  + ("seeds of the cap (looks at the same fractions of it)" if sequential else "seeds")
                  + f" with which a true difference of 0 is decided with probability {target:.0%} (never: the "
                  "dev-set noise every seed shares keeps it below that with any number of seeds); margin for "
                  f"{target:.0%} at 0: the smallest margin with which the planned seeds do"]
    if not sequential and plan.request.study.until_decided is not None:
        lines.append("the study declares until_decided: add --until-decided for its sequential design")
    return lines
