"""What the report lacks and what its runs cost: how many of the jobs its commands planned have records (each
`run` line of commands.txt planned again by `Options.planner`, which the command layer gives: planning is the grid's),
the cells without them, and the run hours per cell on each device."""
from __future__ import annotations

from collections import defaultdict

import pandas as pd

from suite.report.facts import ModelFacts, Options, ReportFacts
from suite.report.load import Col
from suite.report.vocabulary import DASH, Part, seed_ranges, table, task_display, task_order
from suite.run.settings import RunConfig

__all__ = ["compute_per_cell", "coverage_lines"]

MOST_CELLS_NAMED = 12  # missing cells named one by one; beyond, a count


def coverage_lines(report: ReportFacts, options: Options) -> list[str]:
    """The header's line on the planned jobs: all of them have ok records, or N of M, with the cells that lack them;
    nothing when no command was recorded or no planner given. A job is covered by an ok record of the same job hash,
    the grid's own rule: a record at another budget or swept value covers nothing. A command that no longer plans (a
    moved study file) is named."""
    commands = [c for c in report.loaded.commands if " run " in f" {c} "]
    if not commands or options.planner is None:
        return []
    planned: dict[str, RunConfig] = {}
    failed = []
    for number, command in enumerate(commands, 1):
        with _quiet() as said:
            try:
                planned.update((job.hash, job) for job in options.planner(command))
            except SystemExit:  # argparse refused the line: its last words say why
                failed.append(f"command {number} ({(said.getvalue().strip().splitlines() or ['?'])[-1][:160]})")
            except Exception as exc:  # noqa: BLE001  the report goes on, saying which line
                failed.append(f"command {number} ({type(exc).__name__}: {str(exc)[:160]})")
    df = report.frame
    have = set(df.loc[df[Col.STATUS] == "ok", Col.HASH])
    missing = [job for h, job in planned.items() if h not in have]
    note = (f" (could not plan {', '.join(failed)}: give the report from the folder the commands ran in)"
            if failed else "")
    # the planner sees the first round's seeds only (and nothing of a --replay, which trains nothing)
    if any("--until-decided" in c.split() and "--replay" not in c.split() for c in commands):
        note += " (their first round: `--until-decided` adds seeds to open comparisons round by round)"
    if not planned:
        return [f"- **Jobs:** the planned jobs are unknown{note}"] if failed else []
    if not missing:
        return [f"- **Jobs:** all {len(planned)} jobs the commands plan have ok records{note}"]
    telling = _telling_settings(planned.values())
    several_models = len({j.model for j in planned.values()}) > 1
    cells: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
    for job in missing:
        settings = ", ".join(f"{k}={v}" for k, v in _settings(job).items() if k in telling[_cell(job)])
        cells[job.model, job.task, job.method, settings].append(job.seed)
    named = []
    for (model, t, m, settings), s in sorted(cells.items()):
        beside = "; ".join(x for x in (settings, model if several_models else "") if x)
        named.append(f"{task_display(t)}/{m} seed{'s' if len(s) > 1 else ''} {seed_ranges(s)}"
                     + (f" ({beside})" if beside else ""))
    more = f" and {len(cells) - MOST_CELLS_NAMED} more cells" if len(cells) > MOST_CELLS_NAMED else ""
    return [f"- **Jobs: {len(planned) - len(missing)} of {len(planned)} jobs the commands plan have ok records**; "
            f"{len(missing)} without: {'; '.join(named[:MOST_CELLS_NAMED])}{more} (give the same commands again to "
            f"run them){note}"]


def _cell(job: RunConfig) -> tuple[str, str, str]:
    return job.model, job.task, job.method


def _settings(job: RunConfig) -> dict[str, str]:
    """The job's hyper-parameters and training settings as assignment keys (`vanilla.p`, `train.lr`) -> text."""
    return {**{f"{job.method}.{k}": str(v) for k, v in sorted(job.hparams.items())},
            **{f"train.{k}": str(v) for k, v in sorted(job.to_dict()["train"].items())}}


def _telling_settings(jobs) -> dict[tuple[str, str, str], set[str]]:
    """Per cell, the settings its planned jobs differ in (another budget, a swept value): what tells a missing job
    from one with a record."""
    seen: dict[tuple[str, str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for job in jobs:
        for key, value in _settings(job).items():
            seen[_cell(job)][key].add(value)
    return defaultdict(set, {cell: {k for k, v in values.items() if len(v) > 1} for cell, values in seen.items()})


class _quiet:
    """Planning prints warnings meant for a run; the report keeps its own output."""

    def __enter__(self):
        import contextlib
        import io

        self._stack, said = contextlib.ExitStack(), io.StringIO()
        self._stack.enter_context(contextlib.redirect_stderr(said))
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        return said

    def __exit__(self, *exc):
        self._stack.close()
        return False


def _device(env) -> str:
    return "GPU" if str(env.device).startswith("cuda") else "CPU" if env.device == "cpu" else str(env.device)


def _device_text(env) -> str:
    """The GPU, or the CPU with its platform and torch threads, that a run's hours were spent on."""
    return env.gpu or ", ".join(filter(None, (env.cpu_text, env.platform, f"{env.cpu_threads} CPU threads")))


def compute_per_cell(facts: ModelFacts, options: Options) -> Part:
    """Run hours per leaderboard cell (every record of the cell, failed runs included), by device kind, with the
    devices named below."""
    records, part = facts.records, Part()
    if not len(records) or records[Col.WALL_S].dropna().empty:
        return part
    kinds = records[Col.ENV].map(_device)
    hours = (records.assign(kind=kinds).groupby([Col.METHOD, Col.TASK, "kind"])[Col.WALL_S].sum() / 3600)
    tasks = [t for t in task_order(records[Col.TASK].unique())]
    several = kinds.nunique() > 1
    rows = []
    for m in facts.sel.methods:
        row = [facts.label(m)]
        for t in tasks:
            spent = hours.loc[m, t] if (m, t) in hours.index.droplevel("kind") else pd.Series(dtype=float)
            row.append(" + ".join(f"{h:.2f}" + (f" {k}" if several else "") for k, h in spent.items()) or DASH)
        rows.append(row)
    total = hours.groupby(level="kind").sum()
    devices = sorted({f"{_device(e)}: {_device_text(e)}" for e in records[Col.ENV]})
    unit = "Hours" if several else f"{kinds.iloc[0]}-hours"
    part.add("#### Compute per cell", "", table(rows, ["method", *map(task_display, tasks)]), "",
             f"- {unit} of every record of the cell (failed runs included), each run's own wall-clock "
             f"time summed (loading, training and evaluation; runs side by side overlap on the clock): "
             + ", ".join(f"{h:.2f} {k}-hours in all" for k, h in total.items()) + ". Devices: "
             + "; ".join(devices) + ".", "")
    return part
