"""How the report writes things: fixed text formats (the markdown must not depend on locale or float noise), the part
of the document a section returns, and what the method and task registries say of the names in the records (defaults,
display names, benchmarks and their averages, metric direction); records of uninstalled methods or tasks still report
without the registries' knowledge.

Task knowledge comes from the task's `TaskSpec`, so a task from another package is reported under its own benchmark,
never under another's.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tabulate import tabulate

from suite.api.registry import normalise
from suite.run.record_parts import num  # noqa: F401  one definition, read by the report's sections as vocabulary

__all__ = ["DASH", "FIGURES", "SCALE", "Part", "Table", "average_note", "default_hparams", "fmt", "higher_is_better",
           "is_regression", "key_of", "metric_order", "num", "plural", "reconstruction_note", "same_value",
           "seed_ranges", "slug", "sort_key", "table", "task_benchmark", "task_display", "task_in_average",
           "task_order", "task_source", "task_spec", "unique", "value_text"]

SCALE = 100.0                  # scores are stored in [0, 1] (correlations in [-1, 1]) and shown x100
DASH = "–"                     # a cell with no run at all
FIGURES = "figures"            # the figures' folder beside the markdown


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


def seed_ranges(seeds: Iterable[int]) -> str:
    """Seeds as runs of consecutive numbers: 1–3, 7."""
    ordered, parts, start = sorted(seeds), [], None
    for i, s in enumerate(ordered):
        start = s if start is None else start
        if i + 1 == len(ordered) or ordered[i + 1] != s + 1:
            parts.append(str(start) if start == s else f"{start}–{s}")
            start = None
    return ", ".join(parts)


def plural(n: int, word: str = "run") -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


@dataclasses.dataclass(frozen=True)
class Table:
    """A table of the markdown that is also exported as CSV and LaTeX (markdown cells)."""
    headers: list[str]
    rows: list[list[str]]

    def columns(self, headers: Sequence[str], keep: Callable[[list[str]], bool] = lambda row: True) -> "Table":
        """These columns of the rows `keep` accepts: a compact view whose cells are the full table's own."""
        at = [self.headers.index(h) for h in headers]
        return Table(list(headers), [[row[i] for i in at] for row in self.rows if keep(row)])

    def markdown(self) -> str:
        return table(self.rows, self.headers)


@dataclasses.dataclass
class Part:
    """What one section adds to the document: its lines, the figures it drew (and links), its exported tables."""
    lines: list[str] = dataclasses.field(default_factory=list)
    figures: list[Path] = dataclasses.field(default_factory=list)
    # kind -> table (see document.EXPORTS); a report-wide section's: (model, kind) -> table
    tables: dict[str | tuple[str, str], Table] = dataclasses.field(default_factory=dict)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def link(self, path: Path, alt: str) -> None:
        """The figure at `path` (in the figures folder), shown in the markdown."""
        self.figures.append(path)
        self.add(f"![{alt}]({FIGURES}/{path.name})", "")

    def extend(self, other: "Part") -> None:
        self.lines += other.lines
        self.figures += other.figures
        self.tables.update(other.tables)


RECONSTRUCTION_NOTE = ("reconstruction from the paper's description, not the authors' code; its numbers are not "
                       "the paper's")


def method_class(name: str):
    from suite.api.attention import METHODS

    try:
        return METHODS.get(name)
    except Exception:  # noqa: BLE001  a method from an uninstalled plugin: report it without its metadata
        return None


def default_hparams(method: str) -> str | None:
    cls = method_class(method)
    if cls is None:
        return None
    try:
        return key_of(dataclasses.asdict(cls.Config()))
    except Exception:  # noqa: BLE001
        return None


def reconstruction_note(method: str) -> str | None:
    """None, or why the method's numbers are not a published method's own (class attribute `reconstruction`)."""
    mark = getattr(method_class(method), "reconstruction", False)
    if not mark:
        return None
    return mark if isinstance(mark, str) else RECONSTRUCTION_NOTE


def task_spec(name: str):
    from suite.api.tasks import get_task

    try:
        return get_task(name)
    except Exception:  # noqa: BLE001
        return None


def task_display(name: str) -> str:
    spec = task_spec(name)
    return spec.display if spec is not None else name


def _group_of(name: str) -> str:
    """The registration group of a task (the benchmark name when the spec does not state one)."""
    from suite.api.tasks import task_groups

    groups = [g for g, members in sorted(task_groups().items()) if normalise(name) in map(normalise, members)]
    return groups[0].upper() if groups else ""


def task_benchmark(name: str) -> str:
    """The benchmark whose average the task joins ("" for a task averaged with no other)."""
    spec = task_spec(name)
    if spec is None:
        return ""
    explicit = getattr(spec, "benchmark", None)
    return explicit if explicit is not None else _group_of(name)


def task_in_average(name: str) -> bool:
    spec = task_spec(name)
    return bool(task_benchmark(name)) and bool(getattr(spec, "in_average", True))


def average_note(name: str) -> str:
    """Why a task is left out of its benchmark's average ("" when the spec gives no reason)."""
    return str(getattr(task_spec(name), "average_note", "") or "")


def task_source(name: str) -> tuple[str, str]:
    """(hub dataset path, benchmark) of a task, for the data line of the header."""
    spec = task_spec(name)
    hub = getattr(spec, "hub", None)
    return (hub[0] if hub else "", task_benchmark(name))


def higher_is_better(task: str) -> bool:
    return getattr(task_spec(task), "higher_is_better", True)


def is_regression(task: str) -> bool:
    return bool(getattr(task_spec(task), "is_regression", False))


def task_order(names: Iterable[str]) -> list[str]:
    """Registered groups' order first (e.g. GLUE's usual column order), then other registered tasks, then others."""
    from suite.api.tasks import task_groups

    rank: dict[str, int] = {}
    for members in task_groups().values():
        for m in members:
            rank.setdefault(normalise(m), len(rank))
    return sorted(set(names), key=lambda n: (rank.get(normalise(n), len(rank)), n))


def metric_order(task: str, keys: Iterable[str]) -> list[str]:
    spec = task_spec(task)
    official = spec.metric_keys() if spec is not None else []
    keys = set(keys) - {"score"}
    return [k for k in official if k in keys] + sorted(keys - set(official))


def _number(x: Any) -> float | None:
    """A number, or a number written as text (a search space may quote "1e-4"; the run trained on the float)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(x) if isinstance(x, str) else None
    except ValueError:
        return None


def same_value(a: Any, b: Any) -> bool:
    """Equal as the runs read them: a setting written as text in a search space ("1e-4") and the number it ran."""
    na, nb = _number(a), _number(b)
    if na is not None and nb is not None and (not isinstance(a, str) or not isinstance(b, str)):
        return na == nb
    return a == b
