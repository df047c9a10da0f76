"""`run --until-decided`: seeds where the question is. The grid runs at its starting seeds; then, round after round,
only the primary comparisons that are still undecided get more seeds (both the method and its reference), under
the group-sequential rule of `suite.stats.sequential`, until each one stops for efficacy, equivalence or futility,
or reaches the cap.

Every round goes through the grid's own executor path (`run_grid`): records are written as usual, a job whose record
exists is skipped, so an interrupted loop given the same command again replays its looks from the records and goes
on where it stopped. A look uses only the seeds planned up to it, so records of further seeds change nothing.
The state of every look (seeds, evidence, boundary, decision) is written to OUT/until_decided.json after each round.
"""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from suite.api.errors import BadInput
from suite.grid.executors import GridResult
from suite.grid.store import Store, atomic_write
from suite.run.layout import OutputFolder, UntilDecidedFile, read_state, state_json
from suite.run.record import RunRecord
from suite.run.settings import RunConfig
from suite.stats.looks import next_look
from suite.stats.report_options import DEFAULT_ALPHA, DEFAULT_BASELINE
from suite.stats.sequential import (
    DEFAULT_FUTILITY,
    FUTILITY_MIN_SEEDS,
    SPENDING,
    Design,
    family_alpha,
    plan_looks,
)

# what the rest of the suite uses; other names are this module's own
__all__ = ["Comparison", "Schedule", "closing_lines", "comparisons", "primary_comparisons", "run_planned",
           "run_until_decided", "same_family", "seed_sequence", "still_to_run", "study_schedule"]

DEFAULT_START, DEFAULT_STEP, DEFAULT_CAP = 5, 5, 20
MAX_CAP, MAX_LOOKS = 1000, 50  # seeds and looks a schedule may plan (docs/sequential.md); a cap of 10**9 took 9 GB


@dataclass(frozen=True)
class Schedule:
    """The study's `until_decided:` section: starting seeds, seeds added per round, the cap, the spending function
    and the futility threshold (predictive power below which an undecided comparison stops)."""

    start: int = DEFAULT_START
    step: int = DEFAULT_STEP
    cap: int = DEFAULT_CAP
    spending: str = "obrien-fleming"
    futility: float = DEFAULT_FUTILITY

    def __post_init__(self):
        if self.spending not in SPENDING:
            raise BadInput(f"until_decided.spending: {self.spending!r} is not one of {', '.join(SPENDING)}")
        if not 0 <= self.futility < 1:
            raise BadInput(f"until_decided.futility: {self.futility} must lie in [0, 1) (0: never stop for futility)")
        for key in ("start", "step", "cap"):
            if isinstance(getattr(self, key), bool) or not isinstance(getattr(self, key), int):
                raise BadInput(f"{key}: {getattr(self, key)!r} is not a whole number of seeds")
        if self.cap > MAX_CAP:
            raise BadInput(f"cap: {self.cap:,} seeds is beyond the suite's limit of {MAX_CAP:,} "
                           "(every look and seed is planned up front); give a cap of at most that")
        try:
            looks = plan_looks(self.start, self.step, self.cap)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if len(looks) > MAX_LOOKS:
            raise BadInput(f"start={self.start}, step={self.step}, cap={self.cap} make {len(looks)} "
                           f"looks, beyond the suite's limit of {MAX_LOOKS}; give a larger step")

    @property
    def looks(self) -> tuple[int, ...]:
        return plan_looks(self.start, self.step, self.cap)


def seed_sequence(seeds: list[int], cap: int) -> list[int]:
    """The seeds in the order rounds add them: the grid's own seeds, then the next unused integers, up to the cap."""
    out = list(dict.fromkeys(seeds))[:cap]
    nxt = max(out, default=0) + 1
    while len(out) < cap:
        out.append(nxt)
        nxt += 1
    return out


@dataclass(frozen=True)
class Comparison:
    """One primary comparison: `method` against `reference` on one model and task."""

    model: str
    task: str
    method: str
    reference: str

    @property
    def label(self) -> str:
        model = self.model.rstrip("/").split("/")[-1]
        return f"{self.task}/{self.method} vs {self.reference} ({model})"


