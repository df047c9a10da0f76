"""The layout is the architecture: imports only point down, and nothing in the repository imports in a circle.

Layers, lowest first: `suite.api` (what plugin authors import) -> `suite.run` (one run) -> `suite.stats` (statistical
procedures) -> `suite.grid` (many runs), `suite.report`, `suite.profiling` (side by side, never importing each other)
-> `suite.commands` (the command line). `methods/` and `tasks/` are plugins: they see only `suite` and `suite.api`.
Beside the product stands the lab (lab/: experiments and benchmarks), behind a wall: the product never imports it, and
it imports only the public surfaces and the engine modules declared in `LAB_MAY_IMPORT` (docs/design.md, "The wall").
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"api": 0, "testing": 0, "run": 1, "stats": 2, "grid": 3, "report": 3, "profiling": 3, "commands": 4,
          "__main__": 5}
PLUGIN_FOLDERS = {"methods": "suite.methods", "tasks": "suite.tasks"}
SCANNED = ("suite", "methods", "tasks", "lab", "tests")


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


# The wall (docs/design.md). The lab reaches the product through `suite`, `suite.api.*` and `suite.testing`, and beyond
# them through these engine modules only, each for its reason; no name starting with "_" from any of them.
LAB_PUBLIC = ("suite", "suite.api", "suite.testing")
LAB_MAY_IMPORT = {
    "suite.methods.attendout": "AttendOut, its config and mask samples, and its instrumentation (PolicyUpdate)",
    "suite.methods.attendout.reward": "the look-ahead reward's steps, recomputed offline under masks of the lab's own",
    "suite.methods.attendout.policy": "leave_one_out: the rloo baseline that the planted control's term is scaled for",
    "suite.run.settings": "RunConfig, TrainSettings, presets and model names: a lab run is built as a suite run is",
    "suite.run.models": "a run's model and method (load_model, build_method) and quiet_transformers",
    "suite.run.data": "a task's splits read and tokenised as a run reads them; seeded subsets",
    "suite.run.batching": "a run's batch orders and collation, so the lab's batches are the suite's",
    "suite.run.draws": "which train rows a run draws and carves: the split-leak count and the Trainer comparison",
    "suite.run.carving": "the groups a carve keeps together (the split-leak count)",
    "suite.run.device": "the machine's name, the commit and the environment a lab result records",
    "suite.run.runner": "one whole run (run_one) and the tokenised-data caches the benchmarks time",
    "suite.run.training": "a step's context as the runner builds it (the capture benchmark)",
    "suite.run.capture": "CUDA graph steps and the reason a step runs eagerly (the capture benchmark)",
    "suite.run.record": "a run's per-example predictions (the score endpoint's nulls)",
    "suite.grid.plan": "a grid's jobs, as the throughput benchmarks run them",
    "suite.grid.executors": "run_grid, the executors the throughput benchmarks time",
    "suite.grid.store": "the records of an output folder (Store, iter_records)",
    "suite.grid.power_table": "pilot_outcomes: the published runs as the power table reads them",
    "suite.stats.design_power": "the design simulation's steps (draw_differences, decide_looks): the futility study",
    "suite.stats.sequential": "the sequential design and its alpha spending (futility and score endpoint studies)",
    "suite.stats.evidence": "evidence_arrays: the report's comparison over simulated seeds",
    "suite.stats.examples": "example_variance: the example-level se, by row and by carving group (held-out se)",
    "suite.stats.sign": "the paired sign test and its guard (the score endpoint study)",
    "suite.stats.collapse": "degenerate: the collapse rule the score endpoint's nulls keep",
    "suite.profiling.loop": "FLOPs per token and peak TFLOPS (MFU)",
    # not imported: loaded from their files by lab/stats/stats_nulls.py, which prints the rates these tests assert
    "tests/test_stats_real_null.py": "the null built from the published predictions (the product test's own draws)",
    "tests/test_stats_simulation.py": "the synthetic null population (the product test's own draws)",
}


def lab_module(module: str) -> bool:
    return module == "lab" or module.startswith("lab.")


def wall_breaches(text: str, name: str, known: set[str], tests: set[str]) -> list[str]:
    """What a lab file (`text`, module `name`) does against the wall: an import of a repository module outside the
    public surfaces and LAB_MAY_IMPORT, of a test module, of a private name; a private attribute read off anything
    but `self`, `cls` or a lab module (AttendOut's state, an engine module's helpers)."""
    tree, found, lab_aliases = ast.parse(text), [], set()
    package = name.rpartition(".")[0] if not name.endswith(".__init__") else name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None, alias.asname or alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            pairs = [(base, alias.name, alias.asname or alias.name) for alias in node.names]
        else:
            continue
        for module, imported, bound in pairs:
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in known else module
            if lab_module(module):
                if imported is None or f"{module}.{imported}" in known:  # a lab module, not a name read from one
                    lab_aliases.add(bound)
            elif module.split(".")[0] in tests:
                found.append(f"imports {module} from tests/")
            elif module.split(".")[0] == "suite" and not (
                    target in LAB_MAY_IMPORT or any(target == p or target.startswith(p + ".") and p != "suite"
                                                    for p in LAB_PUBLIC)):
                found.append(f"imports {target}, neither public nor in LAB_MAY_IMPORT")
            if module.split(".")[0] == "suite" and imported and imported.startswith("_"):
                found.append(f"imports the private {module}.{imported}")
    return found + [breach for node in ast.walk(tree) for breach in private_read(node, lab_aliases) + by_name(node)]


def private_read(node: ast.AST, lab_aliases: set[str]) -> list[str]:
    """A private attribute read off anything but `self`, `cls` or a lab module."""
    if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls", *lab_aliases})):
        return [f"reads the private attribute .{node.attr} (line {node.lineno})"]
    return []


def by_name(node: ast.AST) -> list[str]:
    """A private attribute reached by a string (getattr and its kin), or a suite module imported by one
    (importlib.import_module, __import__) outside the public surfaces and LAB_MAY_IMPORT."""
    if not (isinstance(node, ast.Call) and node.args):
        return []
    called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    argument = node.args[1] if called in {"getattr", "setattr", "hasattr", "delattr"} and len(node.args) > 1 \
        else node.args[0]
    text = argument.value if isinstance(argument, ast.Constant) else None
    if not isinstance(text, str):
        return []
    if called in {"getattr", "setattr", "hasattr", "delattr"} and text.startswith("_") and not text.startswith("__"):
        return [f"reaches the private attribute {text} by name (line {node.lineno})"]
    if called in {"import_module", "__import__"} and text.split(".")[0] == "suite" and not (
            text in LAB_MAY_IMPORT or any(text == p or text.startswith(p + ".") and p != "suite" for p in LAB_PUBLIC)):
        return [f"imports {text} by name, neither public nor in LAB_MAY_IMPORT (line {node.lineno})"]
    return []


def lab_imports(path: Path, name: str, known: set[str]) -> list[str]:
    """The lab's modules that a product file imports (at any depth of the file)."""
    return sorted(target for target in imports(path, name, known) if lab_module(target))


