"""The report's section for `run --until-decided`: each primary comparison's looks, seeds and stopping reason.

It reads OUT/until_decided.json, which the run command writes after every look (suite.grid.until_decided); '' when
no reported folder has one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from suite.report.load import output_files

STATE = "until_decided.json"
REASONS = {"efficacy": "efficacy (a difference)", "equivalence": "equivalence (within the margin)",
           "futility": "futility (no decision reachable by the cap)", "cap": "reached the cap undecided",
           "continue": "open (the loop is running or was interrupted)"}


def state_files(run_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    """The state files of the output folders reported."""
    return output_files(run_dirs, STATE)


def verdicts(run_dirs: Sequence[str | os.PathLike]) -> dict[tuple[str, str, str, str], tuple[str, str]]:
    """{(model, method, task, reference): (verdict, stopping reason)} of every comparison the state files hold."""
    found = {}
    for path in state_files(run_dirs):
        for c in json.loads(path.read_text())["comparisons"]:
            found[c["model"], c["method"], c["task"], c["reference"]] = (c["verdict"], c["reason"])
    return found


def _num(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _row(c: dict[str, Any]) -> str:
    last = c["looks"][-1] if c["looks"] else {}
    evidence = (f"{_num(last.get('diff'), '+.2f')} [{_num(last.get('low'), '+.2f')}, {_num(last.get('high'), '+.2f')}]"
                if last.get("diff") is not None else "—")
    p = f"{_num(last.get('p'), '.2g')} (< {_num(last.get('level'), '.2g')})" if last.get("level") else "—"
    tost = (f"{_num(last.get('p_equiv'), '.2g')} (< {_num(last.get('level_equiv'), '.2g')}, ±{last['margin']:g})"
            if last.get("level_equiv") and last.get("margin") is not None else "—")
    ns = " → ".join(str(lk["n"]) for lk in c["looks"])
    return (f"| {c['task']} | {c['method']} vs {c['reference']} | {len(c['looks'])} | {ns} | "
            f"{REASONS.get(c['reason'], c['reason'])} | **{c['verdict']}** | {evidence} | {p} | {tost} |")


def markdown(run_dirs: Sequence[str | os.PathLike]) -> str:
    """The section as markdown ('' when no folder was run with --until-decided)."""
    lines: list[str] = []
    for path in state_files(run_dirs):
        state = json.loads(path.read_text())
        looks = ", ".join(map(str, state["looks"]))
        lines += ["", "## Seeds added until decided", "",
                  f"`run --until-decided` looked at the primary comparisons at {looks} seeds and gave further seeds "
                  f"only to those still undecided. Rule: {state['rule']}; alpha {state['alpha']:g} over "
                  f"{state['primary']} primary comparison(s), {state['alpha_each']:.3g} each (`{path}`).", "",
                  "A comparison's verdict here is the one whose error rate holds over the looks, and the one the "
                  "difference and comparison tables report (marked ‡); their intervals and p-values treat the same "
                  "seeds as one fixed-size sample and do not account for the looks.", "",
                  "| task | comparison | looks | paired seeds per look | stopped for | verdict | diff [95% interval] "
                  "| p (look's level) | TOST p (level, margin) |",
                  "|---|---|---:|---|---|---|---|---|---|"]
        lines += [_row(c) for c in state["comparisons"]]
    return "\n".join(lines) + ("\n" if lines else "")
