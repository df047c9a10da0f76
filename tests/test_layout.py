"""The layout is the architecture: imports only point down, and nothing in the repository imports in a circle.

Layers, lowest first: `suite.api` (what plugin authors import) -> `suite.run` (one run) -> `suite.stats` (statistical
procedures) -> `suite.grid` (many runs), `suite.report`, `suite.profiling` (side by side, never importing each other)
-> `suite.commands` (the command line). `methods/` and `tasks/` are plugins: they see only `suite` and `suite.api`.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"api": 0, "testing": 0, "run": 1, "stats": 2, "grid": 3, "report": 3, "profiling": 3, "commands": 4,
          "__main__": 5}
PLUGIN_FOLDERS = {"methods": "suite.methods", "tasks": "suite.tasks"}
SCANNED = ("suite", "methods", "tasks", "benchmarks", "experiments", "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in PLUGIN_FOLDERS:
        parts[0:1] = PLUGIN_FOLDERS[parts[0]].split(".")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files() -> dict[str, Path]:
    files = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            files[module_name(path)] = path
    return files


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of the repository that `path` imports (at any depth of the file, lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    # a module known under a longer name stands for its package's modules too (import suite.api.x -> suite.api.x)
    return {m for m in found if m in known and m != name}


def layer(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if parts[0] != "suite" or len(parts) < 2 or parts[1] in ("methods", "tasks"):
        return None
    package = "api" if parts[1] == "testing" else parts[1]  # suite.testing: the method check's public path
    return package, LAYERS[package]


def test_suite_has_at_most_eight_entries():
    entries = {p.name for p in (ROOT / "suite").iterdir() if p.name not in ("__init__.py", "__main__.py",
                                                                             "__pycache__")}
    assert len(entries) <= 8, sorted(entries)
    assert {p.removesuffix(".py") for p in entries} <= set(LAYERS), "a new top-level entry needs a layer here"


def test_imports_only_point_down():
    files = python_files()
    wrong = []
    for name, path in files.items():
        here = layer(name)
        for target in imports(path, name, set(files)):
            there = layer(target)
            if name.startswith(("suite.methods", "suite.tasks")):
                if target.startswith("suite.") and not target.startswith(("suite.api", "suite.methods",
                                                                           "suite.tasks")):
                    wrong.append(f"{name} -> {target} (plugins import only suite and suite.api)")
            elif here and there and here[0] != there[0] and there[1] >= here[1]:
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_no_import_cycles():
    files = python_files()
    graph = {name: imports(path, name, set(files)) for name, path in files.items()}
    # a package's __init__ importing its own submodules is how packages export names, not a cycle of design
    graph = {n: {t for t in ts if not (t.startswith(n + ".") or n.startswith(t + ".") and
                                       files[t].name == "__init__.py")} for n, ts in graph.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_layer_check_sees_a_wrong_import(tmp_path):
    """The checks above must be able to fail: an upward import in a scratch file is found."""
    path = tmp_path / "x.py"
    path.write_text("from suite.commands import main\n")
    assert "suite.commands" in imports(path, "suite.api.x", {"suite.commands", "suite.api.x"})
    assert layer("suite.commands")[1] > layer("suite.api.x")[1]


MAX_MODULE_LINES = 450  # a module past this has become two things (docs/design.md)


def test_no_product_module_passes_the_size_limit():
    product = {name: path for name, path in python_files().items() if name.split(".")[0] == "suite"}
    assert len(product) > 50  # the scan found the package
    big = {name: n for name, path in product.items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"split these modules (at most {MAX_MODULE_LINES} lines): {big}"