def test_the_product_never_imports_the_lab():
    files = python_files()
    assert any(lab_module(name) for name in files)  # the scan found the lab
    wrong = {name: found for name, path in files.items() if path.relative_to(ROOT).parts[0] in PRODUCT_FOLDERS
             and (found := lab_imports(path, name, set(files)))}
    assert not wrong, f"the product imports the lab (move what both need into the product): {wrong}"


def test_the_lab_uses_public_surfaces_and_declared_engine_modules_only():
    files = python_files()
    known, tests = set(files), {p.stem for p in (ROOT / "tests").glob("*.py")}
    lab = {name: path for name, path in files.items() if lab_module(name)}
    assert len(lab) > 30  # the scan found the lab
    found = {name: b for name, path in lab.items() if (b := wall_breaches(path.read_text(), name, known, tests))}
    assert not found, ("the lab reaches past the wall (use suite.api or suite.testing, a public instrument, or "
                       "declare the engine module in LAB_MAY_IMPORT with its reason):\n"
                       + "\n".join(f"{n}: {'; '.join(b)}" for n, b in found.items()))
    loaded = (ROOT / "lab" / "stats" / "stats_nulls.py").read_text()
    used = {m for name, path in lab.items() for m in imports(path, name, known)}
    used |= {t for t in LAB_MAY_IMPORT if t.startswith("tests/") and f'"{Path(t).stem}"' in loaded}
    assert set(LAB_MAY_IMPORT) <= used, f"declared but not used by the lab (drop them): {set(LAB_MAY_IMPORT) - used}"


def test_the_wall_checks_see_each_breach(tmp_path):
    """The checks above must be able to fail: each kind of breach in a scratch lab file is found, the uses the wall
    allows are not, and a product file importing the lab (lazily too) is found."""
    known = {"suite", "suite.api.attention", "suite.run.settings", "suite.grid.summary", "suite.methods.attendout",
             "suite.methods.attendout.method", "lab.attendout.report", "lab.attendout.planted", "lab.speed.mfu"}
    allowed = ("import suite\nfrom suite.api.attention import StepContext\nfrom suite.run.settings import RunConfig\n"
               "from suite.methods.attendout import AttendOut\nfrom . import report\nreport._lines()\n"
               "class A:\n    def f(self):\n        return self._x, __file__\n")
    assert wall_breaches(allowed, "lab.attendout.x", known, {"conftest"}) == []
    for source, breach in (("from suite.grid.summary import leaderboard\n", "neither public nor"),
                           ("from suite.methods.attendout import method\n", "neither public nor"),
                           ("from suite.run.settings import _hash\n", "private suite.run.settings._hash"),
                           ("from conftest import tiny_model\n", "from tests/"),
                           ("def f(method):\n    return method._masks\n", "private attribute ._masks"),
                           ("from suite.methods.attendout import reward as rw\nrw._helper()\n", "._helper"),
                           ("def f(m):\n    return getattr(m, '_masks')\n", "private attribute _masks by name"),
                           ("import importlib\nimportlib.import_module('suite.grid.summary')\n", "by name, neither"),
                           ("from .report import method\nmethod._stats\n", "private attribute ._stats")):
        found = wall_breaches(source, "lab.attendout.x", known, {"conftest"})
        assert any(breach in b for b in found), (source, found)
    product = tmp_path / "x.py"
    product.write_text("import torch\n\ndef f():\n    from lab.attendout import planted\n    import lab.speed.mfu\n")
    assert lab_imports(product, "suite.run.x", known) == ["lab.attendout.planted", "lab.speed.mfu"]