@dataclass
class Track:
    """A comparison's looks so far and how it ended."""

    comparison: Comparison
    looks: list[dict[str, Any]] = field(default_factory=list)
    reason: str = "continue"
    verdict: str = "undecided"

    @property
    def open(self) -> bool:
        return self.reason == "continue"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.comparison), "reason": self.reason, "verdict": self.verdict,
                "looks": self.looks}


@dataclass
class Outcome:
    """What the loop did: every round's grid result merged, and each primary comparison's track."""

    result: GridResult
    tracks: list[Track]
    schedule: Schedule
    alpha: float
    state_path: Path


def _setting(job: RunConfig) -> str:
    return json.dumps([job.hparams, dataclasses.asdict(job.train)], sort_keys=True, default=str)


def compared_jobs(jobs: list[RunConfig], seeds: list[int] | None = None,
                  arms: set[tuple[str, str, str]] | None = None) -> tuple[list[RunConfig], list[RunConfig]]:
    """(the jobs the looks compare, the rest). Per model, task and method the looks compare the one setting planned at
    every seed of the sequence (`seeds`; default every seed of the jobs): the study's own grid, extended to the cap.
    Other settings of the same cell planned at fewer seeds (a data-efficiency curve, a grid with seeds of its own)
    are the rest: they run in the first round and never enter a look. BadInput when an arm of a primary comparison
    (`arms`; default every cell) runs several settings at every seed (a sweep): a comparison needs one; another
    cell's sweep runs at the first look's seeds."""
    wanted = set(seeds if seeds is not None else (j.seed for j in jobs))
    by_cell: dict[tuple[str, str, str], dict[str, list[RunConfig]]] = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        by_cell[job.model, job.task, job.method][_setting(job)].append(job)
    compared, rest, several = [], [], []
    for cell, settings in by_cell.items():
        full = [s for s, js in settings.items() if wanted <= {j.seed for j in js}]
        checked = arms is None or cell in arms
        if len(full) > 1 and checked:
            several.append(f"{cell[1]}/{cell[2]}")
        for s, js in settings.items():
            (compared if s in (full[:1] if checked else full) else rest).extend(js)
    if several:
        raise BadInput(f"--until-decided compares one setting per method and task, but {', '.join(sorted(several))} "
                       "run several at every seed (a sweep): fix the setting with --set, or drop --until-decided")
    return compared, rest


def comparisons(jobs: list[RunConfig], reference: str, primary: Callable[[Comparison], bool] | None = None,
                seeds: list[int] | None = None, note: Callable[[str], None] | None = None) -> list[Comparison]:
    """The primary comparisons of a grid: each method other than the reference against it, per model and task
    (all of them unless `primary` picks), over the settings `compared_jobs` picks. BadInput when an arm of one runs
    several settings at every seed (a sweep) or the reference is missing. `note` hears of the primary cells left out
    because no setting of theirs runs at every seed (a task with only a data-efficiency curve, say)."""
    cells = dict.fromkeys((j.model, j.task, j.method) for j in jobs)
    chosen = [c for c in (Comparison(*cell, reference) for cell in cells if cell[2] != reference)
              if primary is None or primary(c)]
    settings = dict.fromkeys((j.model, j.task, j.method) for j in compared_jobs(
        jobs, seeds, _arm_set(chosen))[0])
    left_out = [c for c in chosen if (c.model, c.task, c.method) not in settings]
    if left_out and note is not None:
        note(f"--until-decided: not compared, no setting runs at every seed up to the cap: "
             f"{', '.join(c.label for c in left_out)} (their runs go ahead in the first look only)")
    out = []
    for c in chosen:
        if (c.model, c.task, c.method) not in settings:
            continue
        if (c.model, c.task, reference) not in settings:
            raise BadInput(f"--until-decided compares every method with the reference {reference!r}, which the grid "
                           f"does not run on {c.task}: add it to the methods or name another reference "
                           "(the study's report.baseline)")
        out.append(c)
    if not out:
        raise BadInput("--until-decided found no primary comparison in this grid (a method besides the reference on "
                       "a task the study's primary list names)")
    return out


# a comparison and its two arms' ok records by seed -> an Evidence (suite.stats.evidence)
Evaluate = Callable[[Comparison, dict[int, RunRecord], dict[int, RunRecord]], Any]


