"""How much of a split carved from a GLUE train set is already in the rows left to train on, carved row by row
(`train.carve=row`, the published study's) and by sentence (`train.carve=sentence`), beside dev against the whole
train set: the figures docs/protocol.md ("Carving by sentence") quotes. Its output is lab/stats/split_leaks.txt.

    python -m lab.stats.split_leaks [GLUE_DIR]   (from the repository root; GLUE_DIR defaults to
                                                    ../shared/data/glue; about a minute on 2 cores)

A carved row counts as leaked, per measure, when any of its texts is
- `chars`: a substring of a text of a row left to train on (the audit's measure: "bad" is in "badly");
- `words`: a run of whole words of one (SST-2's phrases; a shared sentence counts too);
- `sentence`: equal to one (a sentence two pairs share);
- `copy`: when all of its texts equal a row left to train on (the same example twice).
Splits: the study's 500-row tuning split (train.holdout=500, seed 0) against every other train row, and a held-out
test split (SST-2 10,000 rows, as docs/results.md plans; 10% elsewhere) against every other train row; dev: against
the whole train set.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from suite.api.tasks import get_task
from suite.run.carving import TRAIN_SIDE, row_groups
from suite.run.data import load_splits
from suite.run.draws import carve
from suite.run.settings import TrainSettings

TASKS = ("cola", "sst2", "mrpc", "stsb", "rte", "wnli")  # the tasks whose train split is in the shared GLUE folder
MEASURES = ("chars", "words", "sentence", "copy")


def leaks(carved: list[tuple[str, ...]], pool: list[tuple[str, ...]]) -> dict[str, int]:
    """How many `carved` rows leak into `pool`, per measure (module docstring)."""
    chars = "\x00".join(t for row in pool for t in row)
    words = "\x00".join(f" {t} " for row in pool for t in row)
    texts, rows = {t for row in pool for t in row}, set(pool)
    return {"chars": sum(any(t in chars for t in row) for row in carved),
            "words": sum(any(f" {t} " in words for t in row) for row in carved),
            "sentence": sum(any(t in texts for t in row) for row in carved),
            "copy": sum(row in rows for row in carved)}


def mean_words(rows: list[tuple[str, ...]], keep: list[int]) -> float:
    return float(np.mean([sum(len(t.split()) for t in rows[i]) for i in keep]))


def cell(count: int, n: int) -> str:
    return f"{count} ({100 * count / n:.1f}%)"


def task_rows(name: str, glue: str) -> None:
    spec = get_task(name)
    splits = load_splits(spec, glue)
    train, dev = splits[spec.train_split], splits[next(iter(spec.eval_splits.values()))]
    rows = list(zip(*(train[f] for f in spec.text_fields)))
    start = time.perf_counter()
    groups = row_groups(rows, spec.phrase_rows)
    took = time.perf_counter() - start
    sizes = np.bincount(groups[groups != TRAIN_SIDE])
    merged = f"; joined to every sentence they are in, the largest group would hold {merged_share(rows, groups):.1%} " \
             "of the rows" if spec.phrase_rows else ""
    print(f"\n{spec.display}: {len(rows)} train rows, {len(set(rows))} distinct; sentence groups: {(sizes > 0).sum()} "
          f"(largest {sizes.max()} rows), {(groups == TRAIN_SIDE).sum()} rows on the training side (phrases of "
          f"several sentences){merged}; grouping took {took:.1f} s")
    dev_rows = list(zip(*(dev[f] for f in spec.text_fields)))
    print(f"  {'split':<44} " + " ".join(f"{m:>16}" for m in MEASURES) + "  words per row (carved / left)")
    found = leaks(dev_rows, rows)
    print(f"  {f'dev ({len(dev_rows)} rows) vs the whole train set':<44} "
          + " ".join(f"{cell(found[m], len(dev_rows)):>16}" for m in MEASURES))
    heldout = 10000 if name == "sst2" else 0.1
    for how in ("row", "sentence"):
        for label, t in ((f"tuning split, 500 rows, by {how}", TrainSettings(holdout=500, carve=how)),
                         (f"held-out test split, {heldout:g}, by {how}", TrainSettings(test_holdout=heldout,
                                                                                        carve=how))):
            rest, tune, test = carve(train["label"], t, not spec.is_regression, groups)
            carved = tune or test
            found = leaks([rows[i] for i in carved], [rows[i] for i in rest])
            print(f"  {label + f' ({len(carved)} rows)':<44} "
                  + " ".join(f"{cell(found[m], len(carved)):>16}" for m in MEASURES)
                  + f"  {mean_words(rows, carved):.1f} / {mean_words(rows, rest):.1f}")


def merged_share(rows: list[tuple[str, ...]], groups: np.ndarray) -> float:
    """The share of rows in the largest group if every phrase of several sentences (TRAIN_SIDE) joined the groups of
    all the rows it is a run of words of: the connected components of shared phrases. Found by string search, apart
    from the token index that made `groups`."""
    from bisect import bisect_right

    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    grouped = np.flatnonzero(groups != TRAIN_SIDE).tolist()
    first = {}
    edges = [(i, first.setdefault(int(groups[i]), i)) for i in grouped]  # a group: its rows joined to its first
    text = "".join(f" {rows[i][0]} \x00" for i in grouped)
    starts = np.cumsum([0] + [len(rows[i][0]) + 3 for i in grouped[:-1]]).tolist()
    for p in np.flatnonzero(groups == TRAIN_SIDE).tolist():
        needle = f" {rows[p][0]} "
        at = text.find(needle)
        while at >= 0:
            edges.append((p, grouped[bisect_right(starts, at) - 1]))
            at = text.find(needle, at + 1)
    a, b = zip(*edges)
    graph = coo_matrix((np.ones(len(a)), (a, b)), shape=(len(rows), len(rows)))
    _, component = connected_components(graph, directed=False)
    return float(np.bincount(component).max() / len(rows))


def published_tuning(glue: str) -> None:
    """The published study's SST-2 tuning split (500 rows by row, seed 0) against what its tuning runs trained on:
    the 1,000 rows of tuning seed 101's nested draw (its records' digests confirm the rows)."""
    from suite.run.draws import draw_train, fingerprint

    spec = get_task("sst2")
    train = load_splits(spec, glue)[spec.train_split]
    draw = draw_train(train["label"], TrainSettings(holdout=500, carve="row", max_train_samples=1000), 101, True)
    rows = [(t,) for t in train["sentence"]]
    found = leaks([rows[i] for i in draw.tune], [rows[i] for i in draw.train])
    print(f"\nSST-2, the published study's tuning runs (seed 101; rows digests {fingerprint(draw.tune)} tuning, "
          f"{fingerprint(draw.train)} training, as their records say): of the 500 tuning rows, "
          + ", ".join(f"{m} {cell(found[m], 500)}" for m in MEASURES) + " leak into the 1,000 rows they trained on")


def main(argv: list[str]) -> None:
    glue = argv[0] if argv else str(Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "glue")
    print(__doc__.split("\n\n")[0].replace("\n", " "))
    print(f"leaked rows per measure (chars / words / sentence / copy, module docstring); "
          f"data: {os.path.relpath(glue)}; "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}")
    for name in TASKS:
        task_rows(name, glue)
    published_tuning(glue)
    print("\nQNLI, QQP and MNLI: their train splits are not in the shared folder (hub only); not measured.")


if __name__ == "__main__":
    main(sys.argv[1:])
