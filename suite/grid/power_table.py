"""The power table of `python -m suite plan`: before anything runs, how likely each task's primary comparisons are
to end in each verdict under the study's design (its seeds, or its until-decided looks), at a true difference of 0,
at the margin and at twice the margin, and what it would take to decide a true difference of 0 with the study's
`power: target:` probability (default 80%): the seeds (a sequential design: the cap), or the margin at the planned
seeds.

The probabilities are simulated (`suite.stats.design_power`) from each task's noise: `seed_sd`, the sd of one seed's
paired difference, and `example_se`, the sd of the dev-set offset every seed shares. Declared in the study's
`power: tasks:` section, or else estimated from pilot records (`plan --pilot DIR`, else the study's `power: pilot:`,
else its own `out`):

- from the pilot's comparisons of the primary methods with the reference on the task, each over all its paired
  seeds as the report's test splits it (`compare_runs`: the seed sd over the seeds where neither run degenerated, the
  shared dev-example part from every kept prediction sidecar): the median over the comparisons of each, printed with
  their range over the comparisons (the table's headline, whether a decision at 0 is reachable at all, turns on
  example_se: the line under the table gives the value beyond which no number of seeds reaches equivalence);
- else from the reference's own seeds split in two halves compared with each other (at least 4 seeds): two runs of
  one method differ only by noise, but identical methods share no dev-set part, so that part is a lower bound.

A pilot folder's runs are grouped per task and method by their setting (everything but the seed); the setting with
the most seeds is the one compared (the study's own grid, not a data-efficiency curve beside it). Runs that scored a
held-out test split (`train.test_holdout`) are compared on it, as the report's verdicts are; others on dev.
"""
from __future__ import annotations

import json
import math
import statistics
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from suite.api.errors import BadInput
from suite.grid.power_comparisons import ComparisonNoise, comparison_lines, family_lines
from suite.run.record import HELDOUT
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
from suite.stats.report_options import DEFAULT_ALPHA
from suite.stats.sequential import Design, family_alpha

if TYPE_CHECKING:
    from suite.stats.evidence import RunOutcome

__all__ = ["pilot_folder", "power_lines"]  # what the rest of the suite uses; other names are its own

TARGET = 0.8
SEED = 20260101          # of the simulations: the same study prints the same table
MIN_PAIRED = 2           # seeds a primary method and the reference share, for a seed sd of their differences
MIN_HALF = 2             # seeds in each half of the reference's own, for a seed sd between the halves


@dataclass
class TaskPlan:
    """One task's primary comparisons as the design will test them: their count, margin, noise and its source."""

    task: str
    comparisons: int
    margin: float
    noise: Noise | None
    source: str
    seed_sd_range: tuple[float, float] | None = None      # over the pilot's comparisons (None: declared)
    example_se_range: tuple[float, float] | None = None
    split: str = "dev"      # what the verdicts read: "dev", or "heldout" (train.test_holdout); the pilot's too
    comparisons_noise: tuple[ComparisonNoise, ...] = ()   # each pilot comparison's own (none: declared, halves)
    step_s: tuple[float, ...] = ()   # seconds per optimizer step of the pilot's compared runs (as recorded)


def pilot_outcomes(folder: Path, step_seconds: dict | None = None) -> dict[tuple[str, str, str], dict[int, RunOutcome]]:
    """{(split, task, method): {seed: the ok run's outcome}} of the setting with the most seeds, from a folder's
    runs/: each run as every verdict scores it (`RunOutcome.of`), on the split it is scored on. `step_seconds`, when
    given, gets {(split, task): [seconds per optimizer step of each of those runs that recorded it]}."""
    from suite.grid.store import iter_records
    from suite.run.layout import OutputFolder
    from suite.stats.evidence import RunOutcome

    by_setting: dict[tuple[str, str, str], dict[str, dict[int, RunOutcome]]] = defaultdict(lambda: defaultdict(dict))
    steps: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a damaged record is the report's to name; here it is left out
        for path, rec in iter_records(OutputFolder(folder).runs):
            if rec.ok and rec.seed is not None:
                setting = json.dumps(rec.setting, sort_keys=True, default=str)
                cell = rec.scored.name, rec.task, rec.method
                by_setting[cell][setting][int(rec.seed)] = RunOutcome.of(rec, path.parent)
                if math.isfinite(rec.timing.step_s):
                    steps[(*cell, setting)].append(rec.timing.step_s)
    chosen = {cell: max(settings, key=lambda k: len(settings[k])) for cell, settings in by_setting.items()}
    if step_seconds is not None:
        for (split, task, method), setting in chosen.items():
            step_seconds.setdefault((split, task), []).extend(steps[split, task, method, setting])
    return {cell: by_setting[cell][setting] for cell, setting in chosen.items()}


