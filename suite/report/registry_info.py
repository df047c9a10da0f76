"""What the method and task registries know; records of uninstalled methods or tasks still report without it.

Task knowledge (display name, benchmark, whether a task enters its benchmark's average and why not) comes from the
task's `TaskSpec`, so a task from another package is reported under its own benchmark, never under another's.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from suite.api.registry import normalise
from suite.report.formatting import key_of

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
