"""The held-out test split (train.test_holdout): carved from the train split first, by a fixed seed, so every run of a
task is scored on the same rows; disjoint from the tuning split and every training subset; stratified; scored at the
end of training with its predictions kept; the report scores on it and keeps dev beside; records made without it
keep their rows and hashes; impossible ones exit 2 before anything trains."""
import dataclasses
import hashlib
import json

import pytest

from suite.api.errors import DataError, HyperParameterError
from suite.api.tasks import get_task
from suite.run.draws import check_heldout_task, check_holdouts, draw_train, holdout_size, nested_subset, tuning_split
from suite.run.settings import RunConfig, TrainSettings

LABELS = [0] * 700 + [1] * 300  # a 70/30 train split


def _draw(run_seed=1, **train):
    return draw_train(LABELS, TrainSettings(**train), run_seed, classification=True)


def test_the_held_out_split_is_the_same_rows_for_every_seed_draw_size_and_tuning_split():
    draws = [_draw(seed, test_holdout=200, max_train_samples=n, holdout=h, holdout_seed=hs, data_seed=ds)
             for seed in (1, 2, 7) for n in (100, 300) for h, hs in ((None, 0), (50, 0), (0.1, 3)) for ds in (None, 5)]
    test = set(draws[0].test)
    assert len(test) == 200 and all(set(d.test) == test for d in draws)
    assert all(not test & set(d.tune) and not test & set(d.train) and not set(d.tune) & set(d.train) for d in draws)
    assert sum(LABELS[i] for i in test) == 60  # 70/30, as the whole split
    assert _draw(test_holdout=0.2).test == draws[0].test  # a fraction of the train split: the same 200 rows
    facts = draws[0].facts()
    assert facts["heldout_rows"] == 200 and facts["heldout_seed"] == 0 and len(facts["heldout_rows_sha"]) == 12


def test_the_tuning_split_and_subsets_stay_stratified_and_nested_beside_it():
    small, large = (_draw(1, test_holdout=200, holdout=100, holdout_seed=3, max_train_samples=n) for n in (200, 400))
    assert len(small.tune) == 100 and sum(LABELS[i] for i in small.tune) == 30
    assert small.tune == large.tune and set(small.train) < set(large.train)


def test_without_it_the_tuning_split_and_subsets_hold_the_rows_they_held_before():
    """The draw of records made before the setting existed (carved by row, as they were): the tuning split from the
    whole train split, the subset from the rest."""
    for holdout, seed in ((None, 1), (100, 2), (0.1, 3)):
        draw = _draw(seed, holdout=holdout, holdout_seed=4, max_train_samples=250, carve="row")
        rest, tune = tuning_split(LABELS, holdout_size(holdout, len(LABELS)), 4, stratify=True)
        assert draw.tune == tune and draw.test == []
        assert draw.train == [rest[i] for i in nested_subset(len(rest), 250, seed)]
        assert "heldout_rows" not in draw.facts()


def test_a_held_out_split_changes_the_rows_the_others_hold():
    """Carved first: with it, the tuning split and the subset come from the rows it leaves (so another job)."""
    with_it, without = _draw(1, test_holdout=200, holdout=100), _draw(1, holdout=100)
    assert with_it.tune != without.tune


def test_its_hash_rule_keeps_older_records_names_and_setting_it_names_another_job():
    job = RunConfig("minilm", "sst2", "vanilla", {"p": 0.1}, 1, TrainSettings())
    old_style = job.to_dict()
    del old_style["train"]["test_holdout"]
    from suite.run.settings import unhashed_at_default

    assert "test_holdout" in unhashed_at_default()
    for name in unhashed_at_default():
        old_style["train"].pop(name, None)
    assert job.hash == hashlib.sha256(json.dumps(old_style, sort_keys=True, default=str).encode()).hexdigest()[:12]
    restored = RunConfig.from_dict(json.loads(json.dumps(job.to_dict() | {"train": {
        k: v for k, v in job.to_dict()["train"].items() if k != "test_holdout"}})))
    assert restored.train.test_holdout is None and restored.hash == job.hash
    asked = dataclasses.replace(job, train=TrainSettings(test_holdout=1000))
    assert asked.hash != job.hash and RunConfig.from_dict(json.loads(json.dumps(asked.to_dict()))).hash == asked.hash


