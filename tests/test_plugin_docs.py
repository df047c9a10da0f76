"""The plugin examples of the docs work as outside packages: the method of docs/adding-a-method.md and the task of
docs/adding-a-task.md are built from the pages' `file=PATH` blocks, installed the way the suite finds plugins (a
distribution on sys.path whose entry points come from the page's own pyproject.toml), then listed, checked, trained
and asked for test predictions. The integration test builds real wheels from the same files with pip."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import suite
from suite.api.metrics import METRICS
from suite.api.tasks import TASKS
from suite.commands import main

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

DOCS = Path(__file__).resolve().parents[1] / "docs"
METHOD_PAGE, TASK_PAGE = DOCS / "adding-a-method.md", DOCS / "adding-a-task.md"
FILE_BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def example_files(page: Path) -> dict[str, str]:
    """The example package a page shows: {path: text} of its code blocks marked `file=PATH`."""
    return {path: text for path, text in FILE_BLOCK.findall(page.read_text(encoding="utf-8"))}


def write_package(page: Path, folder: Path) -> dict:
    """The page's files under `folder`; returns its pyproject's [project] table."""
    for path, text in example_files(page).items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


def install_on_path(page: Path, folder: Path) -> str:
    """The package importable from `folder` with a dist-info that declares the pyproject's entry points, as an
    installed distribution does; returns the distribution's name."""
    project = write_package(page, folder)
    info = folder / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
        for group, points in project["entry-points"].items()))
    return project["name"]


@pytest.fixture
def doc_plugins(tmp_path, monkeypatch):
    """Both examples installed; the registries load them through their entry points, as `python -m suite` does."""
    for page, name in ((METHOD_PAGE, "method"), (TASK_PAGE, "task")):
        (tmp_path / name).mkdir()
        install_on_path(page, tmp_path / name)
        monkeypatch.syspath_prepend(str(tmp_path / name))
    suite.METHODS.load(reload_plugins=True)
    TASKS.load(reload_plugins=True)
    assert not {**suite.METHODS.plugin_errors, **TASKS.plugin_errors}
    yield
    suite.METHODS.remove("tempered_softmax")  # other tests select `all`
    TASKS.remove("mood")
    METRICS.remove("macro_f1")
    for module in ("my_method", "mood_task"):
        sys.modules.pop(module, None)


def test_the_pages_show_complete_packages():
    assert set(example_files(METHOD_PAGE)) == {"my_method.py", "pyproject.toml"}
    assert set(example_files(TASK_PAGE)) == {"pyproject.toml", "mood_task/__init__.py", "mood_task/data/train.tsv",
                                             "mood_task/data/dev.tsv", "mood_task/data/test.tsv"}
    assert "\t" in example_files(TASK_PAGE)["mood_task/data/test.tsv"]  # real tabs survive in the page


def test_list_shows_the_documented_method_and_task(doc_plugins, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "tempered_softmax" in out and "Softmax attention at a temperature" in out
    assert re.search(r"^mood\s.*macro_f1", out, re.MULTILINE), out


def test_the_documented_method_passes_the_check(doc_plugins, capsys):
    assert main(["check", "tempered_softmax", "--set", "tempered_softmax.temperature=2"]) == 0
    out = capsys.readouterr().out
    assert "tempered_softmax {'temperature': 2" in out and "1 of 1 methods passed" in out


def test_the_documented_task_trains_and_predicts_its_test_set(doc_plugins, tiny_bert_dir, tmp_path):
    out = tmp_path / "results"
    assert main(["run", "--methods", "tempered_softmax", "--tasks", "mood", "--seeds", "1", "--model", tiny_bert_dir,
                 "--epochs", "1", "--batch-size", "4", "--max-length", "32", "--predict-test", "--out", str(out),
                 "--quiet"]) == 0
    (path,) = (out / "runs").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and set(record["final"]) >= {"macro_f1", "accuracy", "score"}
    assert record["provenance"]["method"] == {"distribution": "tempered-softmax", "version": "0.1.0"}
    assert record["provenance"]["task"] == {"distribution": "mood-task", "version": "0.1.0"}
    lines = (path.parent / record["artifacts"]["test_predictions"]["Mood"]).read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert [line.split("\t")[0] for line in lines[1:]] == ["0", "1", "2", "3"]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"sad", "happy"}


@pytest.mark.integration
def test_the_documented_packages_build_and_install_with_pip(tmp_path):
    """pip builds a wheel from each page's pyproject.toml (the task's data ships inside it); installed by unpacking,
    the command line finds both through their entry points."""
    site = tmp_path / "site"
    for page, name in ((METHOD_PAGE, "method"), (TASK_PAGE, "task")):
        (tmp_path / name).mkdir()
        write_package(page, tmp_path / name)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path / "wheels"), str(tmp_path / name)], check=True, timeout=300)
    for wheel in (tmp_path / "wheels").glob("*.whl"):
        zipfile.ZipFile(wheel).extractall(site)
    assert (site / "mood_task" / "data" / "test.tsv").is_file()
    proc = subprocess.run([sys.executable, "-m", "suite", "list"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tempered_softmax" in proc.stdout and re.search(r"^mood\s", proc.stdout, re.MULTILINE)
