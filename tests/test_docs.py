"""The README and docs/ stay true: every relative link resolves (the file, and for `#anchor` the heading, by GitHub's
anchor rules), and every command block marked runnable (fence info string `bash runnable`, see docs/design.md) works:
`run` lines plan with --dry-run, `list` runs, the other commands parse."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_GLUE = ROOT.parent / "shared" / "data" / "glue"  # where tests/conftest.py finds the real GLUE TSVs
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
# commands that would train, measure or write results: the test checks that their options parse, no more
PARSE_ONLY = {"report", "check", "predict", "bench", "reproduce"}


def blocks_and_prose(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Fenced code blocks as (info string, body), and the lines outside them."""
    blocks, prose, fence, info, body = [], [], None, "", []
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence, info, body = match.group(2), match.group(3).strip(), []
        elif fence is not None and match and match.group(2).startswith(fence) and not match.group(3).strip():
            blocks.append((info, "\n".join(body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    return blocks, prose


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation dropped, spaces turned to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    _, prose = blocks_and_prose(path.read_text(encoding="utf-8"))
    found, seen = set(), {}
    for line in prose:
        found.update(EXPLICIT_ANCHOR.findall(line))
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_anchor(heading.group(1))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(path: Path) -> list[str]:
    """Relative links of one markdown page whose file or heading does not exist, as 'page: target (why)'."""
    _, prose = blocks_and_prose(path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`]*`", "", "\n".join(prose))  # links inside inline code are text
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{path.name}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{path.name}: {target} (no heading #{anchor} in {linked.name})")
    return broken


def runnable_commands(path: Path) -> list[list[str]]:
    """The commands of the page's `bash runnable` blocks, continuation lines joined and comments dropped."""
    blocks, _ = blocks_and_prose(path.read_text(encoding="utf-8"))
    commands = []
    for info, body in blocks:
        if info.split()[1:2] != ["runnable"]:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def as_checked(words: list[str], tmp: Path) -> tuple[str, list[str]]:
    """What the test does with one documented command: ('run', argv) for a dry run or `list`, ('parse', argv) else."""
    assert words[:3] == ["python", "-m", "suite"] and len(words) > 3, f"not a `python -m suite` command: {words}"
    argv = words[3:]
    if argv[0] != "run":
        return ("parse" if argv[0] in PARSE_ONLY else "run"), argv
    checked = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--data-dir", "--out") and i + 1 < len(argv):
            # the shared GLUE folder wherever the checkout sits; records planned into a scratch folder
            checked += [argv[i], str(SHARED_GLUE if argv[i] == "--data-dir" else tmp / argv[i + 1].strip("/"))]
            i += 2
        else:
            checked.append(argv[i])
            i += 1
    return "run", [*checked, "--dry-run"]


# One child process runs every documented command through the suite's own entry point (the import costs seconds,
# paid once); it reports each command's exit status and the tail of what it printed.
CHILD = textwrap.dedent("""
    import contextlib, io, json, sys
    from suite.commands import build_parser, main
    results = []
    for mode, argv in json.loads(sys.argv[1]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                rc = main(argv) if mode == "run" else (build_parser().parse_args(argv) and 0)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
        results.append([rc, out.getvalue()[-600:]])
    print(json.dumps(results))
""")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert not broken_links(page)


def test_every_docs_page_is_linked_from_the_readme():
    _, prose = blocks_and_prose((ROOT / "README.md").read_text(encoding="utf-8"))
    linked = {target.partition("#")[0] for target in LINK.findall("\n".join(prose))}
    assert not [page.name for page in PAGES[1:] if f"docs/{page.name}" not in linked]


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Options of `run`\n\n<a id=\"kept\"></a>\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## Running a grid: one machine or many\n\n"
                    "[ok](other.md#options-of-run) [ok](other.md#kept) [ok](#running-a-grid-one-machine-or-many) "
                    "[web](https://example.org/x) `[code](nowhere.md)`\n"
                    "[gone](missing.md) [bad anchor](other.md#options) [self](#nowhere)\n\n"
                    "```\n[in a code block](nowhere.md)\n```\n")
    assert broken_links(page) == ["page.md: missing.md (no such file)",
                                  "page.md: other.md#options (no heading #options in other.md)",
                                  "page.md: #nowhere (no heading #nowhere in page.md)"]


def test_github_anchors_follow_githubs_rules():
    assert github_anchor("Cost: `python -m suite bench`") == "cost-python--m-suite-bench"
    assert github_anchor("`topk`: top-k selective attention") == "topk-top-k-selective-attention"
    assert github_anchor("bf16 against fp32") == "bf16-against-fp32"
    page = ROOT / "docs" / "reliability.md"
    assert "bad-input-stops-before-training-exit-2" in anchors(page)


def test_runnable_blocks_are_found_with_their_continuations(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash runnable\npython -m suite run --methods vanilla \\\n    --tasks rte  # a comment\n```\n"
                    "```bash\npython -m suite run ...\n```\n")
    assert runnable_commands(page) == [["python", "-m", "suite", "run", "--methods", "vanilla", "--tasks", "rte"]]
    assert as_checked(runnable_commands(page)[0], tmp_path) == (
        "run", ["run", "--methods", "vanilla", "--tasks", "rte", "--dry-run"])


def test_every_runnable_command_works(tmp_path):
    if not SHARED_GLUE.is_dir():
        pytest.skip(f"the real GLUE TSVs are not at {SHARED_GLUE}")
    documented = [(page, words) for page in PAGES for words in runnable_commands(page)]
    # the README's main job and the study, the usage examples with local data: the blocks that matter are marked
    assert {page.name for page, _ in documented} >= {"README.md", "usage.md", "studies.md"}
    checked = [as_checked(words, tmp_path) for _, words in documented]
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(checked)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    results = json.loads(child.stdout.splitlines()[-1])
    failed = [f"{page.relative_to(ROOT)}: {shlex.join(words)} -> exit {rc}\n{tail}"
              for (page, words), (rc, tail) in zip(documented, results) if rc != 0]
    assert not failed, "\n\n".join(failed)
