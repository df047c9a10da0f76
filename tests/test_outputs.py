"""What a run leaves besides its record, on a tiny model, offline: test-set predictions in the GLUE server format,
saved checkpoints that `predict` loads back, and tracking to TensorBoard, MLflow and W&B (offline)."""
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import needs

from suite.commands import main
from suite.testing import WORDS

TEST_ROWS = 9


def _write_tests(root: Path) -> None:
    """Unlabeled test files in the GLUE layout: RTE, STS-B (9 columns), MNLI m/mm and the diagnostic set."""
    rng = random.Random(1)

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))

    def write(path: Path, header: list[str], make) -> None:
        rows = ["\t".join(header)] + ["\t".join(make(i)) for i in range(TEST_ROWS)]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(rows) + "\n")

    write(root / "RTE" / "test.tsv", ["index", "sentence1", "sentence2"],
          lambda i: [str(TEST_ROWS - 1 - i), sentence(), sentence()])  # rows out of index order
    write(root / "STS-B" / "test.tsv", ["index", "genre", "filename", "year", "old_index", "source1", "source2",
                                        "sentence1", "sentence2"],
          lambda i: [str(i), "main-news", "x", "2012", f"{i:04d}", "none", "none", sentence(), sentence()])
    mnli = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2"]
    for name in ("test_matched", "test_mismatched"):
        write(root / "MNLI" / f"{name}.tsv", mnli, lambda i: [str(i), "1", "1e", "fiction", sentence(), sentence()])
    write(root / "diagnostic" / "diagnostic.tsv", ["index", "sentence1", "sentence2"],
          lambda i: [str(i), sentence(), sentence()])


