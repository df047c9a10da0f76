"""A run's progress as lines a log file can hold (no terminal, `nohup`): one when training starts, one per epoch
(training loss, tuning and dev scores, time so far and the run's ETA) and, within a long epoch, one at least every
`STEP_LINE_S` seconds; and the optimizer steps a job plans, from which the grid's ETA is computed.

`fit` reports `Progress` events to a callback (`RunClock`); whoever runs the job decides what becomes a line
(`ProgressLines`): the grid's status in the driver, or the run itself on a Ray worker. Before anything runs, the
planned steps priced at measured step times give the grid's cost per device (`grid_cost_lines`: dry runs, `plan`),
and at a pilot's whole-run times (`pilot_cost_lines`: `plan`).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Iterable, Mapping

from suite.run.settings import RunConfig, TrainSettings

# what the rest of the suite uses; other names are this module's own
__all__ = ["MEASURED_STEPS", "Phases", "Progress", "ProgressLines", "RunClock", "STEP_LINE_S", "capped_steps",
           "cost_settings", "grid_cost_lines", "pilot_cost_lines", "planned_steps", "steps_per_epoch"]

STEP_LINE_S = 60.0   # within an epoch, a line at the first loss read this long after the run's last line
EVENT_S = 5.0        # a run reports its steps at most this often (its loss is read after every batch on a CPU,
#                      every STEP_LOG_BATCHES batches on a GPU, where a read waits for the device)


def steps_per_epoch(n_train: int, t: TrainSettings) -> int:
    """Optimizer steps of one epoch over `n_train` examples: batches, grouped by gradient accumulation."""
    return math.ceil(math.ceil(n_train / t.batch_size) / t.grad_accumulation)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a run stands: `kind` is "phase" (a stretch outside the epochs begins: loading, tokenising, the
    end-of-run statistics; `phase` says which), "start" (about to train), "steps" (within an epoch) or "epoch" (an
    epoch and its evaluations done). `step` counts optimizer steps over the whole run, of `steps` planned (early
    stopping may end it sooner); `elapsed_s` runs from the start of training, evaluations included (a phase's: from
    the run's own start)."""

    kind: str
    epoch: int
    epochs: int
    step: int
    steps: int
    elapsed_s: float
    examples: int = 0
    train_loss: float = math.nan   # the epoch's running mean ("steps") or its mean ("epoch")
    dev_score: float = math.nan
    tune_score: float = math.nan
    phase: str = ""

    def eta_s(self) -> float:
        """The rest of the run at its rate so far (inf before its first step)."""
        if self.step <= 0:
            return math.inf
        return self.elapsed_s / self.step * max(self.steps - self.step, 0)


Callback = Callable[[Progress], None]


class Phases:
    """A run's stretches outside the epochs, each announced as it begins (a line, so that minutes of loading or of
    end-of-run statistics are never silent); `step` the steps made so far, which a phase leaves as they are."""

    def __init__(self, callback: Callback | None, epochs: int):
        self.callback, self.epochs, self.start, self.step = callback, epochs, time.perf_counter(), 0

    def begin(self, what: str) -> None:
        if self.callback is not None:
            self.callback(Progress("phase", 0, self.epochs, self.step, 0, time.perf_counter() - self.start,
                                   phase=what))


class RunClock:
    """`fit`'s side: builds the events and sends them to `callback` (nothing without one); "steps" events at most
    every EVENT_S seconds, so a worker's queue to the driver carries a few per minute."""

    def __init__(self, callback: Callback | None, epochs: int, steps: int, examples: int):
        self.callback, self.epochs, self.steps, self.examples = callback, epochs, steps, examples
        self.start = time.perf_counter()
        self._last_event = -math.inf

    def _send(self, kind: str, epoch: int, step: int, **values: float) -> None:
        now = time.perf_counter()
        self._last_event = now
        self.callback(Progress(kind, epoch, self.epochs, step, self.steps, now - self.start, self.examples,
                               **values))

    def started(self) -> None:
        if self.callback is not None:
            self._send("start", 0, 0)

    def stepped(self, epoch: int, step: int, running_loss: float) -> None:
        if self.callback is not None and time.perf_counter() - self._last_event >= EVENT_S:
            self._send("steps", epoch, step, train_loss=running_loss)

    def epoch_done(self, epoch: int, step: int, entry: dict) -> None:
        if self.callback is not None:
            tune = (entry.get("tune") or {}).get("score", math.nan)
            self._send("epoch", epoch, step, train_loss=entry["train_loss"], dev_score=entry["dev"]["score"],
                       tune_score=tune)


