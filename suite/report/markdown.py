"""The report's markdown as text: its prose wrapped at a fixed width, so that the file reads in a terminal and a diff
and renders as before (to a markdown renderer, a line break inside a paragraph or a list item is a space).

Table rows, headings, fenced code, indented code, quotes and HTML lines are left as they are. A line is broken only at
a single space between two words, never where the next word would start a block of its own at the start of a line (a
list item, heading, quote, table row, fence, rule or HTML), never after a backslash (a hard line break), and a list
item's continuation lines are indented to its text. A word longer than the width (a URL, a long code span) stays
whole on a line of its own length.
"""
from __future__ import annotations

import re

__all__ = ["WIDTH", "breakable", "unwrap_prose", "wrap_prose"]

WIDTH = 120   # ruff's line length too: one width for the code and the report

FENCE = re.compile(r"^ {0,3}(```|~~~)")
# lines left whole: table rows, headings, quotes, HTML, indented code, and blank lines
KEEP = re.compile(r"^(?: {0,3}[|#><]| {4,}|\t|\s*$)")
ITEM = re.compile(r"^( {0,3})((?:[-+*]|\d{1,9}[.)]) +)?")
# a word that, first on a line, would begin a block of its own instead of continuing the paragraph
BLOCK_WORD = re.compile(r"(?:[-+*]|\d{1,9}[.)]|#{1,6})(?: |$)|[>|<]|[-*_=]{3,}|=+(?: |$)|```|~~~")
BREAK = re.compile(r"(?<=[^\s\\]) (?=\S)")


def breakable(text: str) -> list[int]:
    """The positions of the spaces in `text` at which a line may break."""
    return [m.start() for m in BREAK.finditer(text) if not BLOCK_WORD.match(text, m.start() + 1)]


def _fill(line: str, width: int) -> list[str]:
    item = ITEM.match(line)
    first = item.group(0)
    rest = " " * len(first)   # a list item's continuation lines start where its text starts
    body, lines, start, indent = line[len(first):], [], 0, first
    cuts = breakable(body)
    while len(indent) + len(body) - start > width:
        later = [p for p in cuts if p > start]
        if not later:
            break
        fitting = [p for p in later if len(indent) + p - start <= width]
        cut = fitting[-1] if fitting else later[0]
        lines.append(indent + body[start:cut])
        start, indent = cut + 1, rest
    return [*lines, indent + body[start:]]


def wrap_prose(text: str, width: int = WIDTH) -> str:
    """`text` (markdown) with every prose line longer than `width` wrapped."""
    out, fence = [], ""   # the open fence's marker, "" outside code
    for line in text.split("\n"):
        marker = FENCE.match(line)
        if marker and (not fence or marker.group(1) == fence):
            fence = "" if fence else marker.group(1)
            out.append(line)
        elif fence or KEEP.match(line) or len(line) <= width:
            out.append(line)
        else:
            out.extend(_fill(line, width))
    return "\n".join(out)


def unwrap_prose(text: str) -> str:
    """The inverse of `wrap_prose`: each paragraph's and list item's lines joined into one, as a renderer reads them
    (a tool that looks for a phrase in the report reads it so)."""
    out, fence = [], ""
    for line in text.split("\n"):
        marker = FENCE.match(line)
        prev = out[-1] if out else ""
        if marker and (not fence or marker.group(1) == fence):
            fence = "" if fence else marker.group(1)
        elif (not fence and line.strip() and not BLOCK_WORD.match(line.lstrip()) and prev.strip()
              and not KEEP.match(prev) and not FENCE.match(prev)):
            out[-1] = f"{prev} {line.lstrip()}"
            continue
        out.append(line)
    return "\n".join(out)
