"""Tasks from anywhere: a local-only plugin task with its own data folder and its own registered metric runs next to
GLUE's tasks; a local-only task without a folder is refused before training."""
import json
import random

import pytest

from suite.api.metrics import METRICS, register_metric
from suite.api.tasks import TASKS, LocalSplit, TaskSpec, register_task
from suite.commands import main
from suite.testing import WORDS


@pytest.fixture
def polarity_task(tmp_path):
    """A two-class sentence task shipped as its own folder (hub None), scored by a metric it registers."""
    rng = random.Random(0)
    folder = tmp_path / "polarity-data"
    folder.mkdir()
    for split, n in (("train", 16), ("dev", 8)):
        rows = ["text\tpolarity"] + [f"{' '.join(rng.choice(WORDS) for _ in range(4))}\t{['neg', 'pos'][i % 2]}"
                                     for i in range(n)]
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    from sklearn.metrics import balanced_accuracy_score

    register_metric("balanced_accuracy", lambda pred, gold: float(balanced_accuracy_score(gold, pred)))
    layout = {s: LocalSplit(f, {"sentence": "text", "label": "polarity"}, labels={"neg": 0, "pos": 1})
              for s, f in (("train", "train.tsv"), ("validation", "dev.tsv"))}
    spec = register_task(TaskSpec("polarity", "Polarity", ("sentence",), ("neg", "pos"), ("balanced_accuracy",),
                                  None, local=layout, data_dir=str(folder)))
    yield spec
    TASKS.remove("polarity")
    METRICS.remove("balanced_accuracy")


def test_plugin_task_with_its_own_folder_runs_next_to_glue(polarity_task, tiny_bert_dir, glue_dir, tmp_path):
    assert main(["run", "--methods", "vanilla", "--tasks", "polarity,rte", "--seeds", "1", "--model", tiny_bert_dir,
                 "--data-dir", glue_dir, "--out", str(tmp_path / "out"), "--epochs", "1", "--batch-size", "8",
                 "--max-length", "32", "--quiet"]) == 0
    records = {r["config"]["task"]: r for r in
               (json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*.json"))}
    assert records["polarity"]["status"] == "ok" and "balanced_accuracy" in records["polarity"]["final"]
    assert records["polarity"]["data"]["train"] == 16 and records["rte"]["status"] == "ok"


def test_local_only_task_without_a_folder_is_refused(polarity_task, tiny_bert_dir, tmp_path, capsys, monkeypatch):
    import dataclasses

    TASKS.remove("polarity")
    register_task(dataclasses.replace(polarity_task, data_dir=""))
    monkeypatch.delenv("SUITE_DATA_DIR", raising=False)
    assert main(["run", "--methods", "vanilla", "--tasks", "polarity", "--model", tiny_bert_dir,
                 "--out", str(tmp_path), "--quiet"]) == 2
    assert "has local files only" in capsys.readouterr().err
