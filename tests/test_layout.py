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
                                                                             "__pycache__")
               and not p.is_symlink()}  # a worktree's git-ignored links to methods/ and tasks/
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


PRODUCT_FOLDERS = ("suite", "methods", "tasks")


def _names_used(text: str) -> set[str]:
    """The identifiers a file's code names, and the last part of each one-word string literal ("pkg.mod.name"
    names `name`: lazy re-exports, monkeypatch targets); comments and docstrings mention without using."""
    import io
    import tokenize

    found = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME:
            found.add(token.string)
        elif token.type == tokenize.STRING and not any(c.isspace() for c in token.string):
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):  # an f-string or bytes
                continue
            if isinstance(value, str):
                found.add(value.rpartition(".")[2])
    return found


def _exported(text: str) -> list[str]:
    """A module's literal `__all__` (none: [])."""
    if "__all__" not in text:
        return []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:  # computed (suite/__init__.py: the plugin API, listed as strings)
                return []
    return []


def unused_exports(files: list[Path], product: set[Path]) -> list[str]:
    """`path: name` for each name in a product module's `__all__` that no other scanned file uses. A package's
    `__init__` re-exporting a name does not use it (its own `__all__` is checked against files outside the package);
    names listed as strings in suite/__init__.py (the plugin API) are used."""
    import functools

    texts = {path: path.read_text() for path in files}
    used = functools.cache(lambda path: _names_used(texts[path]))  # a file is tokenized once, when first needed
    exported = {path: _exported(texts[path]) for path in product}
    unused = []
    for path, names in exported.items():
        if path.name == "__init__.py":  # a package's interface: used from outside the package
            others, packages = [p for p in files if path.parent not in p.parents], []
        else:
            others = [p for p in files if p != path]
            packages = [p for p, n in exported.items() if p.name == "__init__.py" and p.parent in path.parents]
        for name in names:
            reexports = {p for p in packages if name in exported[p]}
            if not any(name in texts[p] and p not in reexports and name in used(p) for p in others):
                unused.append(f"{path.relative_to(ROOT)}: {name}")
    return sorted(unused)


def test_every_exported_name_is_used_outside_its_module():
    files = list(python_files().values())
    product = {p for p in files if p.relative_to(ROOT).parts[0] in PRODUCT_FOLDERS}
    assert len(product) > 50  # the scan found the package
    unused = unused_exports(files, product)
    assert not unused, ("names in __all__ that nothing outside their module uses (drop them from __all__, or the "
                        "code if nothing uses it):\n" + "\n".join(unused))


def test_the_export_check_sees_an_unused_name(tmp_path, monkeypatch):
    """The check above must be able to fail: a scratch package exporting a name nobody uses is reported, one whose
    name another module imports is not, and a comment naming it is no use."""
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    package = tmp_path / "suite" / "x"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text('__all__ = ["used", "idle"]\nused = idle = 1\n')
    (tmp_path / "suite" / "b.py").write_text("from suite.x.a import used  # idle is mentioned here only\n")
    files = sorted(tmp_path.rglob("*.py"))
    assert unused_exports(files, set(files)) == ["suite/x/a.py: idle"]
