"""How much the delete-one-row jackknife understates the example-level se on SST-2's held-out test split, whose rows
share sources (a sentence with its phrases): the figures docs/statistics.md ("Held-out splits whose rows share a
source") quotes.

The split is the one runs get (`train.test_holdout=10000`, carved by sentence from ../shared/data/glue with the
runner's own code). The predictions are real, from two bag-of-words classifiers (scikit-learn's logistic regression on
word uni- and bigrams, and on unigrams), each trained at every seed on a seeded draw of 20,000 of the rows left to
train on, so that seeds pair as a study's do. The example se of their paired difference is computed by the report's
own code (`suite.stats.examples.example_variance`) twice, with the rows' groups (by group) and without (by row), on
the held-out split and, for comparison, on dev (no groups there). It also prints the split's make-up and the labels'
intra-class correlation within groups (one-way ANOVA estimator over groups of unequal size).

    OMP_NUM_THREADS=1 nice -n 10 python -m lab.stats.heldout_se [GLUE_DIR]   (about a minute on 2 cores)
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from suite.api.tasks import get_task
from suite.run.carving import sentence_groups
from suite.run.data import load_splits
from suite.run.draws import Holdouts, carve, heldout_makeup
from suite.stats.examples import example_variance

ROWS = 10_000       # the held-out split, as docs/results.md plans it for SST-2
TRAIN_ROWS = 20_000
SEEDS = (1, 2, 3, 4, 5)


def label_icc(labels: np.ndarray, groups: np.ndarray) -> float:
    """The one-way ANOVA intra-class correlation of the labels within groups (unequal sizes: n0 of Searle)."""
    _, of_row, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    k, n = len(sizes), len(labels)
    means = np.bincount(of_row, weights=labels) / sizes
    between = np.sum(sizes * (means - labels.mean()) ** 2) / (k - 1)
    within = np.sum((labels - means[of_row]) ** 2) / (n - k)
    n0 = (n - np.sum(sizes ** 2) / n) / (k - 1)
    return float((between - within) / (between + (n0 - 1) * within))


def main(argv=None) -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    args = sys.argv[1:] if argv is None else argv
    data_dir = args[0] if args else "../shared/data/glue"
    started = time.time()
    print(f"# python -m lab.stats.heldout_se {data_dir}")
    print(f"# machine: {os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.2f} at the start")
    spec = get_task("sst2")
    splits = load_splits(spec, data_dir)
    train, dev = splits[spec.train_split], splits[spec.eval_splits[""]]
    groups = sentence_groups(spec, train)
    rest, _, test = carve(train["label"], Holdouts(ROWS, None, 0, "sentence"), True, groups)
    held = {k: [v[i] for i in test] for k, v in train.items()}
    makeup = heldout_makeup(spec, held, dev, groups[test].tolist())
    icc = label_icc(np.asarray(held["label"], dtype=float), groups[test])
    print(f"held-out split: {len(test):,} rows from {makeup['heldout_groups']:,} sentence groups; median words "
          f"{makeup['heldout_median_words']:g} (dev: {makeup['dev_median_words']:g}, {len(dev['label'])} rows); "
          f"label intra-class correlation within groups {icc:.2f}")
    texts = train["sentence"]
    models = {"a": dict(ngram_range=(1, 2)), "b": dict(ngram_range=(1, 1))}
    runs = {name: {"heldout": {}, "dev": {}} for name in models}
    for seed in SEEDS:
        rows = np.random.default_rng(seed).choice(rest, size=TRAIN_ROWS, replace=False)
        for name, features in models.items():
            vectorizer = TfidfVectorizer(**features, min_df=2)
            x = vectorizer.fit_transform([texts[i] for i in rows])
            model = LogisticRegression(C=4.0, max_iter=2000).fit(x, [train["label"][i] for i in rows])
            for split, columns, of_row in (("heldout", held, groups[test]), ("dev", dev, None)):
                logits = model.predict_log_proba(vectorizer.transform(columns["sentence"])).astype(np.float32)
                arrays = {"index": np.arange(len(logits)), "label": np.asarray(columns["label"]), "logits": logits}
                runs[name][split][seed] = {"": arrays | ({"group": np.asarray(of_row)} if of_row is not None else {})}
    print("split | example se of the paired difference, by row | by group | ratio | shared part by row | by group "
          "| ratio | accuracy a, b (mean over seeds)")
    for split in ("heldout", "dev"):
        a, b = runs["a"][split], runs["b"][split]
        _compare(split, a, b)
        _compare(f"{split}, accuracy of a alone", a, {s: _always_wrong(r) for s, r in a.items()})
        positive = {s: {"": r[""] | {"logits": np.tile(np.float32([0, 1]), (len(r[""]["label"]), 1))}}
                    for s, r in a.items()}   # says 1 every time: its accuracy is the share of positive labels
        _compare(f"{split}, share of positive labels", positive, {s: _always_wrong(r) for s, r in a.items()})
    print(f"# {len(SEEDS)} seeds; {time.time() - started:.0f} s")


def _always_wrong(run: dict) -> dict:
    """A run that gets every example wrong: its accuracy is 0 on every resample, so a's difference to it is a's
    accuracy alone."""
    arrays = run[""]
    wrong = np.eye(2, dtype=np.float32)[1 - arrays["label"]]
    return {"": arrays | {"logits": wrong}}


def _compare(split: str, a: dict, b: dict) -> None:
    """One line: the example se of the mean paired difference a - b by row and by group, and its shared part."""
    plain = [{s: {"": {k: v for k, v in r[""].items() if k != "group"}} for s, r in run.items()} for run in (a, b)]
    (row_total, row_shared), (group_total, group_shared) = example_variance("sst2", *plain), \
        example_variance("sst2", a, b)
    accuracy = [np.mean([np.mean(r[""]["logits"].argmax(1) == r[""]["label"]) for r in run.values()])
                for run in (a, b)]
    print(" | ".join([split, f"{math.sqrt(row_total):.3f}", f"{math.sqrt(group_total):.3f}",
                      f"{math.sqrt(group_total / row_total):.2f}x", f"{math.sqrt(row_shared):.3f}",
                      f"{math.sqrt(group_shared):.3f}", f"{math.sqrt(group_shared / row_shared):.2f}x",
                      f"{100 * accuracy[0]:.1f}, {100 * accuracy[1]:.1f}"]))


if __name__ == "__main__":
    main()
