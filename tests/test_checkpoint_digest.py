"""Saved models are held against the digests their run wrote: `predict` and `run --predict-test` on finished runs
refuse a checkpoint whose files were replaced (another run's weights, a whole folder swapped), naming the files, and
load one saved before digests existed with a warning that it is unverified."""
import json
import random
import shutil
from pathlib import Path

import pytest

from suite.commands import main
from suite.run.test_predictions import CHECKPOINT_INFO, checkpoint_files, files_digest
from suite.testing import WORDS


@pytest.fixture(scope="module")
def data(glue_dir, tmp_path_factory) -> str:
    """The generated GLUE folder plus an unlabeled RTE test file, so that a checkpoint let through predicts."""
    root = tmp_path_factory.mktemp("glue-rte-test")
    shutil.copytree(glue_dir, root, dirs_exist_ok=True)
    rng = random.Random(0)
    rows = ["index\tsentence1\tsentence2"] + [f"{i}\t{' '.join(rng.choices(WORDS, k=5))}\t"
                                              f"{' '.join(rng.choices(WORDS, k=4))}" for i in range(5)]
    (root / "RTE" / "test.tsv").write_text("\n".join(rows) + "\n")
    return str(root)


@pytest.fixture(scope="module")
def two_saved_runs(tiny_bert_dir, data, tmp_path_factory) -> dict[int, Path]:
    """Two RTE runs (seeds 1 and 2) that kept their models: seed -> record."""
    out = tmp_path_factory.mktemp("saved")
    assert main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1,2", "--model", tiny_bert_dir,
                 "--data-dir", data, "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length",
                 "64", "--quiet", "--save-model", "--precision", "fp32"]) == 0  # fp32 stated: see conftest.py
    return {json.loads(p.read_text())["config"]["seed"]: p for p in (out / "runs").glob("*.json")}


@pytest.fixture
def runs(two_saved_runs, tmp_path) -> dict[int, Path]:
    """A copy of the two runs' records and models that a test may damage."""
    for path in two_saved_runs.values():
        shutil.copy(path, tmp_path / path.name)
        shutil.copytree(path.with_suffix(".model"), tmp_path / path.with_suffix(".model").name)
    return {seed: tmp_path / path.name for seed, path in two_saved_runs.items()}


def _predict(target: Path, data: str, out: Path) -> int:
    return main(["predict", str(target), "--data-dir", data, "--out", str(out)])


def test_the_record_keeps_the_digest_of_the_files_its_run_saved(runs):
    for record in runs.values():
        folder = record.with_suffix(".model")
        files = checkpoint_files(folder)
        assert "model.safetensors" in files and CHECKPOINT_INFO not in files
        assert json.loads((folder / CHECKPOINT_INFO).read_text())["files"] == files
        assert json.loads(record.read_text())["artifacts"]["model_sha256"] == files_digest(files)


@pytest.mark.parametrize("given", ["record", "folder"])
def test_another_runs_weights_are_refused_naming_the_file(runs, data, tmp_path, capsys, given):
    folder = runs[1].with_suffix(".model")
    shutil.copy(runs[2].with_suffix(".model") / "model.safetensors", folder / "model.safetensors")
    capsys.readouterr()
    assert _predict(runs[1] if given == "record" else folder, data, tmp_path / "sub") == 2
    err = capsys.readouterr().err
    assert str(folder) in err and "model.safetensors" in err and "Traceback" not in err
    assert not (tmp_path / "sub" / "RTE.tsv").exists()


def test_a_whole_folder_swapped_under_a_record_is_refused(runs, data, tmp_path, capsys):
    """The folder is self-consistent (another run's files and description): only the record's digest tells."""
    folder = runs[1].with_suffix(".model")
    shutil.rmtree(folder)
    shutil.copytree(runs[2].with_suffix(".model"), folder)
    capsys.readouterr()
    assert _predict(runs[1], data, tmp_path / "sub") == 2
    assert "not the ones its record's run saved" in capsys.readouterr().err
    assert _predict(folder, data, tmp_path / "sub") == 2  # given directly: held against the record beside it


def test_an_unchanged_checkpoint_predicts_and_one_saved_before_digests_is_unverified(runs, data, tmp_path):
    assert _predict(runs[1], data, tmp_path / "a") == 0
    assert (tmp_path / "a" / "RTE.tsv").is_file()
    alone = tmp_path / "old" / "elsewhere.model"  # no record beside it, and a description without digests
    shutil.copytree(runs[1].with_suffix(".model"), alone)
    info = json.loads((alone / CHECKPOINT_INFO).read_text())
    del info["files"]
    (alone / CHECKPOINT_INFO).write_text(json.dumps(info))
    with pytest.warns(UserWarning, match="unverified"):
        assert _predict(alone, data, tmp_path / "b") == 0


def test_predictions_for_a_finished_run_are_refused_from_replaced_weights(runs, data, tiny_bert_dir, tmp_path,
                                                                          capsys):
    """`run --predict-test` on a finished run loads its saved model: replaced weights give no predictions, with why."""
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    for path in (runs[1], runs[1].with_suffix(".model")):
        (shutil.copytree if path.is_dir() else shutil.copy)(path, out / "runs" / path.name)
    shutil.copy(runs[2].with_suffix(".model") / "model.safetensors", out / "runs" / runs[1].with_suffix(".model").name
                / "model.safetensors")
    capsys.readouterr()
    main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--model", tiny_bert_dir,
          "--data-dir", data, "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "64",
          "--quiet", "--predict-test", "--precision", "fp32"])
    said = capsys.readouterr()
    assert "no test predictions" in said.out + said.err and "model.safetensors" in said.out + said.err
    assert "test_predictions" not in json.loads((out / "runs" / runs[1].name).read_text())["artifacts"]
