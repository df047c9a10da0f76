"""The ‡ note under every report table with AttendOut rows names the form its records ran (baseline, masks per
update), read from their config, and tables without AttendOut rows get none."""
from __future__ import annotations

import pandas as pd

from suite.report.forms import footnoted, form_notes
from suite.report.load import Setting
from suite.report.vocabulary import Part, table


def _records(*forms) -> pd.DataFrame:
    rows = [{"method": "attendout", "hp": Setting.of({"baseline": b, "mask_samples": k, "p_max": 0.3})}
            for b, k in forms]
    return pd.DataFrame(rows + [{"method": "vanilla", "hp": Setting.of({"p": 0.1})}])


def test_the_note_counts_each_form_the_records_ran():
    note = form_notes(_records(("rloo", 2), ("rloo", 2), ("defender", 8)))["attendout"]
    assert "baseline `rloo` with 2 masks of G per update (`mask_samples`) in 2 records" in note
    assert "baseline `defender` with 8 masks of G per update (`mask_samples`) in 1 record" in note
    assert note.endswith("today's default is baseline `defender` with 1 mask of G per update (`mask_samples`).")
    assert form_notes(_records()) == {}  # no AttendOut record: no note


def test_only_tables_with_an_attendout_row_get_the_note():
    notes = form_notes(_records(("rloo", 2)))
    part = Part()
    part.add(table([["attendout † [p_init=0.2]", "1"], ["vanilla", "2"]], ["method", "x"]), "",
             table([["vanilla", "2"]], ["method", "x"]), "", table([["attendout_like", "3"]], ["method", "x"]))
    lines = footnoted(part, notes).lines
    marked = [i for i, line in enumerate(lines) if line.lstrip().startswith("‡")]
    assert marked == [1]  # right after the first table, and after no other
