"""One look of a sequential design at a comparison's runs, as `run --until-decided` takes it and the report replays it
from the records to hold a state file against them (the one place a look is decided, so the two cannot drift).

A look's entry (OUT/until_decided.json, `suite.run.layout.Look`): its number, the seeds planned up to it, the paired
seeds compared (those where neither run degenerated), the evidence and the boundary, the stopping reason and verdict.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from suite.stats.sequential import Design

__all__ = ["next_look"]

# the evidence of two arms keyed by seed (ok runs only) -> an Evidence (suite.stats.evidence)
Evaluate = Callable[[Mapping[int, Any], Mapping[int, Any]], Any]


def next_look(looks: list[dict[str, Any]], design: Design, ours: Mapping[int, Any], theirs: Mapping[int, Any],
              evaluate: Evaluate, look: int, seeds: list[int]) -> dict[str, Any]:
    """The entry of look number `look` (from 0) after `looks` (the comparison's earlier entries), from the ok runs of
    each arm among the `seeds` planned up to it. A look without new evidence (runs failed, or degenerated) spends
    nothing and keeps the last one's information count."""
    paired = sorted(set(ours) & set(theirs))
    last = look == len(design.looks) - 1
    previous = looks[-1] if looks else None
    # the look's information is its number of compared seeds; a look without new evidence keeps the last one's
    entry: dict[str, Any] = {"look": look + 1, "planned_seeds": len(seeds), "n": previous["n"] if previous else 0,
                             "seeds": list(previous["seeds"]) if previous else [], "paired": len(paired)}
    new = previous is None or len(paired) != previous.get("paired", previous["n"]) or last
    if len(paired) >= 2 and new:
        ev = evaluate({s: ours[s] for s in paired}, {s: theirs[s] for s in paired})
        entry.update({k: _number(getattr(ev, k)) for k in ("collapse_p",) if hasattr(ev, k)},
                     **{k: int(getattr(ev, k)) for k in ("degenerate", "degenerate_reference") if hasattr(ev, k)})
        # the seeds where neither run degenerated (an evaluator without the collapse endpoint: every paired seed)
        compared = list(ev.compared) if getattr(ev, "n_paired", -1) >= 0 else paired
        if len(compared) >= 2:
            _decide(entry, looks, design, ev, compared)
    if "reason" not in entry:   # no evidence (runs failed, or degenerated): nothing is spent at this look
        entry.update(reason="cap" if last else "continue", verdict="undecided",
                     note=f"{len(paired)} paired seed(s) with ok records: no new evidence at this look")
    return entry


def _decide(entry: dict[str, Any], looks: list[dict[str, Any]], design: Design, ev, compared: list[int]) -> None:
    history = [e["n"] for e in looks] + [len(compared)]
    level, level_equiv = design.levels(history)
    reason, verdict = design.decide(ev, history)
    entry.update(n=len(compared), seeds=compared, reason=str(reason), verdict=str(verdict), level=level,
                 level_equiv=level_equiv,
                 **{k: _number(getattr(ev, k)) for k in ("diff", "se", "df", "low", "high", "p", "p_equiv", "margin",
                                                         "seed_sd", "example_se", "p_sign") if hasattr(ev, k)})
    if hasattr(ev, "sign_excess"):   # the sign test's direction: seeds won minus seeds lost by the method
        entry["sign_excess"] = int(ev.sign_excess)
    if entry["reason"] == "futility":
        entry["predictive_power"] = _number(design.predictive_power(ev, len(compared)))


def _number(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None
