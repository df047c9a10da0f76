"""The report's header: what was run, on what, by which code, and with which commands; and whether the records
come from one committed code version (`code_version_problem`, which the report refuses unless told otherwise)."""
from __future__ import annotations

import datetime as dt
import os
from collections import Counter

from suite.report.coverage import coverage_lines
from suite.report.facts import Options, ReportFacts
from suite.report.load import Col
from suite.report.stage_sections import progress_lines
from suite.report.vocabulary import Part, plural, task_display, task_order, task_source, unique
from suite.stats.families import CORRECTIONS

__all__ = ["code_version_problem", "compute_note", "section", "short_commit"]


def date_line() -> str:
    """The one line that changes between two regenerations (SOURCE_DATE_EPOCH pins the date), with the code that
    computed the tables, which may be newer than the code the runs name (the Code version line)."""
    from suite.run.device import git_commit

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch and epoch.isdigit()
            else dt.datetime.now(dt.timezone.utc))
    code = short_commit(git_commit(excluded=()))   # short: the line stays one line
    return (f"Generated {when:%Y-%m-%d %H:%M} UTC by `python -m suite report`"
            + (f", report code `{code}`." if code else " (report code: not a git checkout)."))


def short_commit(code: str | None) -> str | None:
    """A version as `git_commit` names it, its sha cut to 12 characters (its +dirty and like marks kept)."""
    if not code:
        return None
    sha, plus, marks = code.partition("+")
    return sha[:12] + plus + marks


def model_line(df) -> str:
    models = []
    for m in unique(df[Col.MODEL]):
        totals = unique(df.loc[(df[Col.MODEL] == m), Col.TOTAL_PARAMS].dropna().astype(int))
        size = (f"{totals[0]:,}" if len(totals) == 1 else f"{totals[0]:,}–{totals[-1]:,}") if totals else ""
        models.append(f"`{m}`" + (f" ({size} parameters{' by task head' if len(totals) > 1 else ''})"
                                  if totals else ""))
    return f"- **Model{'s' if len(models) > 1 else ''}:** {', '.join(models)}"


def data_line(df) -> str:
    """Tasks grouped by benchmark, with where each benchmark's data comes from."""
    tasks = task_order(df[Col.TASK].unique())
    by_benchmark: dict[str, list[str]] = {}
    hubs: dict[str, list[str]] = {}
    for t in tasks:
        hub, bench = task_source(t)
        by_benchmark.setdefault(bench, []).append(task_display(t))
        if hub and hub not in hubs.setdefault(bench, []):
            hubs[bench].append(hub)
    groups = [f"{b + ' tasks' if b else 'tasks'} {', '.join(names)}" for b, names in by_benchmark.items()]
    origin = "; ".join(f"local: {b + ' ' if b else ''}TSVs; hub: {', '.join(hubs.get(b, [])) or 'unknown'}"
                       for b in by_benchmark)
    sources = unique(v.get("data_source") for v in df[Col.TRAIN])
    return (f"- **Data:** {'; '.join(groups)}; source: {', '.join(map(str, sources)) or 'unknown'} ({origin}); "
            f"{_test_set(df)}; sizes in the setup tables")


def _test_set(df) -> str:
    """Which split the runs are scored on: dev, or a held-out test split of the train set (train.test_holdout)."""
    asked = [tr.get("test_holdout") is not None for tr in df[Col.TRAIN]]
    if not any(asked):
        return "dev split as the test set"
    held = sorted({task_display(t) for t, a in zip(df[Col.TASK], asked) if a})
    return (f"a held-out test split of the train set as the test set for {', '.join(held)} (train.test_holdout; "
            "dev scores beside in the per-task tables)" + ("; dev split as the test set for the others"
                                                          if not all(asked) else ""))


def runs_line(loaded, df) -> str:
    counts = Counter(df[Col.STATUS])
    return (f"- **Runs:** {len(df)} records: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            + (f"; {len(loaded.unreadable)} unreadable record files skipped: " + ", ".join(loaded.unreadable)
               if loaded.unreadable else "")
            + (f"; {loaded.duplicates} duplicate records of the same job ignored" if loaded.duplicates else "")
            + compute_note(df))


def compute_note(df) -> str:
    """The records' summed wall time: what the tables cost to make (tuning runs, kept elsewhere, not included)."""
    wall = df[Col.WALL_S].dropna() if Col.WALL_S in df else []
    if not len(wall):
        return ""
    hours = float(wall.sum()) / 3600
    return (f"; {hours:,.1f} run-hours of wall time ({len(wall)} records' own times summed: runs that ran side by "
            "side overlap on the clock)")


def machine_keys(df) -> list[tuple[str, str, str, str]]:
    """(device, the GPU or else the CPU, platform, CPU threads) of each record: what its costs depend on."""
    return [(env.device, env.gpu or env.cpu_text, env.platform, env.cpu_threads) for env in df[Col.ENV]]


def environment_counts(df) -> tuple[Counter, Counter, Counter]:
    machines, software, libs = Counter(machine_keys(df)), Counter(), Counter()
    for env in df[Col.ENV]:
        software[(env.suite, env.git_commit)] += 1
        libs[f"python {env.python}, torch {env.torch}, transformers {env.transformers}"] += 1
    return machines, software, libs