@pytest.fixture(scope="module")
def glue_with_tests(glue_dir, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("glue-tests")
    shutil.copytree(glue_dir, root, dirs_exist_ok=True)
    _write_tests(root)
    return str(root)


def _run(model, data, out, *extra, tasks="rte"):
    return main(["run", "--methods", "vanilla", "--tasks", tasks, "--seeds", "1", "--model", model, "--data-dir", data,
                 "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-length", "64", "--quiet", *extra])


def _submission(path: Path) -> list[list[str]]:
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    return [line.split("\t") for line in lines[1:]]


def test_predict_test_and_save_model_then_predict_from_the_checkpoint(tiny_bert_dir, glue_with_tests, tmp_path):
    assert _run(tiny_bert_dir, glue_with_tests, tmp_path, "--predict-test", "--save-model", tasks="rte,stsb,mnli") == 0
    records = {json.loads(p.read_text())["config"]["task"]: p for p in (tmp_path / "runs").glob("*.json")}
    written = {}
    for task, path in records.items():
        rec = json.loads(path.read_text())
        assert (path.parent / rec["artifacts"]["model"] / "model.safetensors").is_file()
        written.update({name: path.parent / f for name, f in rec["artifacts"]["test_predictions"].items()})
    assert sorted(written) == ["AX", "MNLI-m", "MNLI-mm", "RTE", "STS-B"]
    rte = _submission(written["RTE"])
    assert [int(i) for i, _ in rte] == list(range(TEST_ROWS))  # sorted by index although the file is not
    assert {p for _, p in rte} <= {"entailment", "not_entailment"}
    assert {p for _, p in _submission(written["AX"])} <= {"entailment", "neutral", "contradiction"}
    scores = [float(p) for _, p in _submission(written["STS-B"])]
    assert len(scores) == TEST_ROWS and all(0 <= s <= 5 for s in scores)

    # the saved checkpoint, loaded by `predict` (from its record), gives the very same predictions
    assert main(["predict", str(records["rte"]), str(records["mnli"]), "--data-dir", glue_with_tests,
                 "--out", str(tmp_path / "submission")]) == 0
    for name in ("RTE", "MNLI-m", "AX"):
        assert (tmp_path / "submission" / f"{name}.tsv").read_text() == written[name].read_text()


def test_checkpoint_keeps_a_methods_own_parameters(tiny_bert_dir, glue_with_tests, tmp_path):
    """entmax_alpha learns one alpha per head: the checkpoint must carry the trained values, not re-initialise them."""
    import torch

    from suite.run.test_predictions import load_checkpoint

    assert main(["run", "--methods", "entmax_alpha", "--tasks", "rte", "--seeds", "1", "--model", tiny_bert_dir,
                 "--data-dir", glue_with_tests, "--out", str(tmp_path), "--epochs", "1", "--batch-size", "8",
                 "--lr", "1e-2", "--max-length", "64", "--quiet", "--save-model"]) == 0
    folder = next((tmp_path / "runs").glob("*.model"))
    model, _, job, spec = load_checkpoint(folder, torch.device("cpu"))
    from safetensors.torch import load_file

    saved = load_file(folder / "model.safetensors")
    state = model.state_dict()
    alphas = [k for k in saved if "alpha" in k]
    assert alphas, "entmax_alpha should save its alpha parameters"
    for k in saved:
        assert torch.equal(state[k], saved[k]), k
    assert job.method == "entmax_alpha" and spec.name == "rte"


def test_predict_test_without_test_files_is_refused_before_training(tiny_bert_dir, glue_dir, tmp_path, capsys):
    assert _run(tiny_bert_dir, glue_dir, tmp_path, "--predict-test") == 2
    assert "has no test set here" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_submission_format_per_task():
    from suite.api.tasks import get_task
    from suite.run.test_predictions import format_predictions

    logits = np.array([[0.1, 0.9], [2.0, -1.0]], dtype=np.float32)
    assert format_predictions(get_task("cola"), get_task("cola").test_sets[0], logits) == ["1", "0"]
    assert format_predictions(get_task("rte"), get_task("rte").test_sets[0], logits) == ["not_entailment", "entailment"]
    assert format_predictions(get_task("wnli"), get_task("wnli").test_sets[0], logits) == ["1", "0"]
    stsb = np.array([[-0.4], [2.5], [7.0]], dtype=np.float32)
    assert format_predictions(get_task("stsb"), get_task("stsb").test_sets[0], stsb) == ["0.000", "2.500", "5.000"]


@needs("tensorboard")
def test_a_tracker_that_cannot_open_its_store_is_a_warning_not_a_failed_run(tiny_bert_dir, glue_dir, tmp_path):
    """OUT/tracking is a file: TensorBoard cannot create its folder at the first epoch. The run is recorded ok, with
    the tracker's error among its artifacts."""
    (tmp_path / "tracking").write_text("not a folder")
    with pytest.warns(UserWarning, match="tracking failed and is off for this run"):
        assert _run(tiny_bert_dir, glue_dir, tmp_path, "--report-to", "tensorboard") == 0
    rec = json.loads(next((tmp_path / "runs").glob("*.json")).read_text())
    assert rec["status"] == "ok" and "tracking_error" in rec["artifacts"]


@needs("tensorboard", "mlflow", "wandb")
def test_tracking_tensorboard_mlflow_wandb_offline(tiny_bert_dir, glue_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert _run(tiny_bert_dir, glue_dir, tmp_path, "--report-to", "tensorboard,mlflow,wandb") == 0
    rec = json.loads(next((tmp_path / "runs").glob("*.json")).read_text())
    assert "tracking_error" not in (rec.get("artifacts") or {})
    name = next((tmp_path / "runs").glob("*.json")).stem

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tracking" / "tensorboard" / name))
    events.Reload()
    curve = [e.value for e in events.Scalars("dev/score")]
    assert curve == pytest.approx([h["dev"]["score"] for h in rec["history"]])
    assert events.Scalars("final/score")[0].value == pytest.approx(rec["final"]["score"])

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'tracking' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("suite").experiment_id])
    assert run.info.run_name == name and run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == str(rec["config"]["train"]["lr"])
    history = client.get_metric_history(run.info.run_id, "dev/score")  # the same names in every tracker
    assert [m.value for m in sorted(history, key=lambda m: m.step) if m.step > 0] == \
        pytest.approx([h["dev"]["score"] for h in rec["history"]])
    assert client.get_metric_history(run.info.run_id, "step/train_loss")  # the training loss every few steps

    (log,) = list((tmp_path / "tracking" / "wandb" / "wandb").glob("offline-run-*/*.wandb"))
    history, other = _wandb_values(log.read_bytes(), 0x12), _wandb_values(log.read_bytes(), 0x0A)
    # each epoch's values are in the log (W&B writes each logged row twice: as history and as the running summary)
    for epoch in rec["history"]:
        assert epoch["train_loss"] in [pytest.approx(float(v)) for v in history["train_loss"]]
        assert epoch["dev"]["score"] in [pytest.approx(float(v)) for v in history["dev/score"]]
    assert float(other["final/score"][-1]) == pytest.approx(rec["final"]["score"])
    assert json.loads(other["status"][-1]) == "ok" and json.loads(other["method"][-1]) == "vanilla"


