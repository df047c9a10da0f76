"""`run --predict-test` on runs that already have records: predictions come from each run's saved model without
retraining, the record gains them and keeps everything else; a run that kept no model is named with the way to get
them."""
import json
import random
import shutil
from pathlib import Path

import pytest

from suite.commands import main
from suite.testing import WORDS

TEST_ROWS = 7


@pytest.fixture(scope="module")
def rte_with_test(glue_dir, tmp_path_factory) -> str:
    """The generated GLUE folder plus an unlabeled RTE test file."""
    root = tmp_path_factory.mktemp("glue-rte-test")
    shutil.copytree(glue_dir, root, dirs_exist_ok=True)
    rng = random.Random(3)
    rows = ["index\tsentence1\tsentence2"] + [
        f"{i}\t{' '.join(rng.choice(WORDS) for _ in range(5))}\t{' '.join(rng.choice(WORDS) for _ in range(4))}"
        for i in range(TEST_ROWS)]
    (root / "RTE" / "test.tsv").write_text("\n".join(rows) + "\n")
    return str(root)


def _run(model, data, out, *extra) -> int:
    return main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--model", model, "--data-dir", data,
                 "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "64", "--quiet", *extra])


def _record(out: Path) -> Path:
    (path,) = (out / "runs").glob("*.json")
    return path


def test_predict_test_on_a_finished_run_uses_its_saved_model(tiny_bert_dir, rte_with_test, tmp_path, capsys):
    assert _run(tiny_bert_dir, rte_with_test, tmp_path, "--save-model") == 0
    path = _record(tmp_path)
    before = json.loads(path.read_text())
    assert "test_predictions" not in before["artifacts"]
    before["kept_from_a_newer_suite"] = {"anything": 1}  # a field this code does not know must survive the rewrite
    path.write_text(json.dumps(before, indent=1))
    capsys.readouterr()

    assert _run(tiny_bert_dir, rte_with_test, tmp_path, "--predict-test") == 0
    err = capsys.readouterr().err
    assert "rte/vanilla/seed1: test predictions from its saved model (no retraining)" in err
    after = json.loads(path.read_text())
    tsv = path.parent / after["artifacts"]["test_predictions"]["RTE"]
    assert after["artifacts"]["model"] == before["artifacts"]["model"]
    assert {k: v for k, v in after.items() if k != "artifacts"} == {k: v for k, v in before.items()
                                                                     if k != "artifacts"}  # not retrained
    lines = tsv.read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == TEST_ROWS + 1
    assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "not_entailment"}

    # the same predictions as `suite predict` makes from that checkpoint
    assert main(["predict", str(path), "--data-dir", rte_with_test, "--out", str(tmp_path / "submission")]) == 0
    assert (tmp_path / "submission" / "RTE.tsv").read_text() == tsv.read_text()

    # asked again, nothing is left to do
    capsys.readouterr()
    assert _run(tiny_bert_dir, rte_with_test, tmp_path, "--predict-test") == 0
    assert "note:" not in capsys.readouterr().err and json.loads(path.read_text()) == after


def test_finished_run_without_a_saved_model_says_how_to_get_its_outputs(tiny_bert_dir, rte_with_test, tmp_path,
                                                                        capsys):
    assert _run(tiny_bert_dir, rte_with_test, tmp_path) == 0
    path = _record(tmp_path)
    written = path.read_bytes()
    capsys.readouterr()
    assert _run(tiny_bert_dir, rte_with_test, tmp_path, "--predict-test", "--save-model") == 0
    err = capsys.readouterr().err
    assert ("rte/vanilla/seed1: no test predictions: its record has no saved model (it ran without --save-model); "
            "--force reruns it") in err
    assert "rte/vanilla/seed1: its record has no saved model, and a model cannot be saved without retraining" in err
    assert path.read_bytes() == written and not list(tmp_path.glob("runs/*.test"))


def test_predictions_for_a_finished_run_replace_a_link_planted_at_its_test_folder(tiny_bert_dir, rte_with_test,
                                                                                   tmp_path):
    """A link at RUN.test pointing out of the output folder is replaced, never written through."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    assert _run(tiny_bert_dir, rte_with_test, out, "--save-model") == 0
    outside.mkdir()
    (outside / "RTE.tsv").write_text("keep me\n")
    link = _record(out).with_suffix(".test")
    link.symlink_to(outside, target_is_directory=True)
    assert _run(tiny_bert_dir, rte_with_test, out, "--predict-test") == 0
    assert (outside / "RTE.tsv").read_text() == "keep me\n" and sorted(p.name for p in outside.iterdir()) == ["RTE.tsv"]
    assert not link.is_symlink() and len((link / "RTE.tsv").read_text().splitlines()) == TEST_ROWS + 1
