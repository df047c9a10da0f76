"""The training step itself: fp16 loss scaling (unscale before clipping, skip overflowing steps) and the precision a
run records."""
import torch

from suite.commands import main
from suite.grid.store import Store
from suite.run.training import StepContext


class _NoMethod:
    def aux_loss(self, model):
        return None


def _ctx(model, scaler, grad_clip=1.0):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return StepContext(model, _NoMethod(), opt, sched, torch.device("cpu"), torch.float16, grad_clip, scaler=scaler)


def test_fp16_step_unscales_before_clipping_and_skips_overflow():
    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    ctx = _ctx(model, scaler)
    x = torch.full((1, 4), 10.0)
    ctx.apply(model(x).sum())  # gradient (10, 10, 10, 10): norm 20, clipped to 1, SGD lr 1
    assert torch.allclose(model.weight, torch.full((1, 4), -0.5))  # clipped as unscaled, not 65536x too small
    assert scaler.get_scale() == 2.0 ** 16

    before = model.weight.detach().clone()
    ctx.apply(model(torch.full((1, 4), float("inf"))).sum())  # overflowing gradients: the step is skipped
    assert torch.equal(model.weight, before)
    assert scaler.get_scale() == 2.0 ** 15


def test_fp16_run_records_loss_scaling(tiny_bert_dir, glue_dir, tmp_path):
    assert main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--model", tiny_bert_dir,
                 "--data-dir", glue_dir, "--out", str(tmp_path), "--epochs", "1", "--batch-size", "8", "--quiet",
                 "--set", "train.precision=fp16"]) == 0
    ((_, rec),) = list(Store(tmp_path))
    assert rec.ok and rec.timing.precision == "fp16 autocast, loss scaling"
    assert rec.timing.step_mode.to_json() == {"mode": "eager", "reason": "CUDA graphs need a CUDA device"}
    assert torch.isfinite(torch.tensor(rec.history[0].train_loss))


def test_git_commit_is_dirty_only_when_the_code_differs(tmp_path):
    """Records written into the checkout (results/, README), committed or not, and the report's code leave the code
    version as it was; a changed or new module makes it dirty, and committing it makes a new version."""
    import subprocess

    from suite.run.device import git_commit

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "a.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("readme\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    (tmp_path / "README.md").write_text("edited\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text("{}")
    assert git_commit(tmp_path) == sha
    git("add", ".")  # records and the report's code committed mid-study: still the same code version
    (tmp_path / "suite" / "report").mkdir()
    (tmp_path / "suite" / "report" / "table.py").write_text("t = 1\n")
    assert git_commit(tmp_path) == sha
    assert git_commit(tmp_path, excluded=()) == sha + "+dirty"   # the report's own version counts its code
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "records")
    assert git_commit(tmp_path) == sha
    report_sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    assert git_commit(tmp_path, excluded=()) == report_sha != sha
    (tmp_path / "suite" / "b.py").write_text("y = 2\n")
    assert git_commit(tmp_path) == sha + "+dirty"
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "code")
    code_sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    assert git_commit(tmp_path) == code_sha != sha
    sha = code_sha
    (tmp_path / "suite" / "b.py").unlink()
    (tmp_path / "suite" / "a.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == sha + "+dirty"
    assert git_commit(tmp_path / "suite") == sha + "+dirty"  # from the package's folder, as a run calls it
    (tmp_path / "suite" / "a.py").write_text("x = 1\n")
    (tmp_path / "suite" / "b.py").write_text("y = 2\n")
    assert git_commit(tmp_path / "suite") == sha
    assert git_commit(tmp_path / "missing") is None


def test_git_commit_names_no_version_it_cannot_know(tmp_path):
    """A repository without commits has no version (not the word 'HEAD'); a shallow clone whose history does not
    reach before the code's last change names its oldest commit with '+shallow', a deep enough one the true commit."""
    import subprocess

    from suite.run.device import git_commit

    def git(where, *args):
        return subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    src = tmp_path / "src"
    (src / "suite").mkdir(parents=True)
    git(src, "init", "-q")
    assert git_commit(src) is None
    for message, code in (("first", "x = 1"), ("code", "x = 2"), ("docs", "x = 2")):
        (src / "suite" / "a.py").write_text(code)
        (src / f"{message}.md").write_text(message)
        git(src, "add", ".")
        git(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    code = git(src, "rev-parse", "HEAD~1")
    assert git_commit(src) == code
    # depth 2 ends at the code's commit itself: its change cannot be told from the graft's, so it is marked too
    for depth, expected in ((1, git(src, "rev-parse", "HEAD") + "+shallow"), (2, code + "+shallow"), (3, code)):
        clone = tmp_path / f"depth{depth}"
        git(tmp_path, "clone", "-q", "--depth", str(depth), f"file://{src}", str(clone))
        assert git_commit(clone) == expected


def test_git_commit_names_no_version_when_it_cannot_tell_whether_the_history_stops(tmp_path, monkeypatch):
    """Where the one question of whether the clone is shallow fails (a timeout on a loaded machine), the version is
    unknown (None), not the oldest commit without its '+shallow'."""
    import subprocess

    from suite.run import device

    src = tmp_path / "src"
    (src / "suite").mkdir(parents=True)
    (src / "suite" / "a.py").write_text("x = 1")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(src), *args], check=True, capture_output=True)
    real = device.git_output
    assert device.git_commit(src) == real(src, "rev-parse", "HEAD")   # a root commit: the question is asked
    monkeypatch.setattr(device, "git_output", lambda cwd, *args, **kw:
                        None if "--is-shallow-repository" in args else real(cwd, *args, **kw))
    assert device.git_commit(src) is None


def test_a_finished_run_leaves_no_model_behind_even_without_the_cyclic_collector(tiny_bert_dir, glue_dir):
    """DropHead's step context points back at the model (a reference cycle): with automatic garbage collection off,
    the run's model and optimizer state would otherwise survive into the next run of the process."""
    import gc

    from transformers import PreTrainedModel

    from suite.run.runner import run_one
    from suite.run.settings import RunConfig, TrainSettings

    def models_alive() -> int:
        return sum(isinstance(o, PreTrainedModel) for o in gc.get_objects())

    gc.collect()
    before = models_alive()
    gc.disable()
    try:
        t = TrainSettings(epochs=1, batch_size=8, max_train_samples=16, max_eval_samples=16, train_eval_samples=0,
                          stats_batches=0, analyses="none")
        rec = run_one(RunConfig(tiny_bert_dir, "rte", "drophead", {"p": 0.1}, 1, t), glue_dir, device="cpu", quiet=True)
        assert rec.status == "ok", rec.error
        assert models_alive() == before
    finally:
        gc.enable()
