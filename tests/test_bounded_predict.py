"""`predict` and the test-set reader are held to what `run` and the train reader are held to: every line of a test
file read bounded and checked (file:line), and a saved model's size checked against memory before its weights load.
The bombs run in a child process capped at 2 GiB of address space (conftest.run_under_memory_limit)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MEMORY_LIMIT_GIB

from suite.api.errors import EXIT_BAD_INPUT, DataError
from suite.api.tasks import get_task
from suite.commands import main

HEADER = "index\tsentence1\tsentence2\n"
GOOD = "0\ta cat sat\ta dog ran\n"

# (test.tsv's text, what the refusal says): the classes of malformed lines the train reader refuses
MALFORMED = {
    "index only": (HEADER + GOOD + "1\n", "test.tsv:3: expected 3 tab-separated fields, found 1"),
    "a field short": (HEADER + GOOD + "1\tonly one sentence\n", "test.tsv:3: expected 3 tab-separated fields, found 2"),
    "a field too many": (HEADER + "0\ta\tb\tc\n", "test.tsv:2: expected 3 tab-separated fields, found 4"),
    "no number": (HEADER + "zero\ta\tb\n", "test.tsv:2: index 'zero' is not an integer row number"),
    "no column": ("idx\tsentence1\tsentence2\n" + GOOD, "test.tsv:1: header has no column 'index'"),
    "empty": ("", "test.tsv: the file is empty"),
    "NUL": (HEADER + "0\ta\x00\tb\n", "test.tsv:2: NUL bytes"),
    "field over the limit": (HEADER + "0\t" + "x" * 200_000 + "\tb\n", "test.tsv:2: a field longer than 131072"),
    "line over the limit": (HEADER + "0\t" + "x y\t" * 600_000 + "b\n", "test.tsv:2: a line longer than 2,000,000"),
}


def _rte_tests(folder: Path, text: str) -> Path:
    (folder / "RTE").mkdir(parents=True, exist_ok=True)
    (folder / "RTE" / "test.tsv").write_text(text)
    return folder


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_test_set_is_read_as_strictly_as_a_train_set(case, tmp_path):
    from suite.run.test_predictions import read_test_set

    text, message = MALFORMED[case]
    spec = get_task("rte")
    with pytest.raises(DataError, match=message.replace("(", r"\(")):
        read_test_set(spec, spec.test_sets[0], _rte_tests(tmp_path, text))


def test_a_well_formed_test_set_reads_as_before(tmp_path):
    from suite.run.test_predictions import read_test_set

    spec = get_task("rte")
    found = read_test_set(spec, spec.test_sets[0], _rte_tests(tmp_path, "\ufeff" + HEADER + GOOD + "\n7\tnull\tNA\n"))
    assert found == {"sentence1": ["a cat sat", "null"], "sentence2": ["a dog ran", "NA"], "index": [0, 7]}


def test_a_50_mb_test_line_is_refused_in_bounded_memory(tmp_path):
    """The same line in train.tsv was refused with file:line; in test.tsv `--predict-test` took 13.6 GB."""
    _rte_tests(tmp_path, HEADER + "0\t" + "word " * 10_000_000 + "\tb\n")
    code = ("import resource, sys\n"
            f"limit = int({MEMORY_LIMIT_GIB} * 2**30)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
            "from suite.api.errors import DataError\n"
            "from suite.api.tasks import get_task\n"
            "from suite.run.test_predictions import read_test_set\n"
            "spec = get_task('rte')\n"
            "try:\n"
            "    read_test_set(spec, spec.test_sets[0], sys.argv[1])\n"
            "except DataError as exc:\n"
            "    sys.exit(str(exc))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "test.tsv:2: a line longer than 2,000,000 characters" in out.stderr, out.stderr


@pytest.fixture(scope="module")
def checkpoint(tiny_bert_dir, tmp_path_factory) -> Path:
    """A checkpoint as `run --save-model` writes it, of an untrained tiny BERT (predict needs no trained weights)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from suite.run.settings import RunConfig, TrainSettings
    from suite.run.test_predictions import save_checkpoint

    folder = tmp_path_factory.mktemp("ckpt") / "rte.model"
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir, num_labels=2)
    job = RunConfig(tiny_bert_dir, "rte", "vanilla", {}, 1, TrainSettings(precision="fp32", max_length=32))
    save_checkpoint(folder, model, AutoTokenizer.from_pretrained(tiny_bert_dir), job)
    return folder


def test_predict_refuses_a_test_line_holding_only_its_index(checkpoint, tmp_path, capsys):
    """`run --predict-test` refused it; `predict` wrote a prediction for it."""
    data = _rte_tests(tmp_path / "glue", HEADER + GOOD + "1\n")
    assert main(["predict", str(checkpoint), "--data-dir", str(data), "--out", str(tmp_path / "sub")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "test.tsv:3: expected 3 tab-separated fields, found 1" in err and "Traceback" not in err
    assert not (tmp_path / "sub" / "RTE.tsv").exists()


@pytest.mark.parametrize("layers, hidden", [(4096, 8192), (10**9, 64)], ids=["4096x8192", "a billion layers"])
def test_predict_refuses_a_model_too_large_for_memory_before_its_weights_load(checkpoint, tmp_path, capsys,
                                                                              monkeypatch, layers, hidden):
    """`run`'s preflight refused a config claiming 4,096 layers of hidden 8,192; `predict` loaded it. A billion
    layers is refused from the config's numbers, before a skeleton of them would be built."""
    huge = tmp_path / "huge.model"
    shutil.copytree(checkpoint, huge)
    config = json.loads((huge / "config.json").read_text())
    (huge / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers, "hidden_size": hidden}))

    def loads(*args, **kwargs):
        raise AssertionError("the weights were loaded before the memory check")

    monkeypatch.setattr("transformers.AutoModelForSequenceClassification.from_pretrained", loads)
    monkeypatch.setattr("suite.grid.preflight._skeleton", loads)
    data = _rte_tests(tmp_path / "glue", HEADER + GOOD)
    assert main(["predict", str(huge), "--data-dir", str(data), "--out", str(tmp_path / "sub")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"{huge}: its config.json claims" in err and "more than the" in err and "Traceback" not in err