def run_until_decided(jobs: list[RunConfig], store: Store, schedule: Schedule, seeds: list[int],
                      primary: list[Comparison], evaluate: Evaluate, alpha: float,
                      run_round: Callable[[list[RunConfig]], GridResult], say: Callable[[str], None] = print,
                      replay: bool = False) -> Outcome:
    """Run the grid's jobs at the first look's seeds, then add `step` seeds per round to the undecided primary
    comparisons only, deciding each look by the sequential design (alpha split over the primary family).

    `jobs`: the grid planned up to the cap; `seeds`: `seed_sequence(...)`, the order in which seeds are added;
    `evaluate(comparison, method_records, reference_records)` gives a look's Evidence from the ok records by seed;
    `run_round(jobs)` runs jobs the usual way (`run_grid`) and returns its GridResult. `replay`: nothing trains
    (`run --replay`); a comparison whose look needs a seed that has no record (not run, as opposed to failed) stays
    open at its last look instead of being decided on fewer seeds."""
    design = Design(schedule.looks, family_alpha(alpha, len(primary)), spending=schedule.spending,
                    futility=schedule.futility)
    tracks = [Track(c) for c in primary]
    # the rest (other settings of a cell) run in full in the first round
    jobs, rest = compared_jobs(jobs, seeds, _arm_set(primary))
    merged = GridResult()
    state_path = OutputFolder(store.root).until_decided
    if replay:
        keep_unfound_state(state_path, jobs, store)
    planned = 0
    for look, n in enumerate(design.looks):
        wanted = set(seeds[planned:n])
        if look == 0:
            todo = [j for j in jobs if j.seed in wanted] + rest
        else:
            arms = _arm_set(t.comparison for t in tracks if t.open)
            todo = [j for j in jobs if j.seed in wanted and (j.model, j.task, j.method) in arms]
        planned = n
        if todo:
            say(f"look {look + 1} of {len(design.looks)}: {len(todo)} run(s) for seeds up to {n} "
                f"({sum(t.open for t in tracks)} comparison(s) undecided)")
            _merge(merged, run_round(todo))
        records = _records(jobs, store, set(seeds[:n]))
        for track in tracks:
            if track.open and not (replay and _unrun(jobs, store, track.comparison, seeds[:n])):
                _look(track, design, records, evaluate, look, seeds[:n])
        _write_state(state_path, tracks, schedule, design, alpha, seeds)
        if not any(t.open for t in tracks) or (replay and not any(len(t.looks) > look for t in tracks if t.open)):
            break
    return Outcome(merged, tracks, schedule, alpha, state_path)


def keep_unfound_state(path: Path, jobs: list[RunConfig], store: Store) -> None:
    """BadInput (exit 2, the state left as it is) when a replay's plan finds none of the records a state file's looks
    were taken on: its jobs are named otherwise (other settings, device, precision or padding than the run that wrote
    it), and replaying would rewrite decided comparisons as open with no looks."""
    from suite.run.layout import read_state

    if not path.is_file():
        return
    try:
        state = read_state(path, UntilDecidedFile)
    except BadInput:  # a damaged file: the replay writing it anew is the fix
        return
    looked = sum(1 for c in state.comparisons if any(look.n > 0 for look in c.looks))
    if looked and not any(store.read(j.filename) is not None for j in jobs):
        raise BadInput(f"{path}: --replay found none of the records its looks were taken on ({looked} "
                       "comparison(s) looked at): this command names its jobs otherwise (other settings, device, "
                       "precision or padding than the run that wrote the file), so the file is left as it is. Give "
                       f"the flags of the command that wrote it ({OutputFolder(store.root).commands})")


def _unrun(jobs: list[RunConfig], store: Store, c: Comparison, seeds: list[int]) -> bool:
    """Some seed of the look has no record (of any status) for one of the comparison's arms."""
    arms, wanted = set(_arms(c)), set(seeds)
    found = {(j.model, j.task, j.method, j.seed) for j in jobs
             if (j.model, j.task, j.method) in arms and j.seed in wanted and store.read(j.filename) is not None}
    return len(found) < len(arms) * len(wanted)


def _arms(c: Comparison) -> tuple[tuple[str, str, str], tuple[str, str, str]]:
    return (c.model, c.task, c.method), (c.model, c.task, c.reference)


