"""A copy of the suite installed without a checkout names the commit it was built from, marked `+installed`
(suite.run.install_stamp): records made from it keep their code version."""
import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from suite.run.device import git_commit
from suite.run.install_stamp import installed_commit, stamped, write_stamp

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _commit_all(repo: Path) -> str:
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "code")
    return _git(repo, "rev-parse", "HEAD")


def _read_stamp(path: Path) -> str:
    spec = importlib.util.spec_from_file_location("stamp_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.COMMIT


def test_the_mark_goes_before_dirty_where_the_report_looks_for_it():
    assert stamped("abc") == "abc+installed"
    assert stamped("abc+dirty") == "abc+installed+dirty"
    assert stamped("abc+shallow+dirty") == "abc+shallow+installed+dirty"


def test_git_commit_names_the_stamp_of_an_installed_copy_and_git_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "suite.run._version_stamp", None)  # a checkout: no stamp (ImportError)
    assert installed_commit() is None
    monkeypatch.setitem(sys.modules, "suite.run._version_stamp", types.SimpleNamespace(COMMIT="abc+installed"))
    assert installed_commit() == "abc+installed" and git_commit() == "abc+installed"
    assert git_commit(tmp_path) is None  # a tree asked about by name is asked of git, whatever this copy is


def test_the_build_step_stamps_the_checkouts_commit_and_keeps_an_sdists_stamp(tmp_path):
    repo, package = tmp_path / "repo", tmp_path / "built" / "suite"
    (repo / "suite").mkdir(parents=True)
    package.mkdir(parents=True)
    (repo / "suite" / "a.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    sha = _commit_all(repo)
    assert write_stamp(package, git_commit(repo)) == f"{sha}+installed"
    assert _read_stamp(package / "_version_stamp.py") == f"{sha}+installed"
    (repo / "suite" / "a.py").write_text("x = 2\n")
    assert write_stamp(package, git_commit(repo)) == f"{sha}+installed+dirty"
    # an unpacked sdist is no checkout: nothing is written, and the stamp it carries is kept
    assert write_stamp(package, git_commit(tmp_path / "unpacked-sdist")) is None
    assert _read_stamp(package / "_version_stamp.py") == f"{sha}+installed+dirty"


def test_the_build_step_imports_nothing_beyond_the_standard_library():
    """The build imports git_commit and the stamp writer from the source tree, in an isolated environment that holds
    setuptools alone (python -S: no site-packages at all)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from suite.run.device import git_commit; "
            "from suite.run.install_stamp import write_stamp; print(git_commit(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_pip_install_of_a_checkout_gives_a_copy_that_names_its_commit(tmp_path):
    """The real build (setup.py's build step, run by pip) on a fresh checkout of the project's files, installed into
    a folder of its own; the interpreter then imports that copy, which has no checkout."""
    setuptools = pytest.importorskip("setuptools")  # built without isolation: from what this interpreter has
    version = tuple(int(part) for part in setuptools.__version__.split(".")[:2])
    if version < (68, 0) or (version < (70, 1) and importlib.util.find_spec("wheel") is None):
        pytest.skip(f"setuptools {setuptools.__version__}: the build needs 68 or newer, and wheel before 70.1")
    repo, target = tmp_path / "checkout", tmp_path / "installed"
    repo.mkdir()
    for name in ("suite", "methods", "tasks"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "_version_stamp.py"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    _git(repo, "init", "-q")
    sha = _commit_all(repo)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target), str(repo)],
                   check=True, capture_output=True, text=True, timeout=240)
    assert not (repo / "suite" / "run" / "_version_stamp.py").exists()  # the checkout itself stays unstamped
    code = "import suite.run.device as d; print(d.__file__); print(d.git_commit())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert done.returncode == 0, done.stderr[-2000:]
    where, version = done.stdout.split()
    assert Path(where).is_relative_to(target) and version == f"{sha}+installed"
