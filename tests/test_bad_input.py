"""Bad input: impossible settings, unusable models, devices and output folders are refused (exit 2) before anything
trains (what happens to records once training runs: test_records_kept.py).

Everything refused before training runs with `run_one` replaced by a function that fails the test if called."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import fake_ok_record, run_cli, set_cpu_bf16

from suite import commands
from suite.api.attention import METHODS, attention_modules
from suite.api.errors import EXIT_BAD_INPUT
from suite.grid.preflight import VERIFIED_MODEL_TYPES, check_model, warn_unused_settings
from suite.run.settings import RunConfig, TrainSettings


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a run starts: refused input must be refused before training."""
    def run_one(job, *args, **kwargs):
        raise AssertionError(f"{job.label} was trained although its input is impossible")

    monkeypatch.setattr("suite.run.runner.run_one", run_one)


def assert_refused(capsys, rc: int, out: Path, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err
    assert not list((out / "runs").glob("*.json")) if (out / "runs").is_dir() else True
    return err


# ---------------------------------------------------------------------------------------------------------
# Impossible settings and devices: exit 2 before training
# ---------------------------------------------------------------------------------------------------------

SETTINGS = {
    "seed -1": (["--seeds=-1"], "outside [0, 2**32)"),
    "seed 2**32": (["--seeds", str(2**32)], "outside [0, 2**32)"),
    "train_eval_samples<0": (["--set", "train.train_eval_samples=-1"], "train.train_eval_samples=-1"),
    "data_seed<0": (["--set", "train.data_seed=-1"], "train.data_seed=-1"),
    "data_seed 2**32": (["--set", f"train.data_seed={2**32}"], "train.data_seed"),
    "stats_batches<0": (["--set", "train.stats_batches=-1"], "train.stats_batches=-1"),
    "lr inf": (["--lr", "inf"], "train.lr=inf"),
    "lr nan": (["--lr", "nan"], "train.lr=nan"),
    "lr 0": (["--lr", "0"], "train.lr=0"),
    "grad_clip nan": (["--set", "train.grad_clip=nan"], "train.grad_clip=nan"),
    "grad_clip<0": (["--set", "train.grad_clip=-1"], "train.grad_clip=-1"),
    "weight_decay<0": (["--set", "train.weight_decay=-0.1"], "train.weight_decay=-0.1"),
    "weight_decay nan": (["--set", "train.weight_decay=nan"], "train.weight_decay=nan"),
    "device gpu": (["--device", "gpu"], "--device 'gpu'"),
    "device tpu": (["--device", "tpu"], "--device 'tpu'"),
    "max_length > positions": (["--max-length", "129"], "position embeddings hold 128 tokens"),
    "max_length > positions (swept)": (["--sweep", "train.max_length=64,200"], "--max-length 200"),
    # RTE is a sentence pair: [CLS] a [SEP] b [SEP] needs 3 special tokens and one token of each sentence
    "max_length 1 (no truncation possible)": (["--max-length", "1"], "least useful length is 5"),
    "max_length 4 (special tokens only)": (["--max-length", "4"], "leaves no room for text on RTE"),
    "model ',' (no models)": (["--model", ","], "the grid has no runs"),  # gave 0 runs and exit 0
    # 100001 was OOM-killed (2.8 billion parameters on MiniLM); a tap farther than the longest input meets only zeros
    "dynamicconv kernel wider than any input": (["--methods", "dynamicconv", "--set", "dynamicconv.kernel_size=100001"],
                                                "at most 255 taps ever reach a token"),
}


@pytest.mark.parametrize("extra,message", list(SETTINGS.values()), ids=list(SETTINGS))
def test_impossible_settings_exit_2_before_training(extra, message, no_training, tiny_bert_dir, glue_dir, tmp_path,
                                                    capsys):
    out = tmp_path / "out"
    assert_refused(capsys, run_cli(tiny_bert_dir, glue_dir, out, *extra), out, message)


def test_more_freed_layers_than_the_model_has_exits_2_before_training(no_training, tiny_bert_dir, glue_dir, tmp_path,
                                                                       capsys):
    out = tmp_path / "out"
    rc = run_cli(tiny_bert_dir, glue_dir, out, "--methods", "less_attention", "--set", "less_attention.layers=9")
    assert_refused(capsys, rc, out, "less_attention.layers=9 exceeds the model's 2 layers")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu_exits_2(no_training, tiny_bert_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert_refused(capsys, run_cli(tiny_bert_dir, glue_dir, out, "--device", "cuda"), out, "no CUDA device")


def test_bad_data_exits_2_naming_file_and_line(no_training, tiny_bert_dir, glue_dir, tmp_path, capsys):
    """A NaN score in STS-B's dev file used to give an ok record with a null score."""
    shutil.copytree(Path(glue_dir) / "STS-B", tmp_path / "glue" / "STS-B")
    dev = tmp_path / "glue" / "STS-B" / "dev.tsv"
    lines = dev.read_text().splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\tnan"
    dev.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    rc = commands.main(["run", "--methods", "vanilla", "--tasks", "stsb", "--seeds", "1", "--model", tiny_bert_dir,
                   "--data-dir", str(tmp_path / "glue"), "--out", str(out), "--quiet"])
    assert_refused(capsys, rc, out, f"{dev}:3: score 'nan' is not a finite number")


def test_set_for_a_method_not_in_the_grid_warns_from_the_command(tiny_bert_dir, glue_dir, tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: fake_ok_record(job))
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path / "out", "--set", "scores_dropout.p=0.2") == 0
    assert "warning: --set scores_dropout.p=0.2 has no effect" in capsys.readouterr().err


def test_ray_leaves_cuda_to_the_cluster_but_refuses_non_devices():
    from suite.api.errors import BadInput
    from suite.grid.preflight import check_device

    check_device("cuda", "ray")  # the driver may have no GPU; the cluster's workers do
    check_device("cuda:1", "ray")
    for device in ("gpu", "tpu"):
        with pytest.raises(BadInput, match=f"--device '{device}'"):
            check_device(device, "ray")


# ---------------------------------------------------------------------------------------------------------
# Models: load-checked once before the grid
# ---------------------------------------------------------------------------------------------------------

def _copy(src: str, dst: Path, drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst)
    for name in drop:
        (dst / name).unlink()
    return dst


def _tiny_folder(dst: Path, model_type: str, tokenizer_from: str, **sizes) -> Path:
    """A saved random-init classifier of `model_type` with the tiny BERT's tokenizer files."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model(model_type, vocab_size=64, **sizes)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(dst)
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json"):
        shutil.copy(Path(tokenizer_from) / name, dst / name)
    return dst


SMALL = {"gpt2": dict(n_embd=32, n_layer=1, n_head=4, n_positions=64),
         "deberta-v2": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64),
         "xlnet": dict(d_model=32, n_layer=1, n_head=4, d_inner=64)}
# why each is refused (transformers 5.25): a decoder, attention computed in the model's own code
SMALL_REASONS = {"gpt2": "its attention is causal", "deberta-v2": "its disentangled attention",
                 "xlnet": "does not go through transformers' attention interface"}


@pytest.fixture(scope="module")
def bad_models(tiny_bert_dir, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Model folders a run cannot use, with the fragment the refusal must contain."""
    root = tmp_path_factory.mktemp("bad-models")
    truncated = _copy(tiny_bert_dir, root / "truncated")
    blob = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(blob[:len(blob) // 2])
    other = _copy(tiny_bert_dir, root / "other-weights", drop=("model.safetensors",))
    from transformers import BertForSequenceClassification

    from suite.testing import tiny_config

    BertForSequenceClassification(tiny_config("bert", hidden_size=48, vocab_size=64)).save_pretrained(root / "wide")
    shutil.copy(root / "wide" / "model.safetensors", other / "model.safetensors")
    specials_only = _copy(tiny_bert_dir, root / "specials-only", drop=("tokenizer.json",))
    (specials_only / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    cases = {
        "missing folder": (root / "nowhere", "cannot load model"),
        "tokenizer of special tokens only": (specials_only, "has only its special tokens"),
        "no weights": (_copy(tiny_bert_dir, root / "no-weights", drop=("model.safetensors",)),
                       "no file named model.safetensors"),
        "truncated weights": (truncated, "cannot load the weights"),
        "weights of another model": (other, "weights of the model body are missing or of another shape"),
        "no tokenizer files": (_copy(tiny_bert_dir, root / "no-tokenizer",
                                     drop=("vocab.txt", "tokenizer.json", "tokenizer_config.json")),
                               "has no tokenizer files (looked for tokenizer.json or vocab.txt"),
    }
    for model_type, sizes in SMALL.items():
        cases[model_type] = (_tiny_folder(root / model_type, model_type, tiny_bert_dir, **sizes),
                             f"type {model_type!r}")
    return cases


BAD_MODELS = ["missing folder", "tokenizer of special tokens only", "no weights", "truncated weights",
              "weights of another model", "no tokenizer files", *SMALL]


@pytest.mark.parametrize("case", BAD_MODELS)
def test_unusable_models_exit_2_before_training(case, bad_models, no_training, glue_dir, tmp_path, capsys):
    folder, message = bad_models[case]
    out = tmp_path / "out"
    err = assert_refused(capsys, run_cli(folder, glue_dir, out), out, message)
    if case in SMALL:
        assert SMALL_REASONS[case] in err and "Model types that work with this transformers: bert, roberta" in err


def test_model_types_said_to_work_dispatch_attention_to_the_method():
    """Every type the refusal lists as working sends each self-attention call to the attached method."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    class Reached(Exception):
        pass

    vanilla = METHODS.get("vanilla")

    class Probe(vanilla):
        def attention(self, *args, **kwargs):
            raise Reached

    # each type's own vocabulary: ModernBERT's special tokens lie beyond a small one
    sizes = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=40)
    for model_type in VERIFIED_MODEL_TYPES:
        model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(model_type, **sizes))
        assert attention_modules(model), model_type
        Probe(vanilla.Config()).attach(model)
        with pytest.raises(Reached):
            model(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long))


def test_roberta_positions_lose_the_padding_offset(tiny_bert_dir, tmp_path):
    """RoBERTa numbers positions from pad_token_id + 1: 80 position embeddings hold 78 tokens."""
    from transformers import RobertaForSequenceClassification

    from suite.api.errors import BadInput
    from suite.testing import tiny_config

    folder = tmp_path / "tiny-roberta"
    RobertaForSequenceClassification(tiny_config("roberta", vocab_size=64)).save_pretrained(folder)
    for name in ("vocab.txt", "tokenizer_config.json", "tokenizer.json"):
        shutil.copy(Path(tiny_bert_dir) / name, folder / name)
    check_model(str(folder), 78)
    with pytest.raises(BadInput, match="position embeddings hold 78 tokens"):
        check_model(str(folder), 79)
    check_model(tiny_bert_dir, 128)  # BERT (128 positions): no offset


def test_set_for_a_method_not_in_the_grid_warns(capsys):
    warn_unused_settings(["scores_dropout.p=0.2", "vanilla.p=0.1", "train.lr=1e-5", "vanilla:train.lr=2e-5"],
                         ["scores_dropout.p=0.1,0.2", "uniform:train.lr=1e-5,2e-5"], {"vanilla"})
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: --set scores_dropout.p=0.2 has no effect: method 'scores_dropout' is not in "
                   "--methods (vanilla)",
                   "warning: --sweep scores_dropout.p=0.1,0.2 has no effect: method 'scores_dropout' is not in "
                   "--methods (vanilla)",
                   "warning: --sweep uniform:train.lr=1e-5,2e-5 has no effect: method 'uniform' is not in "
                   "--methods (vanilla)"]


@pytest.mark.parametrize("native, precision, warned", [(False, "bf16", True), (True, "bf16", False),
                                                       (False, "fp32", False)])
def test_emulated_bf16_is_warned_about(monkeypatch, capsys, native, precision, warned):
    """bf16 autocast on a CPU that emulates it is slower than fp32: say so, and how to turn it off."""
    import dataclasses

    from suite.grid.preflight import warn_emulated_bf16

    set_cpu_bf16(monkeypatch, native)
    job = RunConfig("minilm", "rte", "vanilla", {}, 1, dataclasses.replace(TrainSettings(), precision=precision))
    warn_emulated_bf16([job], "cpu")
    err = capsys.readouterr().err
    assert ("--precision fp32" in err) == warned, err

# ---------------------------------------------------------------------------------------------------------
# Output folder and disk
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("blocked", ["out", "out/runs"])
def test_unwritable_out_exits_2_before_training(blocked, no_training, tiny_bert_dir, glue_dir, tmp_path, capsys):
    """A file where the output folder (or its runs folder) should be: nothing can be written there."""
    (tmp_path / blocked).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / blocked).write_text("in the way")
    rc = run_cli(tiny_bert_dir, glue_dir, tmp_path / "out")
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT and "cannot write to" in err and "Choose another --out" in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_exits_2(no_training, tiny_bert_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs").chmod(0o555)
    try:
        assert run_cli(tiny_bert_dir, glue_dir, out) == EXIT_BAD_INPUT
        assert "cannot write to" in capsys.readouterr().err
    finally:
        (out / "runs").chmod(0o755)


@pytest.mark.parametrize("line", ["lr: true", "epochs: false", "max_train_samples: true"])
def test_true_or_false_for_a_number_in_a_study_exits_2(line, tiny_bert_dir, glue_dir, no_training, tmp_path, capsys):
    """pydantic read YAML's true as 1: `lr: true` trained at a learning rate of 1.0."""
    study = tmp_path / "study.yaml"
    study.write_text(f"methods: [vanilla]\ntasks: [rte]\ntrain:\n  {line}\n")
    out = tmp_path / "out"
    rc = commands.main(["run", "--study", str(study), "--model", tiny_bert_dir, "--data-dir", glue_dir, "--out",
                        str(out), "--quiet"])
    assert_refused(capsys, rc, out, f"train.{line.split(':')[0]}", "is not a number")


def test_a_run_whose_parameters_cannot_fit_in_memory_exits_2_with_the_numbers(no_training, tiny_bert_dir, glue_dir,
                                                                               tmp_path, capsys, monkeypatch):
    """The parameter count comes from the model's shape and the method's `extra_parameters`, before any training."""
    monkeypatch.setattr("suite.grid.preflight.machine_memory", lambda device="cpu": (2**20, "memory (RAM) here"))
    out = tmp_path / "out"
    rc = run_cli(tiny_bert_dir, glue_dir, out, "--methods", "dynamicconv", "--set", "dynamicconv.kernel_size=255")
    assert_refused(capsys, rc, out, "dynamicconv adds 65,280 parameters", "more than the 0.0 GiB of memory (RAM) here")


@pytest.mark.parametrize("method", ["lightconv", "dynamicconv"])
@pytest.mark.parametrize("kernel_size", [0, 5])
def test_extra_parameters_are_what_prepare_adds(method, kernel_size):
    from suite.api.tiny_models import tiny_config, tiny_model

    model = tiny_model()
    before = sum(p.numel() for p in model.parameters())
    attached = METHODS.get(method)(METHODS.get(method).Config(kernel_size=kernel_size))
    attached.attach(model)
    assert sum(p.numel() for p in model.parameters()) - before == attached.extra_parameters(tiny_config())


def test_constant_gold_scores_exit_2_before_training(no_training, tiny_bert_dir, glue_dir, tmp_path, capsys):
    """STS-B dev scores that are all equal leave the correlation undefined: it used to train, then fail with a
    diagnosis about constant predictions."""
    shutil.copytree(Path(glue_dir) / "STS-B", tmp_path / "glue" / "STS-B")
    dev = tmp_path / "glue" / "STS-B" / "dev.tsv"
    header, *rows = dev.read_text().splitlines()
    dev.write_text("\n".join([header, *(r.rsplit("\t", 1)[0] + "\t3.0" for r in rows)]) + "\n")
    out = tmp_path / "out"
    rc = commands.main(["run", "--methods", "vanilla", "--tasks", "stsb", "--seeds", "1", "--model", tiny_bert_dir,
                        "--data-dir", str(tmp_path / "glue"), "--out", str(out), "--quiet"])
    assert_refused(capsys, rc, out, f"every gold score of the dev examples used from {dev} is 3.0")


def test_a_config_claiming_thousands_of_layers_is_refused_before_its_weights_load(no_training, tiny_bert_dir,
                                                                                  glue_dir, tmp_path, capsys,
                                                                                  monkeypatch):
    """The memory estimate reads the config (the model built on the meta device): loading the weights of a model
    whose config claims 4,096 layers would be killed for memory before it could be refused."""
    import json

    model = tmp_path / "huge"
    shutil.copytree(tiny_bert_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4096}))

    def loads_weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the memory estimate")

    monkeypatch.setattr("suite.grid.preflight.machine_memory", lambda device="cpu": (2**26, "memory (RAM) here"))
    monkeypatch.setattr("suite.grid.preflight._check_weights", loads_weights)
    out = tmp_path / "out"
    rc = run_cli(str(model), glue_dir, out)
    assert_refused(capsys, rc, out, "parameters needs at least", "more than the 0.1 GiB of memory (RAM) here")


def test_a_model_folder_whose_name_no_record_file_can_hold_is_refused_before_training(no_training, tiny_bert_dir,
                                                                                      glue_dir, tmp_path, capsys):
    """A record is named TASK__METHOD__seedN__MODEL__HASH: with a 230-letter model folder its sidecar's name passes 255
    bytes, so the run would train and then lose its record."""
    model = tmp_path / ("m" * 230)
    shutil.copytree(tiny_bert_dir, model)
    out = tmp_path / "out"
    rc = run_cli(str(model), glue_dir, out)
    assert_refused(capsys, rc, out, "longer than the 255 bytes a file name holds", "give the model's folder a shorter")