def _arm_set(comparisons: Iterable[Comparison]) -> set[tuple[str, str, str]]:
    """The (model, task, method) cells that the comparisons' two arms run."""
    return {arm for c in comparisons for arm in _arms(c)}


def _records(jobs: list[RunConfig], store: Store,
             seeds: set[int]) -> dict[tuple[str, str, str], dict[int, RunRecord]]:
    """The ok records of the look's seeds, by (model, task, method) and seed."""
    out: dict[tuple[str, str, str], dict[int, RunRecord]] = defaultdict(dict)
    for job in jobs:
        if job.seed in seeds and (rec := store.read(job.filename)) is not None and rec.ok:
            out[job.model, job.task, job.method][job.seed] = rec
    return out


def _look(track: Track, design: Design, records, evaluate: Evaluate, look: int, seeds: list[int]) -> None:
    method_arm, reference_arm = _arms(track.comparison)
    entry = next_look(track.looks, design, records.get(method_arm, {}), records.get(reference_arm, {}),
                      lambda ours, theirs: evaluate(track.comparison, ours, theirs), look, seeds)
    track.looks.append(entry)
    track.reason, track.verdict = entry["reason"], entry["verdict"]


def _merge(into: GridResult, part: GridResult) -> None:
    for name in ("done", "skipped", "failed", "not_run", "elsewhere"):
        getattr(into, name).extend(getattr(part, name))


def _write_state(path: Path, tracks: list[Track], schedule: Schedule, design: Design, alpha: float,
                 seeds: list[int]) -> None:
    state = {"written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "schedule": dataclasses.asdict(schedule), "looks": list(design.looks), "seed_order": seeds,
             "alpha": alpha, "primary": len(tracks), "alpha_each": design.alpha,
             "rule": f"Lan-DeMets {schedule.spending} spending of alpha/{len(tracks)} (Bonferroni over the primary "
                     f"comparisons) across the looks; a difference claim needs the exact paired sign test over every "
                     f"paired seed at the same level too; equivalence by TOST spent the same way; futility from "
                     f"{FUTILITY_MIN_SEEDS} seeds on when the predictive power of a decision by the cap (averaged "
                     f"over the seed sd's uncertainty) is below {schedule.futility}",
             "comparisons": [t.to_dict() for t in tracks]}
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = state_json(UntilDecidedFile.model_validate(state))  # the model the report reads it with
    atomic_write(path, lambda fh: fh.write(blob))


def stopping_line(track: Track) -> str:
    """`cola/no_dropout vs vanilla (minilm): 2 look(s), 10 seeds: stopped for efficacy, better (p 0.0012 < 0.0031)`."""
    last = track.looks[-1] if track.looks else {}
    why = {"efficacy": "stopped for efficacy", "equivalence": "stopped for equivalence",
           "futility": "stopped for futility", "cap": "reached the cap", "continue": "still open"}[track.reason]
    detail = ""
    if track.reason == "efficacy":
        detail = f" (p {last['p']:.2g} < {last['level']:.2g})"
    elif track.reason == "equivalence":
        detail = f" (TOST p {last['p_equiv']:.2g} < {last['level_equiv']:.2g}, margin ±{last['margin']:g})"
    elif track.reason == "futility" and (power := last.get("predictive_power", last.get("conditional_power"))) \
            is not None:
        detail = f" (chance of a decision by the cap {power:.0%})"
    elif last.get("note"):
        detail = f" ({last['note']})"
    return (f"{track.comparison.label}: {len(track.looks)} look(s), {last.get('n', 0)} seeds: {why}, "
            f"{track.verdict}{detail}")


def closing_lines(outcome: Outcome) -> str:
    head = (f"until decided: looks at {', '.join(map(str, outcome.schedule.looks))} seeds, "
            f"{outcome.schedule.spending} spending, alpha {outcome.alpha:g} over {len(outcome.tracks)} primary "
            f"comparison(s); state in {outcome.state_path}")
    return "\n".join([head, *("  " + stopping_line(t) for t in outcome.tracks)])


# ---------------------------------------------------------------------------------------------------------
# From a study and the command line to the loop
# ---------------------------------------------------------------------------------------------------------

