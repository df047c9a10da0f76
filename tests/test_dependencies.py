"""A missing or broken dependency stops `run` once, before any run, with exit 2 naming the package (on a GPU machine
without `datasets` every pool worker died at its start and each job was retried on a fresh worker)."""
from __future__ import annotations

import importlib
from importlib import metadata

import pytest

from suite.api.errors import BadInput
from suite.grid import preflight


def test_an_installed_suite_passes():
    preflight.check_dependencies()


def test_a_missing_requirement_is_named_with_the_fix(monkeypatch):
    real = metadata.requires
    monkeypatch.setattr(metadata, "requires", lambda dist: real(dist) + ["nosuchpackage-xyz>=1.0",
                                                                         "ray; extra == 'ray'"])
    with pytest.raises(BadInput, match=r"needs nosuchpackage-xyz>=1.0, which is not installed: pip install"):
        preflight.check_dependencies()


def test_a_package_that_fails_to_import_is_named(monkeypatch):
    real = importlib.import_module

    def broken(name, *args):
        if name == "suite.run.runner":
            raise ModuleNotFoundError("No module named 'datasets'", name="datasets")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(BadInput, match=r"the package .datasets. that the suite imports is missing or broken"):
        preflight.check_dependencies()


def test_run_exits_2_before_training(monkeypatch, tmp_path, capsys):
    from suite.commands import main

    real = metadata.requires
    monkeypatch.setattr(metadata, "requires", lambda dist: real(dist) + ["nosuchpackage-xyz"])
    code = main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--out", str(tmp_path / "o"),
                 "--data-dir", str(tmp_path / "nodata")])
    assert code == 2
    assert "nosuchpackage-xyz" in capsys.readouterr().err
    assert not (tmp_path / "o" / "runs").exists() or not any((tmp_path / "o" / "runs").iterdir())
