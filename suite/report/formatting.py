"""Fixed text formats for the report: the markdown must not depend on locale or float noise."""
from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable

from tabulate import tabulate

SCALE = 100.0                  # scores are stored in [0, 1] (correlations in [-1, 1]) and shown x100
DASH = "–"                     # a cell with no run at all


def fmt(x: float | None, digits: int = 2, sign: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return DASH
    x = round(float(x), digits) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def cell_text(text: str) -> str:
    """Markdown table cells cannot hold a bare pipe or a newline."""
    return text.replace("|", "\\|").replace("\n", " ")


def value_text(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return json.dumps(v) if not isinstance(v, str) else v


def sort_key(v: Any) -> tuple:
    if v is None:
        return (0, 0, "")
    if isinstance(v, bool):
        return (1, int(v), "")
    if isinstance(v, (int, float)):
        return (2, float(v), "")
    return (3, 0, json.dumps(v, sort_keys=True, default=str))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.rstrip("/").split("/")[-1]).strip("-") or "model"


def num(x: Any) -> float:
    """A finite float, or NaN for anything else (None, strings, inf)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def key_of(d: dict) -> str:
    """A dict as a canonical string (hyper-parameters and training settings are grouped by it)."""
    return json.dumps(d, sort_keys=True, default=str)


def unique(values: Iterable[Any]) -> list[Any]:
    """Sorted distinct values, without None, "" and NaN (what pandas puts in cells a record lacks)."""
    return sorted({v for v in values if v not in (None, "") and not (isinstance(v, float) and math.isnan(v))},
                  key=sort_key)


def table(rows: list[list[str]], headers: list[str]) -> str:
    return tabulate([[cell_text(str(c)) for c in r] for r in rows], headers=[cell_text(h) for h in headers],
                    tablefmt="github", disable_numparse=True)


def plural(n: int, word: str = "run") -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"
