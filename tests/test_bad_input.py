"""Bad input and faults: impossible settings, unusable models, devices and output folders are refused (exit 2) before
anything trains; a diverged model is never recorded as ok; a record that cannot be written stops the grid without
losing it; SIGTERM stops the sequential executor with exit 143 and no record of the interrupted run; invalid record
files count as not done; two grids into one folder never train the same job at the same time.

Everything refused before training runs with `run_one` replaced by a function that fails the test if called."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from suite import cli
from suite.attention import METHODS, attention_modules
from suite.config import RunConfig, TrainSettings, build_grid, canonical_model, default_model
from suite.errors import EXIT_BAD_INPUT, EXIT_FAILED_RUNS, EXIT_TERMINATED
from suite.executors import pending_jobs
from suite.preflight import VERIFIED_MODEL_TYPES, check_model, warn_unused_settings
from suite.record import RunRecord
from suite.report.load import load
from suite.store import Store

TESTS_DIR = str(Path(__file__).resolve().parent)


def run_cli(model, glue, out, *extra) -> int:
    return cli.main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--model", str(model),
                     "--data-dir", glue, "--epochs", "1", "--batch-size", "8", "--out", str(out), "--quiet",
                     *extra])


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a run starts: refused input must be refused before training."""
    def run_one(job, *args, **kwargs):
        raise AssertionError(f"{job.label} was trained although its input is impossible")

    monkeypatch.setattr("suite.runner.run_one", run_one)


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
}


@pytest.mark.parametrize("extra,message", list(SETTINGS.values()), ids=list(SETTINGS))
def test_impossible_settings_exit_2_before_training(extra, message, no_training, tiny_bert_dir, glue_dir, tmp_path,
                                                    capsys):
    out = tmp_path / "out"
    assert_refused(capsys, run_cli(tiny_bert_dir, glue_dir, out, *extra), out, message)


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
    rc = cli.main(["run", "--methods", "vanilla", "--tasks", "stsb", "--seeds", "1", "--model", tiny_bert_dir,
                   "--data-dir", str(tmp_path / "glue"), "--out", str(out), "--quiet"])
    assert_refused(capsys, rc, out, f"{dev}:3: score 'nan' is not a finite number")


def test_set_for_a_method_not_in_the_grid_warns_from_the_command(tiny_bert_dir, glue_dir, tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setattr("suite.runner.run_one", lambda job, *a, **k: fake_ok_record(job))
    assert run_cli(tiny_bert_dir, glue_dir, tmp_path / "out", "--set", "scores_dropout.p=0.2") == 0
    assert "warning: --set scores_dropout.p=0.2 has no effect" in capsys.readouterr().err


def test_ray_leaves_cuda_to_the_cluster_but_refuses_non_devices():
    from suite.errors import BadInput
    from suite.preflight import check_device

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
         "xlnet": dict(d_model=32, n_layer=1, n_head=4, d_inner=64),
         "distilbert": dict(dim=32, n_layers=1, n_heads=4, hidden_dim=64)}


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


BAD_MODELS = ["missing folder", "tokenizer of special tokens only", "no weights", "truncated weights", "weights of another model", "no tokenizer files",
              *SMALL]


@pytest.mark.parametrize("case", BAD_MODELS)
def test_unusable_models_exit_2_before_training(case, bad_models, no_training, glue_dir, tmp_path, capsys):
    folder, message = bad_models[case]
    out = tmp_path / "out"
    err = assert_refused(capsys, run_cli(folder, glue_dir, out), out, message)
    if case in SMALL:
        assert "Model types that work: bert, roberta" in err