def environment_lines(df) -> list[str]:
    machines, software, libs = environment_counts(df)
    lines = [f"- **Machine:** {device}{' (' + chip + ')' if chip else ''}, {plat}, {threads} CPU threads ({plural(n)})"
             for (device, chip, plat, threads), n in sorted(machines.items())]
    lines += [f"- **Suite:** version {version}, git commit `{commit}` ({plural(n)})"
              for (version, commit), n in sorted(software.items())]
    lines += [f"- **Software:** {text} ({plural(n)})" for text, n in sorted(libs.items())]
    return lines


def provenance_warning(df) -> list[str]:
    """A prominent warning when the records span several code versions, uncommitted trees or machines."""
    _, software, _ = environment_counts(df)
    commits = {commit for (_, commit) in software}
    dirty = sum(n for (_, commit), n in software.items() if commit.endswith("+dirty"))
    unknown = sum(n for (_, commit), n in software.items() if commit == "unknown")
    setups = {(env.host, *machine) for env, machine in zip(df[Col.ENV], machine_keys(df))}
    problems = []
    if len(commits) > 1:
        problems.append(f"{len(commits)} code versions (git commits)")
    if dirty:
        problems.append(f"{plural(dirty)} from uncommitted (`+dirty`) code, whose exact version is not recoverable")
    if unknown:
        problems.append(f"{plural(unknown)} without a recorded git commit")
    if len(setups) > 1:
        problems.append(f"{len(setups)} machines or device setups (host, device, GPU or CPU, platform, CPU threads)")
    if not problems:
        return []
    return ["", f"> **Warning — mixed provenance:** the {plural(len(df), 'record')} come from "
            + "; ".join(problems) + ". Differences between methods may partly be differences between code versions "
            "or machines; see the Suite and Machine lines above.", ""]


def code_versions(df) -> Counter:
    """Records per code version (git commit, `+dirty` for uncommitted code, "unknown" where none was recorded)."""
    return Counter(env.git_commit for env in df[Col.ENV])


def code_version_problem(df) -> str | None:
    """Why the records do not come from one committed code version, or None when they do (records without a
    recorded commit are named by the header but not refused: there is nothing to compare)."""
    versions = code_versions(df)
    known = {v: n for v, n in versions.items() if v != "unknown"}
    dirty = {v: n for v, n in known.items() if v.endswith("+dirty")}
    if len(known) <= 1 and not dirty:
        return None
    ranked = sorted(known.items(), key=lambda kv: -kv[1])
    listed = ", ".join(f"{_short(v)} ({plural(n)})" for v, n in ranked[:5])
    listed += f" and {len(ranked) - 5} more" if len(ranked) > 5 else ""
    what = []
    if dirty:
        what.append(f"{plural(sum(dirty.values()))} from uncommitted (+dirty) code")
    if len(known) > 1:
        what.append(f"{len(known)} code versions")
    return f"{' and '.join(what)}: {listed}"


def _short(version: str) -> str:
    """A short commit with its marks (+shallow, +dirty): the same commit with and without them is two versions here."""
    sha, plus, marks = version.partition("+")
    return f"{sha[:12]}{plus}{marks}"


def code_version_line(df) -> str:
    versions = code_versions(df)
    if len(versions) == 1:
        (version, n), = versions.items()
        return f"- **Code version of every table:** `{version}` (all {plural(n)})"
    return (f"- **Code versions:** {len(versions)} (allowed by --allow-uncommitted / `allow_uncommitted:`); "
            "the tables mix them, see the Suite lines above")


def section(report: ReportFacts, options: Options) -> Part:
    df, loaded, part = report.frame, report.loaded, Part()
    part.add("# Leaderboard", "", date_line(), "")
    seeds = unique(df[Col.SEED])
    part.add(model_line(df), data_line(df),
             f"- **Seeds:** {', '.join(map(str, seeds))} ({len(seeds)} distinct; {report.seeds_per_cell()} per "
             "leaderboard cell)",
             runs_line(loaded, df), *coverage_lines(report, options), *progress_lines(report))
    started, finished = unique(df[Col.STARTED]), unique(df[Col.FINISHED])
    if started and finished:
        part.add(f"- **Run dates:** {started[0]} to {finished[-1]}")
    part.add(*environment_lines(df))
    part.add(code_version_line(df))
    family = (f"primary comparisons ({', '.join(options.primary)}) by {CORRECTIONS['holm']}, the rest by "
              f"{CORRECTIONS['bh']}" if options.primary else f"{CORRECTIONS[options.correction]} across each "
              "model's table")
    part.add(f"- **Reference:** `{options.baseline}`; verdicts better / worse / equivalent / undecided from a test "
             f"over seeds and dev examples together (runs paired by seed) and two one-sided tests of equivalence, "
             f"{family}, adjusted p < {options.alpha:g} (docs/statistics.md)", "")
    part.add(*provenance_warning(df))
    if loaded.commands:
        part.add("Commands that produced the runs:", "", "```", *loaded.commands, "```", "")
    else:
        part.add("Commands that produced the runs: not recorded (no commands.txt next to the runs).", "")
    if not (df[Col.STATUS] == "ok").any():
        part.add("**No run finished successfully.**", "")
    return part
