"""Sampled randomness: the training subset is drawn per run seed unless train.data_seed fixes it, subsets of one draw
are nested, the tuning split is seeded, stratified and never trained on; the committed records keep their hashes."""
import dataclasses
import hashlib
import json

import numpy as np
import pytest

from suite.api.errors import DataError, HyperParameterError
from suite.commands import main
from suite.run.data import seeded_subset
from suite.run.draws import draw_train, holdout_size, nested_subset, tuning_split
from suite.run.settings import RunConfig, TrainSettings

LABELS = [0] * 700 + [1] * 300  # a 70/30 train split


def _draw(run_seed=1, **train):
    return draw_train(LABELS, TrainSettings(**train), run_seed, classification=True)


def test_subsets_of_one_draw_are_nested_and_draws_differ():
    sizes = [250, 500, 1000, 2000]
    for seed in (0, 1, 7):
        subsets = [set(nested_subset(5000, n, seed)) for n in sizes]
        assert [len(s) for s in subsets] == sizes
        assert all(small < large for small, large in zip(subsets, subsets[1:]))
    assert set(nested_subset(5000, 250, 1)) != set(nested_subset(5000, 250, 2))


def test_legacy_draw_is_the_old_one_and_is_not_nested():
    """train.subset_draw=legacy reproduces the committed records' rows (seeded_subset of the whole train split)."""
    old = _draw(max_train_samples=200, data_seed=0, subset_draw="legacy").train
    assert old == seeded_subset(len(LABELS), 200, 0)
    assert not set(old) <= set(_draw(max_train_samples=400, data_seed=0, subset_draw="legacy").train)


def test_the_draw_follows_the_run_seed_unless_fixed():
    per_seed = {s: _draw(s, max_train_samples=100) for s in (1, 2)}
    assert per_seed[1].train != per_seed[2].train and (per_seed[1].seed, per_seed[2].seed) == (1, 2)
    fixed = {s: _draw(s, max_train_samples=100, data_seed=5) for s in (1, 2)}
    assert fixed[1].train == fixed[2].train and fixed[1].seed == 5
    facts = per_seed[2].facts()
    assert facts["subset_draw"] == "nested" and facts["data_seed"] == 2 and facts["train_rows"] == 100


def test_tuning_split_is_disjoint_stratified_seeded_and_the_same_for_every_draw_and_size():
    draws = [_draw(s, max_train_samples=n, holdout=100, holdout_seed=3) for s in (1, 2) for n in (200, 400)]
    tune = set(draws[0].tune)
    assert len(tune) == 100 and all(set(d.tune) == tune for d in draws)
    assert all(not tune & set(d.train) for d in draws)
    assert sum(LABELS[i] for i in tune) == 30  # 70/30, as the whole split
    assert set(_draw(1, holdout=100, holdout_seed=4).tune) != tune
    # nested within a draw with the tuning split carved out
    assert set(draws[0].train) < set(draws[1].train)
    assert draws[0].facts()["tune_rows"] == 100


def test_holdout_sizes_and_impossible_ones():
    assert holdout_size(None, 1000) == 0 and holdout_size(0.1, 1000) == 100 and holdout_size(37, 1000) == 37
    with pytest.raises(DataError, match="must leave rows to train on"):
        holdout_size(1000, 1000)
    with pytest.raises(DataError, match="stratified tuning split"):
        tuning_split([0] * 10 + [1], 3, 0, stratify=True)  # one example of class 1 cannot be split
    assert tuning_split(list(np.linspace(0, 5, 50)), 10, 0, stratify=False)[1]  # regression: not stratified
    for bad in (0, -0.5, 12.5):
        with pytest.raises(HyperParameterError, match="train.holdout"):
            TrainSettings(holdout=bad).validate()


@pytest.mark.parametrize("flags", [["--early-stopping", "2"], ["--set", "train.select_epoch=best"]])
def test_epoch_choice_without_a_tuning_split_exits_2_before_training(flags, capsys):
    assert main(["run", "--methods", "vanilla", "--tasks", "rte", "--dry-run", *flags]) == 2
    err = capsys.readouterr().err
    assert "never by dev" in err and "train.holdout=0.1" in err
    TrainSettings(early_stopping_patience=2, select_epoch="best", holdout=0.1).validate()


def test_legacy_settings_keep_the_old_hash_and_new_defaults_change_it():
    """An old record (no subset_draw, holdout, holdout_seed; data_seed 0) and a job asking for data seed 0's legacy
    draw hash alike; today's default (per-seed nested draw) is another job."""
    legacy = RunConfig("minilm", "rte", "vanilla", {"p": 0.1}, 1, TrainSettings(data_seed=0, subset_draw="legacy"))
    old_style = legacy.to_dict()
    for name in ("subset_draw", "holdout", "holdout_seed"):
        del old_style["train"][name]
    from suite.run.settings import unhashed_at_default

    for name in unhashed_at_default():
        old_style["train"].pop(name, None)
    assert legacy.hash == hashlib.sha256(json.dumps(old_style, sort_keys=True, default=str).encode()).hexdigest()[:12]
    restored = RunConfig.from_dict(json.loads(json.dumps(old_style)))
    assert restored.train.subset_draw == "legacy" and restored.hash == legacy.hash
    assert dataclasses.replace(legacy, train=TrainSettings()).hash != legacy.hash
    assert dataclasses.replace(legacy, train=TrainSettings(data_seed=0)).hash != legacy.hash  # nested draw


def test_a_run_records_its_draw_and_scores_its_tuning_split(tiny_bert_dir, glue_dir):
    from suite.run.runner import TokenizedCache, run_one

    t = TrainSettings(epochs=2, batch_size=8, max_length=32, train_eval_samples=0, stats_batches=0,
                      analyses="none", holdout=6)
    rec = run_one(RunConfig(tiny_bert_dir, "rte", "vanilla", {"p": 0.1}, 3, t), glue_dir, device="cpu", quiet=True,
                  cache=TokenizedCache())
    assert rec.ok, rec.error
    assert rec.data.train == 18 and rec.data.tune == 6
    assert rec.data.draw.data_seed == 3 and rec.data.draw.tune_rows == 6
    assert all(h.tune is not None and "score" in h.tune.values for h in rec.history)
    assert rec.tune == rec.history[-1].tune and rec.final == rec.history[-1].dev


def test_an_impossible_tuning_split_stops_the_grid_before_training(tiny_bert_dir, glue_dir, tmp_path, capsys):
    from tests.conftest import run_cli

    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, "--set", "train.holdout=24") == 2  # RTE has 24 train rows
    assert "RTE: train.holdout=24 gives a tuning split of 24 of the 24 training rows" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.json"))
