"""The report's tables beside the markdown: CSV (pandas) and LaTeX (tabulate, cells escaped here), plus every comparison
with its statistics as numbers (comparisons.csv)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pandas as pd
from tabulate import tabulate

TABLES = {"leaderboard": "leaderboard", "differences": "leaderboard_differences",
          "comparisons": "leaderboard_comparisons",
          "stability": "leaderboard_stability"}
LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                 "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                 "±": r"$\pm$", "×": r"$\times$", "–": "--", "°": r"$^\circ$", "†": r"$^\dagger$",
                 "Δ": r"$\Delta$", "‡": r"$^\ddagger$", "ˢ": r"$^{s}$", "ε": r"$\varepsilon$", "·": r"$\cdot$",
                 "≥": r"$\geq$", "≤": r"$\leq$", "→": r"$\rightarrow$", "α": r"$\alpha$"}


def plain(text: str) -> str:
    """A markdown cell as plain text: bold and italics markers removed, escaped pipes restored."""
    return re.sub(r"\*\*(.+?)\*\*", r"\1", re.sub(r"^\*(.+)\*$", r"\1", str(text))).replace("\\|", "|")


def latex(text: str) -> str:
    """A markdown cell as LaTeX: special characters escaped, bold as \\textbf."""
    parts = re.split(r"\*\*(.+?)\*\*", re.sub(r"^\*(.+)\*$", r"\1", str(text)))
    escaped = ["".join(LATEX_SPECIAL.get(ch, ch) for ch in p) for p in parts]
    return "".join(f"\\textbf{{{p}}}" if i % 2 else p for i, p in enumerate(escaped))


def frame(tables: dict, kind: str) -> pd.DataFrame | None:
    parts = []
    for (model, k), (headers, rows) in sorted(tables.items()):
        if k == kind:
            parts.append(pd.DataFrame([[model, *map(plain, r)] for r in rows], columns=["model", *headers]))
    return pd.concat(parts, ignore_index=True) if parts else None


def latex_tables(tables: dict, kind: str) -> str:
    blocks = []
    for (model, k), (headers, rows) in sorted(tables.items()):
        if k == kind:
            body = tabulate([[latex(c) for c in r] for r in rows], headers=[latex(h) for h in headers],
                            tablefmt="latex_raw",
                            disable_numparse=True)
            blocks.append(f"% model: {model}\n{body}")
    return "\n\n".join(blocks) + "\n"


def write_exports(out: Path, tables: dict, comparisons: dict) -> list[Path]:
    """Write every table kind present as CSV and LaTeX, and comparisons.csv; returns the files written."""
    written = []
    for kind, stem in TABLES.items():
        df = frame(tables, kind)
        if df is None:
            continue
        df.to_csv(out / f"{stem}.csv", index=False, lineterminator="\n")
        (out / f"{stem}.tex").write_text(latex_tables(tables, kind))
        written += [out / f"{stem}.csv", out / f"{stem}.tex"]
    rows = [{"model": model, **dataclasses.asdict(c)} for model, comps in sorted(comparisons.items())
            for _, c in sorted(comps.items()) if c.n]  # a cell one of the two never ran: nothing was compared
    if rows:
        pd.DataFrame(rows).to_csv(out / "comparisons.csv", index=False, lineterminator="\n", float_format="%.6g")
        written.append(out / "comparisons.csv")
    return written