def test_impossible_held_out_splits_are_refused():
    for bad in (0, -3, -0.5, 12.5, float("nan")):
        with pytest.raises(HyperParameterError, match="train.test_holdout"):
            TrainSettings(test_holdout=bad).validate()
    with pytest.raises(DataError, match="train.test_holdout=1000 gives a held-out test split of 1000 of the 1000"):
        _draw(test_holdout=1000)
    # what is left after it must hold the tuning split and rows to train on
    with pytest.raises(DataError, match=r"train.holdout=300 .*\(800 of them are the held-out test split's\)"):
        _draw(test_holdout=800, holdout=300)
    with pytest.raises(DataError, match="SST-2: train.holdout=0.5"):
        check_holdouts(LABELS, [TrainSettings(test_holdout=0.5, holdout=0.5)], True, "SST-2")
    with pytest.raises(DataError, match="stratified held-out test split"):
        tuning_split([0] * 10 + [1], 3, 0, stratify=True, setting="test_holdout")
    check_holdouts(LABELS, [TrainSettings(test_holdout=0.4, holdout=0.4)], True, "SST-2")


def test_a_task_scored_on_several_dev_sets_is_refused():
    with pytest.raises(HyperParameterError, match="MNLI is scored on 2 dev sets"):
        check_heldout_task(get_task("mnli"), [TrainSettings(test_holdout=100)])
    check_heldout_task(get_task("mnli"), [TrainSettings()])
    check_heldout_task(get_task("cola"), [TrainSettings(test_holdout=100)])


def test_an_sst2_held_out_split_carved_by_row_is_refused():
    """SST-2's train rows are phrases of its own sentences: rows carved one by one leak into train; carved by
    sentence (the default) they do not (tests/test_carving.py)."""
    with pytest.raises(HyperParameterError, match="phrases of its own sentences.*train.carve=sentence"):
        check_heldout_task(get_task("sst2"), [TrainSettings(test_holdout=100, carve="row")])
    check_heldout_task(get_task("sst2"), [TrainSettings(test_holdout=100)])
    check_heldout_task(get_task("sst2"), [TrainSettings(holdout=500, carve="row")])  # the quick-preset study's
    check_heldout_task(get_task("cola"), [TrainSettings(test_holdout=100, carve="row")])


@pytest.mark.parametrize("flags, message", [
    (["--set", "train.test_holdout=24"], "RTE: train.test_holdout=24 gives a held-out test split of 24 of the 24"),
    (["--set", "train.test_holdout=12", "--set", "train.holdout=12"], "12 of them are the held-out test split's"),
    (["--tasks", "mnli", "--set", "train.test_holdout=6"], "MNLI is scored on 2 dev sets"),
    (["--set", "train.test_holdout=-1"], "train.test_holdout=-1.0 is impossible"),
    (["--set", "train.test_holdout=1.0"], "train.test_holdout=1 is no split: a fraction of the training rows must be "
                                          "< 1"),   # it read as one row and ran
    (["--set", "train.holdout=1"], "train.holdout=1 is no split"),
])
def test_impossible_held_out_splits_stop_the_grid_before_training(tiny_bert_dir, glue_dir, tmp_path, capsys, flags,
                                                                 message):
    from tests.conftest import run_cli

    assert run_cli(tiny_bert_dir, glue_dir, tmp_path, *flags) == 2  # RTE has 24 train rows
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.json"))


def test_a_study_declares_it_in_its_train_section(tmp_path):
    from suite.api.errors import BadInput
    from suite.grid.study import load_study

    path = tmp_path / "study.yaml"
    path.write_text("tasks: [sst2]\ntrain: {test_holdout: 10000, holdout: 2000}\n")
    assert load_study(path).train_values() == {"test_holdout": 10000, "holdout": 2000}
    path.write_text("tasks: [sst2]\ntrain: {test_holdout: true}\n")
    with pytest.raises(BadInput, match="test_holdout"):
        load_study(path)