def study_schedule(section, source: str | None) -> Schedule:
    """`run --until-decided`: the schedule of the study's `until_decided:` section (defaults otherwise)."""
    try:
        return Schedule(**(section.model_dump(exclude_none=True) if section is not None else {}))
    except BadInput as exc:
        raise BadInput(f"{source}: until_decided: {exc}" if section is not None else str(exc)) from None


def run_planned(plan, store: Store, run_round: Callable[[list[RunConfig]], GridResult],
                say: Callable[[str], None] = print, replay: bool = False) -> Outcome:
    """The loop over a grid planned under --until-decided (`resolve_study`, its seeds extended to the cap), with the
    study's report section: its baseline is the reference, its alpha is spent, its primary list picks the
    comparisons (all against the reference when it has none) and its margin is the equivalence margin."""
    report = plan.request.study.report
    alpha = DEFAULT_ALPHA if report.alpha is None else report.alpha  # 0 is refused when the study is read
    return run_until_decided(plan.jobs, store, plan.request.schedule, plan.request.seeds, primary_comparisons(plan),
                             record_evaluator(store, report.margin), alpha, run_round, say, replay)


def still_to_run(plan, jobs: list[RunConfig], store: Store) -> list[RunConfig]:
    """Of a grid's final jobs, those the loop may still train: every job of the first look's seeds, a later seed's
    only in a cell that an open primary comparison runs (every primary comparison before the first look; which are
    open after it, `OUT/until_decided.json` says)."""
    first = set(plan.request.seeds[:plan.request.schedule.looks[0]])
    path = OutputFolder(store.root).until_decided
    if path.is_file():
        state = read_state(path, UntilDecidedFile)
        open_ = [Comparison(c.model, c.task, c.method, c.reference) for c in state.comparisons
                 if c.reason == "continue"]
    else:
        open_ = primary_comparisons(plan)
    arms = _arm_set(open_)
    return [j for j in jobs if j.seed in first or (j.model, j.task, j.method) in arms]


def primary_comparisons(plan, note: Callable[[str], None] | None = None) -> list[Comparison]:
    """The comparisons that get looks: the study's `report: primary:` entries (methods, tasks or METHOD:TASK), else
    every method against `report: baseline:`. BadInput (exit 2) when there is none, a method runs several settings or
    the reference is missing: the command calls this before anything trains."""
    from suite.stats.families import is_primary

    report = plan.request.study.report
    reference = report.baseline or DEFAULT_BASELINE
    declared = report.primary or []
    if isinstance(declared, str):
        declared = [x.strip() for x in declared.split(",") if x.strip()]
    return comparisons(plan.jobs, reference, (lambda c: is_primary(c.method, c.task, declared)) if declared else None,
                       seeds=plan.request.seeds, note=note)


def same_family(picked: list[Comparison], whole: list[Comparison], picking_flags: str) -> None:
    """BadInput when flags that pick part of a study (`picking_flags`, as given) leave out some of its primary
    comparisons: the looks would spend alpha over a smaller family than the study's, and the state file would hold
    only part of it."""
    left_out = [c for c in whole if c not in set(picked)]
    if left_out:
        raise BadInput(f"--until-decided spends alpha over the study's whole primary family ({len(whole)} "
                       f"comparisons), but {picking_flags} leaves out {len(left_out)} of them (e.g. "
                       f"{left_out[0].label}): its looks would test at a looser level and rewrite the state file "
                       "with part of the family. Run that part without --until-decided (at the study's seeds its "
                       "jobs are the same as the whole study's), or give --until-decided with flags that keep every "
                       "primary comparison")


def record_evaluator(store: Store, margin=None) -> Evaluate:
    """A look's evidence from ok records, each run as every verdict scores it (`RunOutcome.of`: on its held-out test
    split where it kept one, else on dev)."""
    from suite.stats.evidence import RunOutcome, bootstrap_seed, compare_runs, per_task

    def evaluate(cmp: Comparison, ours: dict[int, RunRecord], theirs: dict[int, RunRecord]):
        return compare_runs(cmp.task, {s: RunOutcome.of(r, store.runs) for s, r in ours.items()},
                            {s: RunOutcome.of(r, store.runs) for s, r in theirs.items()},
                            per_task(margin, cmp.task), seed=bootstrap_seed(cmp.task, cmp.method, cmp.reference))

    return evaluate
