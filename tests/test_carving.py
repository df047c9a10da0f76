"""Carving by sentence (train.carve=sentence, suite.run.carving): on a train set that holds the phrases of its own
sentences as rows (SST-2), splits carved row by row leak (most carved rows are phrases of rows left to train on);
carved by sentence, no carved row is a copy or a run of words of a training row, as with dev. Rows with equal texts
land together on every task; the quick-preset study's row carving keeps its rows and its records' names."""
import dataclasses
import hashlib
import json

import numpy as np
import pytest

from suite.api.errors import DataError
from suite.api.tasks import get_task
from suite.run.carving import TRAIN_SIDE, carve_groups, row_groups, sentence_groups
from suite.run.draws import check_holdouts, draw_train
from suite.run.settings import RunConfig, TrainSettings, unhashed_at_default

WORDS = [f"w{i}" for i in range(60)]


def phrase_set(sentences: int = 300, seed: int = 0) -> tuple[list[str], list[int]]:
    """A small SST-2-like train set: sentences of 6-14 words (a few common words shared between them), each with some
    of its phrases (runs of words) as rows of their own, phrases that several sentences share once, and a few rows
    repeated; a row's label is its sentence's, flipped for one phrase in five."""
    rng = np.random.default_rng(seed)
    rows: dict[str, int] = {}
    for s in range(sentences):
        words = [f"s{s}"] + list(rng.choice(WORDS, size=rng.integers(5, 14)))  # s{s}: each sentence is maximal
        rng.shuffle(words)
        label = int(rng.random() < 0.55)
        rows.setdefault(" ".join(words), label)
        for _ in range(rng.integers(3, 12)):
            a = int(rng.integers(0, len(words)))
            b = int(rng.integers(a + 1, len(words) + 1))
            rows.setdefault(" ".join(words[a:b]), label ^ int(rng.random() < 0.2))
    texts, labels = list(rows), list(rows.values())
    repeated = rng.choice(len(texts), size=20, replace=False)
    return texts + [texts[i] for i in repeated], labels + [labels[i] for i in repeated]


def contained(carved: list[int], left: list[int], texts: list[str]) -> float:
    """The share of carved rows that are a run of whole words of (or equal to) a row left to train on."""
    pool = "\x00".join(f" {texts[i]} " for i in left)
    return sum(f" {texts[i]} " in pool for i in carved) / len(carved)


TEXTS, LABELS = phrase_set()
GROUPS = row_groups([(t,) for t in TEXTS], phrases=True)


def _draw(groups=GROUPS, **train):
    return draw_train(LABELS, TrainSettings(**{"max_train_samples": None, **train}), 1, True, groups)


def test_carved_by_row_most_carved_rows_are_phrases_of_training_rows_and_by_sentence_none_are():
    """The leak the audit measured on SST-2, in miniature, and its repair: the held-out test split and the tuning
    split carved by sentence hold no row that is a run of words of a row the run can train on (dev's level on SST-2:
    2 of 872), where carved by row most of them are."""
    n = len(TEXTS)
    by_row = _draw(test_holdout=0.15, holdout=0.05, carve="row")
    assert contained(by_row.test, by_row.train, TEXTS) > 0.5 and contained(by_row.tune, by_row.train, TEXTS) > 0.5
    by_sentence = _draw(test_holdout=0.15, holdout=0.05)
    assert len(by_sentence.test) == round(0.15 * n) and len(by_sentence.tune) == round(0.05 * n)
    assert contained(by_sentence.test, by_sentence.train, TEXTS) == 0
    assert contained(by_sentence.tune, by_sentence.train, TEXTS) == 0
    assert contained(by_sentence.test, by_sentence.train + by_sentence.tune, TEXTS) == 0
    assert by_sentence.facts()["carve"] == "sentence" and by_row.facts()["carve"] == "row"


def test_a_sentence_takes_the_phrases_only_it_holds_and_shared_phrases_stay_on_the_training_side():
    texts = ["a b c d", "x b c y", "b c", "a b", "c y", "b", "a b c d", "q"]
    groups = row_groups([(t,) for t in texts], phrases=True).tolist()
    assert groups[3] == groups[0] == groups[6]  # "a b" only in "a b c d", which appears twice
    assert groups[4] == groups[1] and groups[0] != groups[1]
    assert groups[2] == groups[5] == TRAIN_SIDE  # in both sentences: it cannot join both
    assert groups[7] not in groups[:7]  # a row that is in no other: a group of its own
    # partial words are not phrases: "b" is not in "bb c"
    assert row_groups([("bb c",), ("b",)], phrases=True).tolist() == [0, 1]


def test_rows_with_equal_texts_land_together_on_pair_tasks_too():
    pairs = [("s", "t"), ("s", "u"), ("s", "t"), ("v", "t")]
    groups = row_groups(pairs, phrases=False).tolist()
    assert groups[0] == groups[2] and len({groups[0], groups[1], groups[3]}) == 3  # shared sentences stay apart
    rest, carved = carve_groups([0, 1, 0, 1], np.asarray(groups), 2, 0, stratify=False)
    assert sorted(rest + carved) == [0, 1, 2, 3] and (0 in carved) == (2 in carved)