def planned_split(plan, task: str) -> str:
    """The split a task's verdicts will read, from its planned jobs: the held-out test split when they keep one
    (`train.test_holdout`; their records then hold its scores, `RunRecord.scored`), else dev."""
    held = [bool(j.train.test_holdout) for j in plan.jobs if j.task == task]
    return HELDOUT if held and all(held) else "dev"


def _on_split(runs: dict, split: str) -> dict[tuple[str, str], dict[int, RunOutcome]]:
    return {(task, method): seeds for (on, task, method), seeds in runs.items() if on == split}


@dataclass(frozen=True)
class Found:
    """A task's noise from a pilot's comparisons: the medians, their ranges over the comparisons, and a line."""

    noise: Noise
    where: str
    seed_sd_range: tuple[float, float] | None = None
    example_se_range: tuple[float, float] | None = None
    comparisons: tuple[ComparisonNoise, ...] = ()


def _from_comparisons(task: str, methods: list[str], reference: str, runs) -> Found | None:
    """Each primary comparison over all its paired seeds, as the report's test splits it: the seed sd of the seeds
    where neither run degenerated (degenerate pairs leave the score test), the shared dev-example part."""
    from suite.stats.evidence import bootstrap_seed, compare_runs

    ref = runs.get((task, reference), {})
    pairs = [(m, runs[task, m]) for m in methods if len(set(runs.get((task, m), {})) & set(ref)) >= MIN_PAIRED]
    if not pairs:
        return None
    found, each = [], []
    for m, a in pairs:
        seeds = sorted(set(a) & set(ref))
        ev = compare_runs(task, {s: a[s] for s in seeds}, {s: ref[s] for s in seeds},
                          seed=bootstrap_seed(task, m, reference))
        if math.isfinite(ev.seed_sd):
            found.append((ev.seed_sd, ev.example_se if ev.has_examples else math.nan, ev.n_seeds))
            if ev.seed_sd + ev.example_se > 0:   # identical runs have no noise to simulate
                each.append(ComparisonNoise(m, Noise(ev.seed_sd, ev.example_se), ev.n_seeds, ev.n_paired,
                                            ev.has_examples and ev.example_se == 0, ev.degenerate,
                                            ev.degenerate_reference, ev.example_se_interval))
    if not found:
        return None
    seed_sd = [f[0] for f in found]
    shared = [f[1] for f in found if math.isfinite(f[1])]
    counts = sorted(f[2] for f in found)
    seeds = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
    where = (f"{len(found)} comparison(s), {seeds} seeds (where neither run degenerated); dev-set part from "
             + (f"{len(shared)}" if shared else "none (no prediction sidecars): 0"))
    noise = Noise(math.sqrt(statistics.median(s ** 2 for s in seed_sd)),
                  math.sqrt(statistics.median(s ** 2 for s in shared)) if shared else 0.0)
    return Found(noise, where, (min(seed_sd), max(seed_sd)), (min(shared), max(shared)) if shared else None,
                 tuple(each))


def _from_halves(task: str, reference: str, runs) -> Found | None:
    from suite.stats.evidence import bootstrap_seed, compare_runs

    ref = runs.get((task, reference), {})
    seeds = sorted(ref)
    half = len(seeds) // 2
    if half < MIN_HALF:
        return None
    a = {i: ref[s] for i, s in enumerate(seeds[:half])}
    b = {i: ref[s] for i, s in enumerate(seeds[half:2 * half])}
    ev = compare_runs(task, a, b, seed=bootstrap_seed(task, reference, "halves"))
    if not math.isfinite(ev.seed_sd):
        return None
    return Found(Noise(ev.seed_sd, ev.example_se),
                 f"{reference}'s {2 * half} seeds in two halves (dev-set part: a lower bound)")


