"""Which form of a method ran, footnoted under every table that shows the method's rows: AttendOut's baseline and
masks per update, read from its records' config (the published records ran `rloo` with 2 masks, before the default
became the paper's Attacker-vs-Defender comparison with one mask)."""
from __future__ import annotations

from collections import Counter

import pandas as pd

from suite.report.load import Col
from suite.report.vocabulary import Part, method_class, plural

__all__ = ["MARK", "footnoted", "form_notes"]

FORM_KEYS = {"attendout": ("baseline", "mask_samples")}  # method -> the hyper-parameters that name its form
MARK = "Form:"  # not a symbol: ‡ marks a sequential verdict in the same tables


def _form_text(baseline, masks) -> str:
    if baseline is None or masks is None:
        return "a form its records do not name"
    return f"baseline `{baseline}` with {plural(int(masks), 'mask')} of G per update (`mask_samples`)"


def form_notes(records: pd.DataFrame) -> dict[str, str]:
    """Method -> its note, for the methods of FORM_KEYS that have records: the forms its records ran, counted."""
    notes = {}
    for method, keys in FORM_KEYS.items():
        sub = records[records[Col.METHOD] == method] if len(records) else records
        if not len(sub):
            continue
        forms = Counter(tuple(hp.get(k) for k in keys) for hp in sub[Col.HP])
        ran = "; ".join(f"{_form_text(*form)} in {plural(n, 'record')}" for form, n in sorted(forms.items(), key=str))
        default = method_class(method).Config()
        today = _form_text(*(getattr(default, k) for k in keys))
        notes[method] = (f"{MARK} `{method}`'s records ran {ran}, as their config says; today's default is "
                         f"{today}.")
    return notes


def _first_cells(table_text: str) -> list[str]:
    """The first cell of each body row of a markdown (github) table."""
    return [row.strip().strip("|").split("|")[0].strip() for row in table_text.splitlines()[2:]]


def footnoted(part: Part, notes: dict[str, str]) -> Part:
    """The part with each method's note right after every table that has a row of that method."""
    if not notes:
        return part
    lines = []
    for line in part.lines:
        lines.append(line)
        if line.startswith("|"):
            cells = _first_cells(line)
            lines += [f"\n{note}" for method, note in notes.items()
                      if any(c == method or c.startswith(f"{method} ") for c in cells)]
    part.lines = lines
    return part