def format_duration(seconds: float) -> str:
    """3h04m, 5m07s or 9s; "?" when unknown (infinite)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


class ProgressLines:
    """What of a run's events becomes a line: every start and epoch; a "steps" event when the run has had no line
    for STEP_LINE_S seconds (with `steps=False`, never: a terminal's progress bar shows them)."""

    def __init__(self, steps: bool = True):
        self.steps = steps
        self._last_line: dict[str, float] = {}

    def line(self, label: str, p: Progress) -> str | None:
        now = time.monotonic()
        if p.kind == "steps" and not (self.steps and now - self._last_line.get(label, now) >= STEP_LINE_S):
            return None
        self._last_line[label] = now
        if p.kind == "phase":
            return f"  {label}: {p.phase} (run {format_duration(p.elapsed_s)})"
        if p.kind == "start":
            return (f"  start {label}: {p.epochs} epoch(s) x {p.steps // max(p.epochs, 1)} steps "
                    f"on {p.examples} examples")
        timing = f"run {format_duration(p.elapsed_s)}, ETA {format_duration(p.eta_s())}"
        if p.kind == "steps":
            return (f"  {label} epoch {p.epoch}/{p.epochs} step {p.step}/{p.steps}: train loss {p.train_loss:.4f} "
                    f"| {timing}")
        scores = f"dev score {p.dev_score:.4f}"
        if math.isfinite(p.tune_score):
            scores = f"tuning score {p.tune_score:.4f}, {scores}"
        return f"  {label} epoch {p.epoch}/{p.epochs}: train loss {p.train_loss:.4f}, {scores} | {timing}"


def capped_steps(job: RunConfig) -> int | None:
    """The most steps a job can plan when its training set is not read yet (hub data): its `max_train_samples` cap's
    (None without one). A task's train split holds fewer examples than the cap only for small tasks."""
    t = job.train
    return steps_per_epoch(t.max_train_samples, t) * t.epochs if t.max_train_samples else None


def planned_steps(jobs: Iterable[RunConfig], data_dir) -> dict[str, int | None]:
    """Each job's planned optimizer steps (by its hash), from the size of the training set it will draw; None where
    that is not known without training (data from the hub, a split that does not read: the run reports its own
    when it starts). Reads each task's train split once."""
    from suite.api.tasks import get_task
    from suite.run.data import read_local_split, task_data_dir
    from suite.run.draws import draw_train

    labels: dict[str, list | None] = {}
    sizes: dict[tuple, int | None] = {}
    out: dict[str, int | None] = {}
    for job in jobs:
        t = job.train
        key = (job.task, t.max_train_samples, t.holdout, t.holdout_seed, t.test_holdout)
        if key not in sizes:
            try:
                spec = get_task(job.task)
                if job.task not in labels:
                    folder = task_data_dir(spec, data_dir)
                    labels[job.task] = (read_local_split(spec, spec.train_split, folder)["label"]
                                        if folder is not None else None)
                found = labels[job.task]
                sizes[key] = (len(draw_train(found, t, job.seed, not spec.is_regression).train)
                              if found is not None else None)
            except Exception:  # noqa: BLE001  only the ETA needs it; the run itself says what is wrong
                sizes[key] = None
        out[job.hash] = steps_per_epoch(sizes[key], t) * t.epochs if sizes[key] is not None else None
    return out


# where a grid's cost is estimated from before anything runs: the published `python -m suite bench --json` files, one
# per device kind (their format: suite.report.costs.read_bench)
MEASURED_STEPS = ("results/bench.json", "results/gpu/bench.json")


def _kind(bench: dict) -> str:
    return "CPU" if str(bench.get("device", "")).upper().startswith("CPU") else "GPU"


def grid_cost_lines(jobs: list[RunConfig], steps: dict[str, int | None], benches: dict[str, dict]) -> list[str]:
    """Per device kind, the grid's training batches priced at each method's measured step time (`benches`: path ->
    a bench file's JSON: one isolated step at the bench's batch and length, scaled linearly to each job's batch size;
    evaluation, loading and tokenisation not included); 'unmeasured' for a kind no file measured, never a guess.
    `steps`: each job's planned optimizer steps by its hash (None before the data is read: `max_train_samples` then
    bounds it)."""
    counted, bounded, unknown = [], 0, 0
    for job in jobs:
        n = steps.get(job.hash)
        if n is None and (n := capped_steps(job)) is not None:
            bounded += 1
        if n is None:
            unknown += 1
        else:
            counted.append((job, n * job.train.grad_accumulation))  # a step's batches: one bench step each
    basis = (f"{sum(n for _, n in counted):,} training batches of {len(counted)} job(s) from the planned budget"
             + (f" ({bounded} of them at most: their training set is read only when they run)" if bounded else "")
             + (f"; {unknown} job(s) without a known budget left out" if unknown else ""))
    by_kind = {_kind(bench): (path, bench) for path, bench in reversed(list(benches.items()))}
    return [f"cost estimate (training steps only, from measured step times; {basis}):",
            *(f"  {kind}: " + (_priced(counted, *by_kind[kind]) if kind in by_kind else
                               f"unmeasured (no `python -m suite bench --json` file for a {kind}; looked for "
                               f"{', '.join(MEASURED_STEPS)})") for kind in ("CPU", "GPU"))]


def _priced(counted: list, path: str, bench: dict) -> str:
    rows = [r for r in bench.get("rows", []) if isinstance(r.get("step_ms"), (int, float))]
    seconds, missing = 0.0, set()
    for job, batches in counted:
        name = job.model.rstrip("/").split("/")[-1].lower()  # the model's own shape: another's time is no estimate
        shapes = [r for r in rows if str(r["shape"]).lower() in name]
        measured = sorted((r for r in shapes if r["method"] == job.method), key=lambda r: r["batch_size"])
        if not measured:
            missing.add(job.method if shapes else f"model {job.model}")
            continue
        seconds += batches * measured[0]["step_ms"] / 1000 * job.train.batch_size / measured[0]["batch_size"]
    settings = ", ".join(sorted({f"`{r['shape']}` batch {r['batch_size']} x {r['seq_len']} tokens" for r in rows}))
    hours = seconds / 3600
    return ((f"{hours:,.0f}" if hours >= 10 else f"{hours:.1f}" if hours >= 1 else f"{hours:.2g}")
            + f" {_kind(bench)}-hours ({path}: {bench.get('device')}, {settings}, measured "
            f"{bench.get('date') or 'on an unknown date'}; scaled to each job's batch size; every batch at the bench's "
            "length, so shorter padded batches make it an upper estimate"
            + (f"; unmeasured and left out: {', '.join(sorted(missing))}" if missing else "") + ")")


# what a run's seconds per step turn on besides its model, task and method: a pilot prices only jobs that share them
COST_SETTINGS = ("batch_size", "eval_batch_size", "max_length", "precision", "grad_accumulation")


def cost_settings(train: TrainSettings | Mapping[str, Any]) -> tuple:
    """A job's (or a record's `train` dict's) values of COST_SETTINGS."""
    return tuple(train.get(k) if isinstance(train, Mapping) else getattr(train, k, None) for k in COST_SETTINGS)


def pilot_cost_lines(jobs: list[RunConfig], steps: dict[str, int | None], measured: dict[tuple, list[float]],
                     threads: set, where: str, whose: str = "the pilot's") -> list[str]:
    """Per device kind a pilot ran on, the grid priced at the pilot's whole-run seconds per optimizer step (a record's
    wall_s over its steps: training, evaluation and loading, at the pilot's machine, threads and load), twice: at the
    fastest run (the least load the pilot saw) and at the median run. `whose` names the runs in the lines (a dry
    run prices what is left of a grid at its own folder's runs). `measured`: {(kind, model, task, method,
    cost_settings): [seconds per step of each ok record]}; a job takes its own cell's runs, else its task's runs of the
    pilot's other methods at the same settings; a job with none is named, not guessed."""
    lines = []
    for kind in sorted({k for k, *_ in measured}):
        fastest, median, own, borrowed, capped, unpriced, unknown = 0.0, 0.0, 0, 0, 0, set(), 0
        for job in jobs:
            n = steps.get(job.hash)
            bound = n is None   # the job's training set is read only when it runs: its cap bounds it
            if bound:
                n = capped_steps(job)
            if n is None:
                unknown += 1
                continue
            shape = cost_settings(job.train)
            same = measured.get((kind, job.model, job.task, job.method, shape))
            if same:
                own += 1
            else:
                same = [x for (k, m, t, _, c), xs in measured.items() if (k, m, t, c) == (kind, job.model, job.task,
                                                                                          shape) for x in xs]
                if not same:
                    unpriced.add(f"{job.model}/{job.task}/{job.method}")
                    continue
                borrowed += 1
            fastest += n * min(same)
            median += n * statistics.median(same)
            capped += bound
        runs = sum(len(xs) for (k, *_), xs in measured.items() if k == kind)
        said = [*map(str, sorted(t for t in threads if t is not None)), *(["unrecorded"] if None in threads else [])]
        unit = (f"{kind}-hours" if kind != "CPU" else "CPU-hours (one torch thread a run)" if threads == {1} else
                f"process-hours ({whose} runs had {', '.join(said)} torch threads)")
        lines.append(f"  {kind}, as {whose} {runs} run(s) in {where} took (whole runs: training, evaluation and "
                     f"loading, at their machine's threads and load): {fastest / 3600:,.1f} (at each job's fastest "
                     f"of those runs) to {median / 3600:,.1f} (at its median run) {unit} for {own + borrowed} job(s)"
                     + (f", {borrowed} of them at their task's runs of {whose} other methods" if borrowed else "")
                     + (f", {capped} of them at most (their training set is read only when they run)" if capped else "")
                     + (f"; not priced (no {kind} runs there of their task at their batch size, length, "
                        f"precision and accumulation): {', '.join(sorted(unpriced))}" if unpriced else "")
                     + (f"; {unknown} job(s) without a known budget left out" if unknown else ""))
    return lines
