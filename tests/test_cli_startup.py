"""A fast command line: `--help`, `--version` and `run --help` import neither torch nor transformers (each command
module is imported only when its command runs), nor do `list` and dry runs once the methods' catalog is written;
method names are case- and dash-insensitive like task names; a misspelt setting gets a "did you mean"."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite.commands import COMMANDS, build_parser, main

LIGHT = [["--version"], ["--help"], ["run", "--help"]]


def assert_imports_none_of(argv: list[str], modules: tuple[str, ...]) -> None:
    """Run the command line in a fresh interpreter: it prints something and leaves `modules` unimported."""
    code = ("import sys\nfrom suite.commands import main\n"
            f"try:\n    rc = main({argv!r})\nexcept SystemExit as exc:\n    rc = exc.code\n"
            "assert rc in (0, None), rc\n"
            f"heavy = sorted(m for m in {modules!r} if m in sys.modules)\n"
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()  # it did print the help, the version, the list or the plan


@pytest.mark.parametrize("argv", LIGHT, ids=" ".join)
def test_light_commands_do_not_import_torch(argv):
    assert_imports_none_of(argv, ("torch", "transformers", "sklearn", "scipy"))


def test_the_light_and_the_whole_parser_list_every_command_alike():
    def helps(parser):
        sub = next(a for a in parser._actions if a.dest == "command")
        return {choice.dest: choice.help for choice in sub._choices_actions}

    assert helps(build_parser([])) == helps(build_parser()) and set(helps(build_parser())) == set(COMMANDS)


def test_method_names_are_case_and_dash_insensitive(tmp_path, capsys):
    common = ["--tasks", "rte", "--seeds", "1", "--out", str(tmp_path), "--dry-run"]
    assert main(["run", "--methods", "scores_dropout", *common, "--set", "scores_dropout.p=0.2"]) == 0
    plain = capsys.readouterr().out
    assert main(["run", "--methods", "Scores-Dropout", *common, "--set", "scores-dropout.p=0.2"]) == 0
    assert capsys.readouterr().out == plain and "rte__scores_dropout__seed1" in plain


@pytest.mark.parametrize("assignment, hint", [("train.lrr=1e-5", "Did you mean train.lr?"),
                                              ("scores_dropout.pp=0.2", "Did you mean scores_dropout.p?")])
def test_a_misspelt_setting_gets_a_suggestion(assignment, hint, tmp_path, capsys):
    argv = ["run", "--methods", "scores_dropout", "--tasks", "rte", "--out", str(tmp_path), "--dry-run"]
    assert main([*argv, "--set", assignment]) == 2
    assert hint in capsys.readouterr().err


def test_a_wildcard_keeps_the_separators_it_spells_out():
    from suite.api.attention import METHODS

    variants = ["scores_dropout_dynamic", "scores_dropout_layerwise", "scores_dropout_naive"]
    assert METHODS.select("scores_dropout_*") == METHODS.select("Scores-Dropout-*") == variants
    assert METHODS.select("scores*") == ["scores_dropout", *variants]


@pytest.mark.parametrize("argv", [["list"], ["run", "--methods", "vanilla,scores_dropout", "--tasks", "rte,stsb",
                                            "--dry-run"]], ids=" ".join)
def test_list_and_dry_runs_import_neither_transformers_nor_sklearn(argv, tmp_path):
    """Not even when they import the methods (and torch) to write their catalog: they never need the seconds
    transformers, scikit-learn and scipy cost (a method registers with transformers when attached, a metric imports
    its library when computed)."""
    import importlib.metadata

    outside = [ep.name for group in ("suite.methods", "suite.tasks")
               for ep in importlib.metadata.entry_points(group=group)]
    if outside:  # a plugin module may import what it likes (the documented task plugin imports scikit-learn)
        pytest.skip(f"outside plugins installed ({', '.join(outside)}): their imports are their own, not the suite's")
    argv = argv + (["--out", str(tmp_path)] if "run" in argv else [])
    assert_imports_none_of(argv, ("transformers", "sklearn", "scipy"))


ROOT = Path(__file__).resolve().parents[1]


def run_fresh(argv: list[str], cache: str | Path, **env: str) -> tuple[str, bool]:
    """(what the command printed, whether it imported torch), run in a fresh interpreter from the repository's root
    with SUITE_CACHE_DIR=`cache`."""
    code = ("import sys\nfrom suite.commands import main\n"
            f"assert main({argv!r}) == 0\n"
            "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **env, "SUITE_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, "torch imported: True" in done.stderr


def without_torch(argv: list[str], cache: str | Path, **env: str) -> str:
    """What the command prints once it runs without torch. The first run in an empty cache imports the methods and
    writes their catalog; a run while a file of the code is being edited (changed within seconds) imports them again
    without writing one, so a few runs are allowed."""
    for _ in range(4):
        out, imported = run_fresh(argv, cache, **env)
        if not imported:
            return out
    raise AssertionError(f"{argv}: every run imported torch")


@pytest.mark.parametrize("argv", [["list"], ["run", "--methods", "all", "--tasks", "glue", "--dry-run"],
                                  ["run", "--methods", "vanilla", "--tasks", "sst2", "--dry-run", "--data-dir"]],
                         ids=["list", "all-glue", "sst2-data-dir"])
def test_list_and_dry_runs_import_no_torch_and_print_what_the_classes_say(argv, tmp_path, glue_dir):
    """`list` and dry runs read the methods' facts from their catalog (suite.api.method_facts) and whether the CPU
    computes bf16 (which decides what precision=auto hashes as) from what torch said before; what they print, the
    record names (hashes) included, is what the method classes and torch give (SUITE_CACHE_DIR=off)."""
    if "run" in argv:
        argv = argv + ([glue_dir] if argv[-1] == "--data-dir" else []) + ["--out", str(tmp_path / "out")]
    reference, imported = run_fresh(argv, "off")
    assert imported  # without a catalog: the classes, which import torch
    assert without_torch(argv, tmp_path / "cache") == reference


# an editable install: a finder after PathFinder maps the package to its checkout, so a folder named `suite` without
# an __init__.py in the current directory is imported as a namespace package before it (what `pip install -e` does)
EDITABLE_FINDER = """
import importlib.util, sys
from importlib.machinery import PathFinder
MAPPING = {mapping!r}
class Finder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in MAPPING:
            return importlib.util.spec_from_file_location(fullname, MAPPING[fullname] + "/__init__.py",
                                                          submodule_search_locations=[MAPPING[fullname]])
        parent = fullname.rpartition(".")[0]
        return PathFinder.find_spec(fullname, path=[MAPPING[parent]]) if parent in MAPPING else None
sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, Finder)
"""


def test_a_folder_named_suite_that_hides_the_package_gets_one_line_and_exit_2(tmp_path):
    """From the parent of a clone named `suite`, `python -m suite` found the clone's folder first (a namespace
    package) and crashed with "'NoneType' object has no attribute 'splitlines'"; it names the folder and the fix."""
    import suite
    import suite.methods

    mapping = {"suite": str(Path(suite.__file__).parent), "suite.methods": str(Path(suite.methods.__file__).parent)}
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE_FINDER.format(mapping=mapping))
    (tmp_path / "suite" / "methods").mkdir(parents=True)  # the clone: a folder named suite, no __init__.py
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-m", "suite", "list"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)
    assert done.returncode == 2 and not done.stdout, done.stderr[-2000:]
    line, = done.stderr.splitlines()
    assert f"the folder {tmp_path / 'suite'} is not the suite package" in line and "run from another folder" in line
    # from any other folder the same installation runs
    other = subprocess.run([sys.executable, "-m", "suite", "--version"], capture_output=True, text=True, timeout=60,
                           cwd=site, env=env)
    assert other.returncode == 0 and other.stdout.strip(), other.stderr[-2000:]