def test_whole_groups_exact_sizes_stratified_and_the_same_for_every_run_seed():
    draws = [draw_train(LABELS, TrainSettings(test_holdout=300, holdout=100, max_train_samples=n), seed, True, GROUPS)
             for seed in (1, 2) for n in (200, 400)]
    test, tune = set(draws[0].test), set(draws[0].tune)
    assert all(set(d.test) == test and set(d.tune) == tune for d in draws)
    assert len(test) == 300 and len(tune) == 100 and all(not (test | tune) & set(d.train) for d in draws)
    for carved in (test, tune):  # a group is wholly in a carved split or wholly out of it
        inside = {GROUPS[i] for i in carved}
        assert TRAIN_SIDE not in inside
        assert all((i in carved) == (GROUPS[i] in inside) for i in range(len(TEXTS)))
    share = np.mean(LABELS)
    assert abs(sum(LABELS[i] for i in test) - 300 * share) <= 1  # the train split's label shares, to the row
    assert set(draws[0].train) < set(draws[1].train)  # nested subsets, as with row carving


def test_a_size_no_whole_groups_can_make_stops_before_training():
    groups = np.repeat(np.arange(10), 3)  # ten groups of three rows
    with pytest.raises(DataError, match="SST-2: train.holdout: cannot carve a tuning split of exactly 4 rows"):
        check_holdouts([0, 1, 0] * 10, [TrainSettings(holdout=4)], True, "SST-2", groups)
    check_holdouts([0, 1, 0] * 10, [TrainSettings(holdout=6)], True, "SST-2", groups)
    check_holdouts([0, 1, 0] * 10, [TrainSettings(holdout=4, carve="row")], True, "SST-2", groups)


def test_the_published_studys_row_carving_keeps_its_names_and_carving_is_out_of_the_hash_without_a_split():
    """A record written before train.carve existed (no `carve` key) ran row carving: it reads back as `row` and keeps
    its hash; today's default carves by sentence, a new job where a split is carved and the same job where none is."""
    old = RunConfig("minilm", "sst2", "vanilla", {"p": 0.1}, 1, TrainSettings(holdout=500, carve="row"))
    written = old.to_dict()
    del written["train"]["carve"]
    for name in unhashed_at_default():
        written["train"].pop(name, None)
    written["train"] |= {"holdout": 500}
    assert old.hash == hashlib.sha256(json.dumps(written, sort_keys=True, default=str).encode()).hexdigest()[:12]
    restored = RunConfig.from_dict(json.loads(json.dumps(written)))
    assert restored.train.carve == "row" and restored.hash == old.hash
    assert dataclasses.replace(old, train=TrainSettings(holdout=500)).hash != old.hash
    plain = RunConfig("minilm", "sst2", "vanilla", {"p": 0.1}, 1, TrainSettings())
    assert "carve" in unhashed_at_default()
    assert dataclasses.replace(plain, train=TrainSettings(carve="row")).hash == plain.hash


def test_a_tasks_groups_are_computed_once_and_kept_in_the_cache(tmp_path, monkeypatch):
    import suite.run.carving as carving

    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(carving, "_MEMO", {})
    columns = {"sentence": TEXTS, "label": LABELS}
    first = sentence_groups(get_task("sst2"), columns)
    assert np.array_equal(first, GROUPS) and len(list(tmp_path.glob("groups-*.npz"))) == 1
    monkeypatch.setattr(carving, "_MEMO", {})
    monkeypatch.setattr(carving, "row_groups", lambda *a: pytest.fail("computed again"))
    assert np.array_equal(sentence_groups(get_task("sst2"), columns), GROUPS)  # read back from the disk cache


def test_old_and_new_records_without_a_carved_split_are_one_configuration_to_the_report():
    """Without train.holdout or train.test_holdout the carving changes nothing: a record written today (carve
    `sentence`) and one written before the setting (no carve) read back alike, so the report pools their seeds."""
    from suite.run.settings import with_added_defaults

    today = RunConfig("minilm", "rte", "vanilla", {"p": 0.1}, 2, TrainSettings()).to_dict()["train"]
    before = {k: v for k, v in today.items() if k != "carve"}
    assert with_added_defaults("vanilla", {}, today)[1] == with_added_defaults("vanilla", {}, before)[1]
    carved = RunConfig("minilm", "rte", "vanilla", {"p": 0.1}, 2, TrainSettings(holdout=6)).to_dict()["train"]
    assert with_added_defaults("vanilla", {}, carved)[1]["carve"] == "sentence"
    assert with_added_defaults("vanilla", {}, {k: v for k, v in carved.items() if k != "carve"})[1]["carve"] == "row"
