"""`python -m suite list`: every registered method (hyper-parameters, defaults) and task, within 100 columns."""
from __future__ import annotations

import shutil
import textwrap

from tabulate import tabulate

from suite.api import startup_cache
from suite.api.method_facts import method_facts, method_registry
from suite.api.tasks import TASKS, get_task, task_groups

COMMAND = "list"
MAX_WIDTH = 100


def add_parser(sub) -> None:
    sub.add_parser(COMMAND, help="methods with their hyper-parameters, and tasks",
                   description="Lists every registered method (with its hyper-parameters and their defaults) and "
                               "every task (text fields, labels, metrics), and plugins that failed to load.")


def width() -> int:
    """The terminal's width, at most 100 columns (and at least 60, for pipes and tiny windows)."""
    return max(60, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def _wrap(text: str, indent: str = "    ") -> str:
    return textwrap.fill(text, width(), initial_indent=indent, subsequent_indent=indent)


def method_lines() -> list[str]:
    lines = ["Methods (select with --methods; set with --set METHOD.KEY=VALUE):", ""]
    for name in method_registry().names():
        facts = method_facts(name)
        hp = ", ".join(f"{field}={default} ({kind})" for field, default, kind in facts.fields)
        lines += [_wrap(name, ""), _wrap(facts.description or "-"), _wrap("hyper-parameters: " + (hp or "none")), ""]
    return lines


def task_table() -> str:
    rows = []
    for name in TASKS.names():
        spec = get_task(name)
        groups = ",".join(spec.groups)
        rows.append([spec.name, " + ".join(spec.text_fields),
                     "regression" if spec.is_regression else ", ".join(spec.label_names),
                     ", ".join(spec.metric_keys()), groups])
    headers = ["task", "text", "labels", "metrics (score: mean)", "group"]
    # the columns share the width less their 2-space gaps; labels take what the others leave
    fixed = {"task": 6, "text": 21, "metrics (score: mean)": 23, "group": 7}  # a header takes 2 more columns
    labels = width() - 2 * (len(headers) - 1) - sum(fixed.values())
    return tabulate([[_breakable(cell) for cell in row] for row in rows], headers=headers, tablefmt="simple",
                    maxcolwidths=[fixed.get(h, labels) for h in headers])


def _breakable(text: str) -> str:
    """`text` with a space after every comma, so that a column wraps between names rather than inside one."""
    return ", ".join(part.strip() for part in text.split(","))


def plugin_error_lines() -> list[str]:
    lines = []
    for registry in (method_registry(), TASKS):
        for name, error in registry.plugin_errors.items():
            lines.append(_wrap(f"{registry.kind} plugin {name!r} failed to load: {error}", ""))
    return ["", "Plugins that failed to load:", *lines] if lines else []


def main(args) -> int:
    startup_cache.plan_only()  # the methods' facts may come from their catalog, without importing torch
    print("\n".join(method_lines()))
    print(_wrap("Tasks (select with --tasks; groups: " + ", ".join(task_groups()) + "):", "") + "\n")
    print(task_table())
    print("\n".join(plugin_error_lines()))
    return 0