def _too_few(task: str, methods: list[str], reference: str, runs) -> str:
    """Why a task's records gave no noise: none at all, or too few seeds (a comparison needs 2 paired seeds of a
    primary method and the reference, the reference's halves 4 of its own)."""
    ref = set(runs.get((task, reference), {}))
    paired = max((len(set(runs.get((task, m), {})) & ref) for m in methods), default=0)
    if not ref and not any(runs.get((task, m)) for m in methods):
        return "no records"
    if len(ref) >= 2 * MIN_HALF or paired >= MIN_PAIRED:  # enough seeds, yet no finite seed sd
        return f"no seed sd from the records ({len(ref)} {reference} seeds, {paired} paired)"
    return (f"too few seeds ({len(ref)}, need {2 * MIN_HALF}) of {reference} on {task}, and {paired} paired with a "
            f"primary method (need {MIN_PAIRED})")


def _primary(plan) -> list:
    from suite.grid.until_decided import primary_comparisons

    return primary_comparisons(plan)


def pilot_folder(plan, pilot: str | None = None) -> Path:
    """Where the plan reads its pilot records: `pilot` (`--pilot DIR`), else the study's `power: pilot:`, else its own
    output folder."""
    section = plan.request.study.power
    return Path(pilot or (section.pilot if section is not None and section.pilot else plan.request.out))


def task_plans(plan, primary: list, pilot: str | None = None) -> list[TaskPlan]:
    """Each task of the primary comparisons with its margin and noise (declared, else from the pilot records in
    `pilot`, else in the study's `power: pilot:`, else in its own output folder)."""
    from suite.stats.evidence import per_task

    study = plan.request.study
    section = study.power
    folder = pilot_folder(plan, pilot)
    reference = primary[0].reference
    by_task: dict[str, list[str]] = defaultdict(list)
    for c in primary:
        by_task[c.task].append(c.method)
    declared = declared_noise(section.tasks if section is not None else {}, list(by_task), plan.request.source)
    pilot_runs, step_seconds = None, {}
    out = []
    for task, methods in by_task.items():
        margin = per_task(study.report.margin, task)
        split = planned_split(plan, task)
        given = declared.get(task) or declared.get("default")
        if given is not None:
            out.append(TaskPlan(task, len(methods), margin, Noise(given.seed_sd, given.example_se),
                                "declared (power: tasks:)", split=split))
            continue
        if pilot_runs is None:
            pilot_runs = pilot_outcomes(folder, step_seconds)
        runs = _on_split(pilot_runs, split)   # a split's noise is its own: its examples, its size
        found = _from_comparisons(task, methods, reference, runs) or _from_halves(task, reference, runs)
        if found is None:
            other = {on for on, t, _ in pilot_runs if t == task} - {split}
            why = (f"its records of {task} are scored on {', '.join(sorted(other))}, the verdicts on {split}"
                   if other else _too_few(task, methods, reference, runs))
            out.append(TaskPlan(task, len(methods), margin, None,
                                f"{why} in {folder}: declare power: tasks: {task}: or give --pilot DIR", split=split))
            continue
        out.append(TaskPlan(task, len(methods), margin, found.noise, f"{folder}: {found.where}",
                            found.seed_sd_range, found.example_se_range, split, found.comparisons,
                            tuple(step_seconds.get((split, task), ()))))
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


def _alpha(plan) -> float:
    """The study's alpha over its primary family."""
    report = plan.request.study.report
    return DEFAULT_ALPHA if report.alpha is None else report.alpha


def design_of(plan, primary: list) -> tuple[Design, str]:
    """The design each primary comparison is decided by, and a line that says what it is."""
    alpha = _alpha(plan)
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


def _with_range(value: float | None, spread: tuple[float, float] | None, clipped: int = 0) -> str:
    """A noise input with its range over the pilot's comparisons, and how many of them were estimates clipped at 0:
    "0.18 (0.00-0.58, 2 clipped at 0)"."""
    if value is None:
        return "?"
    return f"{value:.2f}" + (f" ({spread[0]:.2f}-{spread[1]:.2f}" + (f", {clipped} clipped at 0" if clipped else "")
                             + ")" if spread else "")