def test_model_types_said_to_work_dispatch_attention_to_the_method():
    """Every type the refusal lists as working sends each self-attention call to the attached method."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    class Reached(Exception):
        pass

    vanilla = METHODS.get("vanilla")

    class Probe(vanilla):
        def attention(self, *args, **kwargs):
            raise Reached

    sizes = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=64,
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

    from suite.errors import BadInput
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
    warn_unused_settings(["scores_dropout.p=0.2", "vanilla.p=0.1", "train.lr=1e-5"],
                         ["scores_dropout.p=0.1,0.2"], {"vanilla"})
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: --set scores_dropout.p=0.2 has no effect: method 'scores_dropout' is not in "
                   "--methods (vanilla)",
                   "warning: --sweep scores_dropout.p=0.1,0.2 has no effect: method 'scores_dropout' is not in "
                   "--methods (vanilla)"]


@pytest.mark.parametrize("native, precision, warned", [(False, "bf16", True), (True, "bf16", False),
                                                       (False, "fp32", False)])
def test_emulated_bf16_is_warned_about(monkeypatch, capsys, native, precision, warned):
    """bf16 autocast on a CPU that emulates it is slower than fp32: say so, and how to turn it off."""
    import dataclasses

    from suite.config import RunConfig, TrainSettings
    from suite.preflight import warn_emulated_bf16

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
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


def fake_ok_record(job: RunConfig) -> RunRecord:
    """A valid ok record made without training (the disk test needs records, not numbers)."""
    rec = RunRecord.started_now(job)
    rec.status, rec.wall_s, rec.final = "ok", 0.0, {"score": 0.5, "accuracy": 0.5}
    rec.history = [{"epoch": 1, "dev": rec.final}]
    return rec


def test_full_disk_stops_the_grid_and_keeps_every_record(tiny_bert_dir, glue_dir, tmp_path, monkeypatch, capsys):
    """The second record cannot be written (ENOSPC): it is kept in a fallback file, the grid stops with exit 1 and a
    message saying where the record is, and the first record is intact."""
    import suite.store

    trained = []
    monkeypatch.setattr("suite.runner.run_one", lambda job, *a, **k: trained.append(job) or fake_ok_record(job))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    real_write, writes = suite.store.atomic_write, []

    def atomic_write(target, write):
        writes.append(target)
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(target, write)

    monkeypatch.setattr(suite.store, "atomic_write", atomic_write)
    out = tmp_path / "out"
    rc = run_cli(tiny_bert_dir, glue_dir, out, "--seeds", "1,2,3")
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED_RUNS and "No space left on device" in err and "the grid stopped" in err, err
    assert len(trained) == 2  # the third job was not started
    first, second = trained
    assert Store(out).read(first.filename)["hash"] == first.hash
    kept = tmp_path / "tmp" / "suite-unsaved-records" / second.filename
    assert str(kept) in err and json.loads(kept.read_text())["hash"] == second.hash
    assert not (out / "runs" / second.filename).exists()


def test_records_are_readable_like_other_files(tmp_path):
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    old = os.umask(0o022)
    try:
        path = Store(tmp_path).write(job.filename, fake_ok_record(job))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


# ---------------------------------------------------------------------------------------------------------
# Records that are not records
# ---------------------------------------------------------------------------------------------------------

INVALID_RECORDS = {"list": "[]", "status only": '{"status": "ok"}', "not json": "{", "ok without score":
                   '{"config": {"task": "rte", "method": "vanilla", "seed": 1}, "hash": "h", "label": "l", '
                   '"status": "ok", "final": {"score": null}, "history": [{}]}'}


@pytest.mark.parametrize("content", list(INVALID_RECORDS.values()), ids=list(INVALID_RECORDS))
def test_invalid_record_counts_as_not_done_and_is_named(content, tmp_path):
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    store = Store(tmp_path)
    store.runs.mkdir(parents=True)
    store.path(job.filename).write_text(content)
    with pytest.warns(UserWarning, match=job.filename):
        todo, skipped = pending_jobs([job], store, force=False)
    assert todo == [job] and skipped == []


def test_report_skips_invalid_records_and_temporary_files(tmp_path):
    jobs = [RunConfig("m", "rte", "vanilla", {}, seed, TrainSettings()) for seed in (1, 2)]
    store = Store(tmp_path)
    for job in jobs:
        store.write(job.filename, fake_ok_record(job))
    (store.runs / "list.json").write_text("[]")
    (store.runs / "status-only.json").write_text('{"status": "ok"}')
    (store.runs / ".tmp-abc123.json").write_text(json.dumps(fake_ok_record(jobs[0]).to_dict()))
    loaded = load([tmp_path])
    assert len(loaded.frame) == 2
    assert loaded.unreadable == ["list.json", "status-only.json"]
    with pytest.warns(UserWarning) as caught:
        assert len(list(store)) == 2
    warned = " ".join(str(w.message) for w in caught)
    assert "list.json" in warned and "status-only.json" in warned and ".tmp-" not in warned


# ---------------------------------------------------------------------------------------------------------
# Duplicate work
# ---------------------------------------------------------------------------------------------------------

def test_repeated_seeds_and_sweep_values_are_one_job_each():
    t = TrainSettings()
    assert len(build_grid(["m"], ["rte"], ["vanilla"], [1, 1, 2], t)) == 2
    assert len(build_grid(["m"], ["rte"], ["scores_dropout"], [1], t, sweeps=["scores_dropout.p=0.1,0.1"])) == 1
    assert len(build_grid(["m"], ["rte"], ["vanilla"], [1], t, sweeps=["train.lr=1e-5,1e-5,2e-5"])) == 2


def test_one_model_has_one_name(tiny_bert_dir, tmp_path, monkeypatch):
    packaged = default_model()
    assert {canonical_model(m) for m in ("minilm", packaged, packaged + "/", " minilm ")} == {"minilm"}
    monkeypatch.chdir(Path(tiny_bert_dir).parent)
    name = Path(tiny_bert_dir).name
    assert len({canonical_model(m) for m in (name, name + "/", "./" + name, "./" + name + "//")}) == 1


# ---------------------------------------------------------------------------------------------------------
# A diverged model is a failed run, never an ok record
# ---------------------------------------------------------------------------------------------------------

def test_diverged_model_is_recorded_as_failed(tiny_bert_dir, glue_dir):
    from suite.runner import run_one

    t = TrainSettings(epochs=1, batch_size=8, max_train_samples=8, lr=1e10, train_eval_samples=4, stats_batches=0)
    rec = run_one(RunConfig(tiny_bert_dir, "rte", "vanilla", {}, 1, t), glue_dir, device="cpu", quiet=True)
    assert rec.status == "failed" and "NonFiniteLoss" in rec.error, rec.error


# ---------------------------------------------------------------------------------------------------------
# SIGTERM on the sequential executor, and two grids into one folder
# ---------------------------------------------------------------------------------------------------------

def _cli_process(argv: list[str], **popen) -> subprocess.Popen:
    code = f"import sys, executor_faults; from suite import cli; sys.exit(cli.main({argv!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or sys.platform == "win32", reason="POSIX signals and locks")
def test_second_grid_skips_claimed_jobs_and_sigterm_exits_143(tiny_bert_dir, glue_dir, tmp_path):
    """Grid A (sequential, the default) hangs inside its first run. Grid B, the same command into the same folder,
    skips both jobs A has claimed instead of training them a second time. SIGTERM then stops A with exit 143 and
    records nothing for the interrupted run."""
    marker, out = tmp_path / "hangs.attempts", tmp_path / "out"
    argv = ["run", "--methods", "test_hangs", "--tasks", "rte", "--seeds", "1,2", "--model", tiny_bert_dir,
            "--data-dir", glue_dir, "--epochs", "1", "--out", str(out), "--quiet",
            "--set", f"test_hangs.marker={marker}"]
    first = _cli_process(argv)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():  # A is inside its first run
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else ""
            time.sleep(0.2)
        second = _cli_process(argv, stdout=subprocess.PIPE)
        try:
            _, second_err = second.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                second.kill()
        assert second.returncode == 0, second_err
        assert "2 run(s) are being run by another grid" in second_err, second_err
        assert len(marker.read_text().splitlines()) == 1  # B started neither job
        first.send_signal(signal.SIGTERM)
        rc = first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert rc == EXIT_TERMINATED
    assert "terminated: finished records are kept" in first.stderr.read()
    assert not list((out / "runs").glob("*.json"))
    assert len(marker.read_text().splitlines()) == 1  # A did not go on to its second job


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX record locks")
def test_claims_are_exclusive_between_processes_and_die_with_their_holder(tmp_path):
    jobs = [RunConfig("m", "rte", "vanilla", {}, seed, TrainSettings()) for seed in (1, 2, 3)]
    code = ("import sys, time, types; from suite.store import Store\n"  # light imports: jobs by hash only
            "jobs = [types.SimpleNamespace(hash=h) for h in sys.argv[2:]]\n"
            "claims = Store(sys.argv[1]).claims(); mine, _ = claims.claim(jobs); print(len(mine), flush=True)\n"
            "time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), *(j.hash for j in jobs[:2])],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "2"
        with Store(tmp_path).claims() as claims:
            mine, elsewhere = claims.claim(jobs)
        assert mine == jobs[2:] and elsewhere == jobs[:2]
    finally:
        holder.kill()
        holder.wait()
    with Store(tmp_path).claims() as claims:  # the holder is gone (killed, not closed): its claims went with it
        assert claims.claim(jobs) == (jobs, [])