def _wandb_values(blob: bytes, tag: int) -> dict[str, list[str]]:
    """The (key, JSON value) pairs of a W&B offline log whose key has protobuf tag `tag` (0x12: history items,
    0x0A: config and summary items), followed by `value_json` (field 16: bytes 0x82 0x01, a length, the JSON)."""
    import re

    found: dict[str, list[str]] = {}
    for m in re.finditer(re.escape(bytes([tag])) + rb"([\x01-\x7f])", blob):
        start, n = m.end(), m.group(1)[0]
        key, rest = blob[start:start + n], start + n
        if blob[rest:rest + 2] != b"\x82\x01" or not re.fullmatch(rb"[\w/.]+", key or b"-"):
            continue
        length = blob[rest + 2]
        found.setdefault(key.decode(), []).append(blob[rest + 3:rest + 3 + length].decode())
    return found


def test_report_to_unknown_tracker_exits_2(tiny_bert_dir, glue_dir, tmp_path, capsys):
    assert _run(tiny_bert_dir, glue_dir, tmp_path, "--report-to", "tensorbord") == 2
    assert "unknown tracker" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["no tokenizer files", "corrupt tokenizer.json"])
def test_a_saved_model_without_a_working_tokenizer_is_refused_before_predicting(tiny_bert_dir, glue_with_tests,
                                                                                tmp_path, capsys, damage):
    """Without its tokenizer files transformers builds a vocabulary of special tokens only, and every row gets one
    label: `predict` must refuse the checkpoint (exit 2, naming it) instead of writing such predictions."""
    assert _run(tiny_bert_dir, glue_with_tests, tmp_path, "--save-model") == 0
    folder = next((tmp_path / "runs").glob("*.model"))
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if damage == "no tokenizer files":
            (folder / name).unlink(missing_ok=True)
    if damage == "corrupt tokenizer.json":
        (folder / "vocab.txt").unlink(missing_ok=True)
        (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordPiece"')
    _as_saved(folder)  # a checkpoint saved that way: its digests pass, so the tokenizer check must refuse it
    capsys.readouterr()
    assert main(["predict", str(folder), "--data-dir", glue_with_tests, "--out", str(tmp_path / "sub")]) == 2
    err = capsys.readouterr().err
    assert str(folder) in err and "tokenizer" in err and "Traceback" not in err
    assert "differ from what the run saved" not in err and "its record's run saved" not in err
    assert not (tmp_path / "sub" / "RTE.tsv").exists()


def _as_saved(folder: Path) -> None:
    """Rewrite the digests a checkpoint's description and its record keep, as if its files had been saved as they
    are now."""
    from suite.run.test_predictions import CHECKPOINT_INFO, checkpoint_files, files_digest

    info = json.loads((folder / CHECKPOINT_INFO).read_text())
    info["files"] = checkpoint_files(folder)
    (folder / CHECKPOINT_INFO).write_text(json.dumps(info))
    record = folder.with_suffix(".json")
    rec = json.loads(record.read_text())
    rec["artifacts"]["model_sha256"] = files_digest(info["files"])
    record.write_text(json.dumps(rec))
