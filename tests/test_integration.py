"""The real thing, small: MiniLM fine-tuned on an RTE subset read from ../shared/data/glue."""
import json

import pytest

from suite.api.tasks import get_task
from suite.commands import main
from suite.run.data import load_splits

pytestmark = pytest.mark.integration


def test_real_glue_files_read_with_manifest_row_counts(shared_glue):
    expected = {"cola": (8551, 1043), "sst2": (67349, 872), "mrpc": (3668, 408), "stsb": (5749, 1500),
                "rte": (2490, 277), "wnli": (635, 71)}
    for task, (n_train, n_dev) in expected.items():
        d = load_splits(get_task(task), shared_glue)
        assert (len(d["train"]["idx"]), len(d["validation"]["idx"])) == (n_train, n_dev)


def test_minilm_on_rte_subset(shared_glue, tmp_path):
    code = main(["run", "--methods", "vanilla,scores_dropout", "--tasks", "rte", "--seeds", "1",
                 "--data-dir", str(shared_glue), "--max-train-samples", "48", "--max-eval-samples", "64",
                 "--epochs", "1", "--batch-size", "16", "--precision", "fp32", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    recs = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json")]
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs)
    for r in recs:
        assert r["config"]["model"] == "minilm" and r["data"] == {"train": 48, "dev": {"validation": 64},
                                                                  "train_subset": 48, "draw": r["data"]["draw"]}
        assert r["data"]["draw"]["data_seed"] == 1 and r["data"]["draw"]["subset_draw"] == "nested"
        assert 0.0 <= r["final"]["accuracy"] <= 1.0 and r["history"][0]["train_loss"] > 0
