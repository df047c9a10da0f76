"""The report's sections on the stages beside the records: the files a tuning stage and `run --until-decided` leave
at an output root, read once into `Loaded` (suite.report.load) and held against the records (suite.report.state_checks).

- Tuning (docs/protocol.md): OUT/tuning/selection.json: each method's search space and budget, every configuration's
  tuning-split score (mean over the tuning seeds) and the configuration selected per (model, task, method). The
  tuning records themselves (OUT/tuning/runs/) never enter the leaderboard; the selected configurations tell which
  final runs a cell's leaderboard entry is (`suite.report.selection.fold_selected`).
- Seeds added until decided (docs/sequential.md): OUT/until_decided.json: each primary comparison's looks, seeds,
  stopping reason and verdict, which the comparisons report in place of the fixed-sample verdict (`verdicts`).

Each section is a function of (facts, options) like the others, and empty when no reported folder has its file.
"""
from __future__ import annotations

from typing import Any

from suite.report.facts import Options, ReportFacts
from suite.report.load import Loaded
from suite.report.state_checks import check_sequential, round_under_way
from suite.report.tuning_budget import method_rows, seeds_warning, tuned_with
from suite.report.vocabulary import Part
from suite.run.layout import Look, SelectedCell, TrackedComparison

REASONS = {"efficacy": "efficacy (a difference)", "equivalence": "equivalence (within the margin)",
           "futility": "futility (no decision reachable by the cap)", "cap": "reached the cap undecided",
           "continue": "open (its next look waits for runs without records: the loop is running, was stopped, or "
                       "was replayed)"}

__all__ = ["progress_lines", "sequential", "tuning", "verdicts"]


def verdicts(loaded: Loaded, alpha: float | None = None,
             margin=None) -> dict[tuple[str, str, str, str], tuple[str, str, Look | None]]:
    """{(model, method, task, reference): (verdict, stopping reason, last look)} of every comparison the state files
    hold, each file first held against the reported records: its looks replayed from them at the report's `alpha`
    (None: the file's) and `margin` (`suite.report.state_checks.check_sequential`)."""
    found = {}
    for path, state in loaded.until_decided:
        check_sequential(path, state, loaded.frame, state.alpha if alpha is None else alpha, margin)
        for c in state.comparisons:
            found[c.model, c.method, c.task, c.reference] = (c.verdict, c.reason, c.looks[-1] if c.looks else None)
    return found


def progress_lines(report: ReportFacts) -> list[str]:
    """The header's line on how far `run --until-decided` got: looks taken, comparisons open, a round incomplete."""
    from suite.stats.sequential import plan_looks

    lines, several = [], len(report.loaded.until_decided) > 1
    for path, state in report.loaded.until_decided:
        planned = plan_looks(state.schedule.start, state.schedule.step, state.schedule.cap)
        taken = max((len(c.looks) for c in state.comparisons), default=0)
        still = sum(c.reason == "continue" for c in state.comparisons)
        line = (f"- **Seeds added until decided{f' (`{path}`)' if several else ''}:** {taken} of up to "
                f"{len(planned)} looks taken (at {', '.join(map(str, planned))} seeds); "
                f"{len(state.comparisons) - still} of {len(state.comparisons)} primary comparison(s) stopped by the "
                f"rule, {still} open")
        if rounds := round_under_way(state, report.loaded.frame):
            line += f"; **a round is incomplete** ({_round_text(rounds)} have records)"
        lines.append(line + (": the open comparisons' verdicts are interim" if still else ""))
    return lines


def _round_text(rounds) -> str:
    return "; ".join(f"{r.recorded} of the {r.runs} runs look {r.look} needs (seeds {r.seeds})" for r in rounds)


