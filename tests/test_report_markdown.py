"""The report's prose wrapping (`suite.report.markdown`): a wrapped text renders as the unwrapped one, tables, headings
and code stay whole, and no continuation line starts a block of its own (a list item, a heading, a quote...)."""
from __future__ import annotations

import random

import pytest

from suite.report.markdown import BLOCK_WORD, ITEM, breakable, unwrap_prose, wrap_prose

# words that a careless wrap would put first on a line, where each starts a block of its own
TRAPS = ["-", "+", "*", "1.", "2)", "#", "##", ">", "|", "<br>", "---", "===", "```", "~~~", "\\"]
WORDS = ["a", "bb", "word", "`code span`", "**bold**", "x100", "±1.00", "[-0.42, +0.55]", "`p_sign`"]


def rendered(text: str) -> str:
    """The HTML a CommonMark renderer (with GitHub's tables) makes of `text`, whitespace runs as one space."""
    markdown_it = pytest.importorskip("markdown_it", reason="pip install -e \".[test]\" (markdown-it-py)")
    return " ".join(markdown_it.MarkdownIt("commonmark").enable("table").render(text).split())


def random_document(rng: random.Random) -> str:
    lines = []
    for _ in range(6):
        words = " ".join(rng.choice(TRAPS if rng.random() < 0.3 else WORDS) for _ in range(rng.randint(5, 40)))
        lines += [rng.choice(["- ", "1. ", "", "Note: "]) + "first " + words, ""]
    return "\n".join(lines)


@pytest.mark.parametrize("seed", range(40))
def test_a_wrapped_text_renders_as_the_original(seed):
    rng = random.Random(seed)
    text = random_document(rng)
    width = rng.choice([12, 20, 40])
    wrapped = wrap_prose(text, width)
    assert rendered(wrapped) == rendered(text)
    assert unwrap_prose(wrapped) == text and wrap_prose(wrapped, width) == wrapped
    for line in wrapped.splitlines():
        lead = len(ITEM.match(line).group(0))  # a list item's marker, or a continuation's indent
        if len(line) > width:   # only where no break would keep it within the width
            assert not [p for p in breakable(line[lead:]) if lead + p <= width], line
        if line.startswith(" "):  # a list item's continuation: indented to its text, never a block marker
            assert not BLOCK_WORD.match(line.lstrip()), line


def test_tables_headings_and_code_stay_whole_and_list_items_keep_their_indent():
    long = "word " * 40
    text = "\n".join([f"# {long}", "", f"| {long} |", "|---|", f"| {long} |", "", "```", long, "```", "",
                      f"- {long}- {long}", "", f"10. {long}"])
    lines = wrap_prose(text, 60).splitlines()
    assert lines[:9] == text.splitlines()[:9]   # the heading, the table and the code: as they were
    item = lines[10:lines.index("", 10)]
    assert len(item) > 1 and all(x.startswith("  ") and len(x) <= 60 for x in item[1:])
    assert not any(x.lstrip().startswith("- ") for x in item[1:])   # "- " inside the item never starts a line
    assert all(x.startswith("    ") for x in lines[lines.index("", 10) + 2:])   # "10. ": four columns