def out_of_reach(margin: float, design: Design, target: float) -> float:
    """The example_se beyond which no number of seeds decides a true difference of 0 with probability `target`:
    equivalence then needs the shared dev-set offset and its critical value within the margin
    (`suite.stats.design_power.equivalence_limit`: 2 Phi(margin / e - z) - 1 + alpha < target)."""
    from scipy import stats

    z = stats.norm.isf(design.levels(design.looks)[1])
    return float(margin / (z + stats.norm.ppf((1 + target - design.alpha) / 2)))


def _reach_limits(tasks: list[TaskPlan], design: Design, target: float) -> str:
    """"0.23 (margin 1: sst2, mrpc)": the example_se beyond which no seeds decide 0, per margin."""
    by_margin: dict[float, list[str]] = defaultdict(list)
    for t in tasks:
        by_margin[t.margin].append(t.task)
    return "; ".join(f"{out_of_reach(m, design, target):.2f} (margin {m:g}: {', '.join(names)})"
                     for m, names in by_margin.items())


SPLIT_NAMES = {"dev": "dev (each task's dev set)",
               HELDOUT: "the held-out test split carved from train (train.test_holdout)"}


def _splits(tasks: list[TaskPlan]) -> str:
    """The split the verdicts read and the noise is taken on: "dev (...)", or per task where they differ."""
    by_split: dict[str, list[str]] = defaultdict(list)
    for t in tasks:
        by_split[t.split].append(t.task)
    text = "; ".join(f"{SPLIT_NAMES[split]}" + (f": {', '.join(names)}" if len(by_split) > 1 else "")
                     for split, names in by_split.items())
    return f"planned on {text}, the split the verdicts read"


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
    inputs = [[t.task, t.comparisons, _with_range(t.noise.seed_sd if t.noise else None, t.seed_sd_range),
               _with_range(t.noise.example_se if t.noise else None, t.example_se_range,
                           sum(c.clipped for c in t.comparisons_noise)), f"{t.margin:g}",
               *(_reach(t, design, target) if t.noise else ["", ""]), t.source] for t in tasks]
    lines = ["power before running (docs/statistics.md, \"Power before running\"):", f"  design: {head}",
             f"  split: {_splits(tasks)}",
             f"  {SIMULATIONS} simulated comparisons per probability: Monte-Carlo error at most "
             f"{50 / math.sqrt(SIMULATIONS):.1f} points",
             *family_lines(known, design, len(primary), _alpha(plan), SIMULATIONS, SEED), "",
             tabulate(inputs, headers=["task", "comparisons", "seed_sd", "example_se", "margin",
                                       f"{what} for {target:.0%} at 0", f"margin for {target:.0%} at 0", "noise from"],
                      tablefmt="simple")]
    if known:
        headers = ["task", "true difference", "better or worse", "equivalent", "undecided"]
        headers += ["of which futility", "mean seeds"] if sequential else []
        rows = [row for t in known for row in _chance_rows(t, design)]
        lines += ["", "probability of each verdict of one comparison, by its true difference (x100):",
                  tabulate(rows, headers=headers, tablefmt="simple")]
    lines += ["", "seed_sd, example_se: the median over the comparisons (in brackets their range): the seed sd of "
                  "the seeds where neither run degenerated, the dev-set part every seed shares, on the split the "
                  "verdicts use (a held-out test split where the runs scored one, else dev). The headline turns on "
                  "example_se: a decision at 0 is out of reach with any number of seeds once it passes "
                  + _reach_limits(tasks, design, target) + "; seed_sd sets how many seeds reach it below that."]
    lines += ["", f"better or worse: a difference is claimed (at a true difference of 0, falsely); equivalent: "
                  f"within the margin; {what} for {target:.0%} at 0: the fewest "
                  + ("seeds of the cap (looks at the same fractions of it)" if sequential else "seeds")
                  + f" with which a true difference of 0 is decided with probability {target:.0%} (never: the "
                  "dev-set noise every seed shares keeps it below that with any number of seeds); margin for "
                  f"{target:.0%} at 0: the smallest margin with which the planned seeds do"]
    lines += comparison_lines(known, design, target, SEED)
    if not sequential and plan.request.study.until_decided is not None:
        lines.append("the study declares until_decided: add --until-decided for its sequential design")
    return lines