def _num(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _row(c: TrackedComparison) -> str:
    last = c.looks[-1] if c.looks else Look(look=0, planned_seeds=0, n=0, seeds=[], reason="", verdict="")
    evidence = (f"{_num(last.diff, '+.2f')} [{_num(last.low, '+.2f')}, {_num(last.high, '+.2f')}]"
                if last.diff is not None else "—")
    p = f"{_num(last.p, '.2g')} (level {_num(last.level, '.2g')})" if last.level else "—"
    if last.level and getattr(last, "p_sign", None) is not None:   # state files from before the sign test lack it
        p += f"; sign {_num(last.p_sign, '.2g')}"
    tost = (f"{_num(last.p_equiv, '.2g')} (level {_num(last.level_equiv, '.2g')}, ±{last.margin:g})"
            if last.level_equiv and last.margin is not None else "—")
    # `n` counts the seeds where neither run degenerated (what the t and TOST use); the sign test has every paired seed
    ns = " → ".join(str(lk.n) if lk.paired in (None, lk.n) else f"{lk.n} of {lk.paired}" for lk in c.looks)
    return (f"| {c.task} | {c.method} vs {c.reference} | {len(c.looks)} | {ns} | "
            f"{REASONS.get(c.reason, c.reason)} | **{c.verdict}** | {evidence} | {p} | {tost} |")


def sequential(report: ReportFacts, options: Options) -> Part:
    """The looks and stopping reasons of `run --until-decided` (empty when no folder was run with it)."""
    part = Part()
    for path, state in report.loaded.until_decided:
        looks = ", ".join(map(str, state.looks))
        part.add("", "## Seeds added until decided", "",
                 f"`run --until-decided` looked at the primary comparisons at {looks} seeds and gave further seeds "
                 f"only to those still undecided. Rule: {state.rule}; alpha {state.alpha:g} over "
                 f"{state.primary} primary comparison(s), {state.alpha_each:.3g} each (`{path}`). Compared seeds are "
                 "the paired seeds where neither run degenerated (the t-test's and TOST's); the sign test counts every "
                 "paired seed, shown after \"of\" where a run degenerated.", "",
                 "A comparison's verdict here is the one whose error rate holds over the looks, and the one the "
                 "difference and comparison tables report (marked ‡); their intervals and p-values treat the same "
                 "seeds as one fixed-size sample and do not account for the looks.", "",
                 "| task | comparison | looks | compared seeds per look (of paired) | stopped for | verdict "
                 "| diff [95% interval] | p (look's level); sign test p | TOST p (level, margin) |",
                 "|---|---|---:|---|---|---|---|---|---|",
                 *(_row(c) for c in state.comparisons))
        if rounds := round_under_way(state, report.loaded.frame):
            part.add("", f"**A round is incomplete:** {_round_text(rounds)} have records. The open comparisons' "
                     "verdicts above are as of the looks taken; the loop takes the next look once every run of the "
                     "round has a record (the study's `run --until-decided` command resumes a stopped round). The "
                     "tables above already count the round's recorded runs, as fixed-sample evidence only, not a "
                     "decision.")
    return part


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


def tuning(report: ReportFacts, options: Options) -> Part:
    """Each tuning stage's protocol, selections and every configuration tried (empty when no folder has one)."""
    part = Part()
    for path, data in report.loaded.selections:
        p = data.protocol
        part.add("", "## Tuning", "",
                 f"Each method was tuned {tuned_with(p)} on a tuning split carved from the training data "
                 f"(train.holdout={_value(p.holdout)}), never on dev; the configuration with the best mean "
                 "tuning-split score is the one the tables above report, run on other seeds and scored on dev "
                 f"(`{path}`).", "", *seeds_warning(p), *method_rows(p, data.cells))
        part.add("", "Selected per task (tuning-split score x 100 in brackets):", "",
                 *_selected_table(data.cells), "", "### Every configuration tried")
        for cell in data.cells:
            part.add("", f"**{cell.task} / {cell.method}** (`{cell.model}`; tuning-split score x 100, "
                     f"{'higher' if cell.higher_is_better else 'lower'} is better): "
                     + (f"selected {_settings(cell.selected)}" if cell.selected is not None
                        else f"nothing selected ({cell.reason})"), "",
                     "| configuration | mean | per tuning seed | selected |", "|---|---:|---|:---:|")
            for c in cell.configurations:
                seeds = ", ".join(f"{s}: {_score(v)}" for s, v in c.scores.items())
                chosen = "✓" if c.settings == cell.selected else ""
                part.add(f"| {_settings(c.settings)} | {_score(c.mean)} | {seeds} | {chosen} |")
    return part
