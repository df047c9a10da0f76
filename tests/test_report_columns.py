"""The run table's columns are declared once (`suite.report.load.Col`) and read through those names: `load` gives
exactly the declared columns, and no report module reads one by its text."""
from __future__ import annotations

import ast
from pathlib import Path

from test_report import make_record

from suite.grid.store import Store
from suite.report.load import ADDED_BY_SELECTION, LOADED, Col, load

REPORT = Path(__file__).resolve().parents[1] / "suite" / "report"
# pandas methods whose arguments name columns (positional, keyword, or in a list or tuple)
COLUMN_TAKING = {"get", "groupby", "sort_values", "drop_duplicates", "drop", "dropna", "set_index", "pivot",
                 "pivot_table", "value_counts", "nlargest", "nsmallest", "duplicated", "melt", "explode"}
# reads by a column's text of something other than the run table: (module, the read's source)
NOT_THE_RUN_TABLE = {
    ("costs.py", "setting['method']"),                                # the bench file's rows
    ("costs.py", "r['method']"),
    ("costs.py", "r['peak_mb']"),
    ("costs.py", "ref['peak_mb']"),
    ("costs.py", "'peak_mb' in r"),
    ("coverage.py", "job.to_dict()['train']"),                       # a planned job's settings
    ("facts.py", "read_local_split(spec, split, local)['label']"),    # the task's dev split
    ("facts.py", "scores[kind]['score']"),                            # a constant predictor's metrics
    ("facts.py", "scores['chance']['score']"),
    ("figures.py", "marks['train']"),                                 # a legend's markers
    ("leaderboard.py", "'data' in sources"),                          # where the baselines came from
}


def _column(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and node.value in set(Col) else None


def _named(node: ast.AST) -> list[str]:
    """The column texts `node` is, or holds in a list or tuple."""
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    return [c for c in map(_column, items) if c]


def _itertuples_rows(tree: ast.AST) -> set[str]:
    """Names bound to the rows of an `.itertuples()` loop or comprehension."""
    rows = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name) \
                and isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Attribute) \
                and node.iter.func.attr == "itertuples":
            rows.add(node.target.id)
    return rows


def literal_column_reads(path: Path) -> list[str]:
    """`file:line: source` of each read of a run-table column by its text in one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rows, found = _itertuples_rows(tree), []
    for node in ast.walk(tree):
        named: list[str] = []
        if (path.name, ast.unparse(node)) in NOT_THE_RUN_TABLE:
            continue
        if isinstance(node, ast.Subscript):  # df["score"], df[["task", "method"]], df.loc[mask, "hash"]
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            named = [c for part in parts for c in _named(part)]
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):  # "seed" in df
            named = _named(node.left)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in COLUMN_TAKING:  # df.groupby(["model", "task"]), row.get("tuned")
                named = [c for a in [*node.args, *(k.value for k in node.keywords)] for c in _named(a)]
            elif node.func.attr in ("agg", "aggregate"):  # named aggregation: n=("seed", "size")
                named = [c for k in node.keywords if isinstance(k.value, ast.Tuple) and k.value.elts
                         for c in _named(k.value.elts[0])]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            named = _named(node.args[1]) if len(node.args) > 1 else []
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in rows:
            named = [node.attr] if node.attr in set(Col) else []  # row.seed of an itertuples row
        if named:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_report_module_reads_a_run_table_column_by_its_text():
    found = [hit for path in sorted(REPORT.glob("*.py")) for hit in literal_column_reads(path)]
    assert not found, "read these columns as `Col.NAME` (suite/report/load.py):\n" + "\n".join(found)
    # each exception still names a read that is there (else it would excuse a future one)
    sources = {(p.name, ast.unparse(n)) for p in REPORT.glob("*.py") for n in ast.walk(ast.parse(p.read_text()))}
    assert NOT_THE_RUN_TABLE <= sources, NOT_THE_RUN_TABLE - sources


def test_the_scan_finds_each_kind_of_literal_read(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("a = df['score']\nb = df[['task', 'method']]\nc = df.loc[m, 'hash']\n"
                       "d = df.groupby(['model', 'task'])\ne = row.get('tuned')\nf = df.sort_values(by='seed')\n"
                       "g = df.agg(n=('seed', 'size'))\nh = [r.outcome for r in df.itertuples()]\n"
                       "i = getattr(r, 'status')\nj = 'draw' not in df\n"
                       "k = df[Col.SCORE]\nl = marks['dev']\nm = df.agg(n=('x', 'size'))\nn = Col.SEED in df\n")
    lines = sorted(int(hit.split(":")[1]) for hit in literal_column_reads(planted))
    assert lines == list(range(1, 11))


def test_load_gives_exactly_the_declared_columns(tmp_path):
    store = Store(tmp_path)
    for name, rec in (make_record("rte", "vanilla", 1, {"accuracy": 0.6}),
                      make_record("rte", "vanilla", 2, status="failed")):
        store.write(name, rec)
    frame = load([tmp_path]).frame
    assert len(frame) == 2
    assert set(frame.columns) == LOADED
    assert LOADED.isdisjoint(ADDED_BY_SELECTION) and LOADED | ADDED_BY_SELECTION == set(Col)
