"""Gradient accumulation, early stopping on the dev score, the epoch a run ends with, per-method training sweeps."""
import dataclasses

import pytest
import torch

from suite.api.errors import HyperParameterError
from suite.api.tasks import get_task
from suite.grid.plan import build_grid
from suite.run.models import build_method
from suite.run.runner import run_one
from suite.run.settings import RunConfig, TrainSettings
from suite.run.training import EpochSelection, build_context
from suite.testing import tiny_model


def _batch(ids: torch.Tensor, labels: torch.Tensor) -> dict:
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def test_accumulated_gradient_equals_the_full_batch_gradient():
    """Two half batches accumulated (loss / 2 each) give the gradient of the whole batch, computed directly."""
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(5, 30, (8, 10), generator=g), torch.randint(0, 2, (8,), generator=g)

    def gradients(halves: bool) -> dict[str, torch.Tensor]:
        model = tiny_model("bert", seed=0)
        method = build_method(RunConfig("m", "rte", "vanilla", {"p": 0.0}, 1, TrainSettings()))
        method.attach(model)
        ctx = build_context(model, method, TrainSettings(grad_clip=0.0), 10, torch.device("cpu"), None)
        ctx.group_end = False  # no optimizer step: look at the gradients it would take
        parts = [slice(0, 4), slice(4, 8)] if halves else [slice(0, 8)]
        ctx.group_size = len(parts)
        for part in parts:
            ctx.apply(ctx.loss(_batch(ids[part], labels[part])))
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    full, accumulated = gradients(False), gradients(True)
    assert full.keys() == accumulated.keys()
    for name in full:
        torch.testing.assert_close(accumulated[name], full[name], rtol=1e-4, atol=1e-6)


@pytest.fixture
def rte_job(tiny_bert_dir):
    def make(**train):
        t = TrainSettings(batch_size=4, max_length=32, train_eval_samples=0, stats_batches=0, **train)
        return RunConfig(tiny_bert_dir, "rte", "vanilla", {"p": 0.1}, 1, t)
    return make


def test_accumulation_takes_one_optimizer_step_per_group(rte_job, glue_dir):
    """24 train rows, batch 4: 6 batches per epoch; accumulating 4 gives 2 optimizer steps (4 + a group of 2)."""
    rec = run_one(rte_job(epochs=2, grad_accumulation=4), glue_dir, device="cpu", quiet=True)
    assert rec.ok, rec.error
    assert rec.timing.steps == 4 and rec.config["train"]["grad_accumulation"] == 4


def test_early_stopping_ends_a_run_that_stopped_improving(rte_job, glue_dir):
    """At a learning rate too small to change a prediction, the tuning score never improves after epoch 1."""
    rec = run_one(rte_job(epochs=6, lr=1e-12, early_stopping_patience=2, holdout=4), glue_dir, device="cpu",
                  quiet=True)
    assert rec.ok, rec.error
    assert [h.epoch for h in rec.history] == [1, 2, 3]
    assert rec.final == rec.history[-1].dev


def test_select_best_epoch_restores_its_weights():
    spec = get_task("rte")
    t = TrainSettings(epochs=4, select_epoch="best")
    model = torch.nn.Linear(2, 1)
    selection = EpochSelection(t, spec)
    weights = {}
    for epoch, score in enumerate([0.5, 0.8, 0.6, 0.7], start=1):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        weights[epoch] = model.weight.clone()
        assert not selection.update(epoch, score, model, {"epoch": epoch})
    chosen, evals = selection.finish(model, 4, {"epoch": 4})
    assert chosen == 2 and evals == {"epoch": 2} and torch.equal(model.weight, weights[2])


def test_select_best_respects_lower_is_better_and_last_is_the_default():
    spec = dataclasses.replace(get_task("rte"), higher_is_better=False)
    selection = EpochSelection(TrainSettings(epochs=3, select_epoch="best"), spec)
    model = torch.nn.Linear(1, 1)
    for epoch, score in enumerate([0.3, 0.1, 0.2], start=1):
        selection.update(epoch, score, model, epoch)
    assert selection.finish(model, 3, 3)[0] == 2
    last = EpochSelection(TrainSettings(epochs=3), get_task("rte"))
    for epoch, score in enumerate([0.9, 0.1, 0.2], start=1):
        last.update(epoch, score, model, epoch)
    assert last.finish(model, 3, 3) == (3, 3)


def test_per_method_learning_rate_sweep():
    jobs = build_grid(["minilm"], ["rte"], ["vanilla", "scores_dropout"], [1], TrainSettings(),
                      sweeps=["train.lr=1e-5,2e-5", "scores_dropout:train.lr=3e-5,4e-5,5e-5"])
    lrs = {m: sorted(j.train.lr for j in jobs if j.method == m) for m in ("vanilla", "scores_dropout")}
    assert lrs == {"vanilla": [1e-5, 2e-5], "scores_dropout": [3e-5, 4e-5, 5e-5]}
    # a scoped setting for a method this grid does not run changes nothing (a study's also: grids inherit it)
    assert build_grid(["minilm"], ["rte"], ["vanilla"], [1], TrainSettings(),
                      sweeps=["train.lr=1e-5,2e-5", "scores_dropout:train.lr=3e-5,4e-5,5e-5"]) == \
        [j for j in jobs if j.method == "vanilla"]


@pytest.mark.parametrize("sweeps, sets, message", [
    ([], ["vanilla:scores_dropout.p=0.2"], "only training settings take a method scope"),
    ([], ["train.grad_accumulation=0"], "grad_accumulation=0 is impossible: it must be >= 1"),
    ([], ["train.select_epoch=first"], "choose last, best"),
])
def test_bad_training_options(sweeps, sets, message):
    with pytest.raises(HyperParameterError, match=None) as info:
        build_grid(["minilm"], ["rte"], ["vanilla", "scores_dropout"], [1], TrainSettings(), sets=sets, sweeps=sweeps)
    assert message in str(info.value)


def test_accumulation_is_refused_for_a_method_that_steps_itself():
    with pytest.raises(HyperParameterError, match="replaces the training step"):
        build_grid(["minilm"], ["rte"], ["attendout"], [1], TrainSettings(grad_accumulation=2))


def test_new_settings_at_their_defaults_keep_existing_hashes():
    job = RunConfig("minilm", "rte", "vanilla", {"p": 0.1}, 1, TrainSettings())
    changed = dataclasses.replace(job, train=dataclasses.replace(job.train, grad_accumulation=2))
    old_style = job.to_dict()
    from suite.run.settings import unhashed_at_default

    for key in unhashed_at_default():  # settings added after records existed, all at their defaults here
        del old_style["train"][key]
    import hashlib
    import json

    assert job.hash == hashlib.sha256(json.dumps(old_style, sort_keys=True, default=str).encode()).hexdigest()[:12]
    assert changed.hash != job.hash
