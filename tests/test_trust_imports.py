"""A broken package is named before it can do harm (issue 67): the error boundary holds the parser and the command's
imports (Ctrl-C there, a package whose import raises or calls sys.exit()), and the dependency check imports what a
run and a report import, treating sys.exit() in a package's import as a failure."""
from __future__ import annotations

import importlib
import sys

import pytest

from suite.api.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, BrokenDependency, import_checked
from suite.commands import main
from suite.grid import preflight

BROKEN = {"exits": "import sys\nsys.exit(0)\n", "raises": "raise RuntimeError('a broken build')\n",
          "lacks": "import nosuchmodule_of_a_dependency\n"}


@pytest.fixture
def broken(tmp_path, monkeypatch):
    """Packages `brokendep_exits`, `brokendep_raises`, `brokendep_lacks` whose import fails as their name says."""
    for kind, code in BROKEN.items():
        (tmp_path / f"brokendep_{kind}").mkdir()
        (tmp_path / f"brokendep_{kind}" / "__init__.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for kind in BROKEN:
        sys.modules.pop(f"brokendep_{kind}", None)


@pytest.mark.parametrize("kind, says", [("exits", "importing it called sys.exit(0)"),
                                        ("raises", "importing it raised RuntimeError: a broken build"),
                                        ("lacks", "No module named 'nosuchmodule_of_a_dependency'")])
def test_a_package_whose_import_fails_is_named_with_the_fix(kind, says, broken):
    with pytest.raises(BrokenDependency, match="pip install --force-reinstall") as found:
        import_checked(f"brokendep_{kind}")
    assert says in str(found.value)
    assert f"'brokendep_{kind}'" in str(found.value) or "'nosuchmodule_of_a_dependency'" in str(found.value)


def test_a_fault_in_the_suites_own_module_is_not_blamed_on_a_package(tmp_path, monkeypatch):
    (tmp_path / "suite_fake_fault.py").write_text("x = {}['a']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("suite.api.errors._culprit", lambda exc: None)   # as for a frame of suite's own code
    with pytest.raises(KeyError):
        import_checked("suite_fake_fault")


@pytest.mark.parametrize("kind", list(BROKEN))
def test_the_dependency_check_imports_each_required_package(kind, broken, monkeypatch):
    """A broken entmax was "a fault of the suite" (exit 1); one calling sys.exit(0) ended `run` with exit 0 and no
    record; a broken pandas passed the check."""
    real = preflight.import_name
    monkeypatch.setattr(preflight, "import_name", lambda name: f"brokendep_{kind}" if name == "entmax" else real(name))
    with pytest.raises(BrokenDependency, match="the package 'entmax' that the suite imports is missing or broken"):
        preflight.check_dependencies()


def test_run_exits_2_with_one_line_for_a_package_that_calls_sys_exit(broken, monkeypatch, tmp_path, capsys):
    real = preflight.import_name
    monkeypatch.setattr(preflight, "import_name", lambda name: "brokendep_exits" if name == "pandas" else real(name))
    code = main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--out", str(tmp_path / "o"),
                 "--data-dir", str(tmp_path / "nodata")])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and "the package 'pandas'" in err and "sys.exit(0)" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o" / "runs").exists()


def _importing_fails_with(monkeypatch, module: str, failure):
    real = importlib.import_module

    def import_module(name, *args):
        if name == module:
            return failure()
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)


def test_ctrl_c_while_the_command_is_imported_is_one_line(monkeypatch, capsys, tmp_path):
    def interrupted():
        raise KeyboardInterrupt

    _importing_fails_with(monkeypatch, "suite.commands.report", interrupted)
    assert main(["report", str(tmp_path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "interrupted: nothing was left half-written"


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_package_the_command_imports_is_one_line_with_exit_2(kind, broken, monkeypatch, capsys, tmp_path):
    """A broken tabulate or scipy under `report` printed a raw traceback."""
    _importing_fails_with(monkeypatch, "suite.commands.report", lambda: importlib.import_module(f"brokendep_{kind}"))
    assert main(["report", str(tmp_path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "that the suite imports is missing or broken" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_package_imported_late_is_named_too(monkeypatch, capsys, tmp_path):
    def late(args):
        raise ModuleNotFoundError("No module named 'scipy'", name="scipy")

    monkeypatch.setattr(importlib.import_module("suite.commands.report"), "main", late)
    assert main(["report", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "the package 'scipy' that the suite imports is missing or broken" in capsys.readouterr().err


def test_usage_errors_and_help_still_exit_as_argparse_says(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["report", "--alpha", "2", "x"])
    assert stop.value.code == 2 and "--alpha" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0


def test_sigterm_outside_training_is_one_line_and_exit_143(monkeypatch, capsys, tmp_path):
    """A report stopped by SIGTERM printed nothing."""
    import os
    import signal

    from suite.api.errors import EXIT_TERMINATED

    def stopped(args):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(importlib.import_module("suite.commands.report"), "main", stopped)
    assert main(["report", str(tmp_path)]) == EXIT_TERMINATED
    assert capsys.readouterr().err.strip() == "terminated: nothing was left half-written"
    assert signal.getsignal(signal.SIGTERM) is before   # the command's handler is gone with it


def test_a_sys_exit_wrapped_by_another_package_still_names_the_package_imported(broken, tmp_path, monkeypatch):
    """wandb.init replaces sys.exit with its own hook, so the SystemExit is raised in wandb's frame: the package
    named is still the one whose import called it (this failed under xdist after a tracking test had run)."""
    (tmp_path / "exit_wrapper.py").write_text("import sys\nreal = sys.exit\ndef hooked(code=None):\n    real(code)\n")
    import exit_wrapper

    monkeypatch.setattr(sys, "exit", exit_wrapper.hooked)
    with pytest.raises(BrokenDependency, match="called sys.exit") as found:
        import_checked("brokendep_exits")
    assert "'brokendep_exits'" in str(found.value) and "exit_wrapper" not in str(found.value)
