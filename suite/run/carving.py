"""Carving by sentence (`train.carve=sentence`): which train rows must land in the same split, and a seeded,
stratified carve of whole groups of rows.

A row carved into the tuning or held-out test split must not be a copy, or (on a task whose train rows include the
phrases of its own sentences, `TaskSpec.phrase_rows`: SST-2) a phrase, of a row left to train on:

- Rows whose texts are equal (every text field) form one group.
- On a phrase task each sentence (a row no other row contains, as a run of whole words) forms a group with every row
  that only it contains. A phrase that several sentences contain cannot join all of them: on SST-2 the components
  that would make hold 98% of the rows, which leaves nothing to carve. It stays on the training side instead
  (`TRAIN_SIDE`): no carved row is then contained in a row left to train on, and a carved sentence contains phrases
  that are trained on, as a dev sentence does.

Containment is found exactly with a token index: every run of words of every row is looked up among the rows' texts
(about 5 s for SST-2's 67,349 rows on a 2-core CPU; `sentence_groups` keeps the result per process and on disk).
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Sequence

import numpy as np

from suite.api.errors import DataError

# what the rest of the suite uses; other names are this module's own
__all__ = ["TRAIN_SIDE", "carve_groups", "row_groups", "sentence_groups"]

TRAIN_SIDE = -1  # a row that is never carved: a phrase of several sentences
_VERSION = 1     # of the grouping below; a change to it changes the cache key
_MEMO: dict[str, np.ndarray] = {}


def row_groups(texts: Sequence[tuple[str, ...]], phrases: bool) -> np.ndarray:
    """The group of each row (rows of one group are carved together; `TRAIN_SIDE`: never carved). `texts`: each
    row's text fields; `phrases`: whether rows may be phrases (runs of whole words) of other rows (one text field)."""
    unique: dict[tuple[str, ...], int] = {}
    of_row = np.asarray([unique.setdefault(tuple(t), len(unique)) for t in texts], dtype=np.int64)
    if not phrases:
        return of_row
    if any(len(t) != 1 for t in unique):
        raise ValueError("phrase rows are found in tasks of one text field")
    words = [t[0].split() for t in unique]
    index = {tuple(w): i for i, w in enumerate(words)}
    containers: dict[int, list[int]] = defaultdict(list)  # a text -> the longer texts it is a run of words of
    for s, w in enumerate(words):
        found = set()
        for a in range(len(w)):
            for b in range(a + 1, len(w) + 1 - (a == 0)):  # every proper run of words
                r = index.get(tuple(w[a:b]))
                if r is not None and r != s and r not in found:
                    found.add(r)
                    containers[r].append(s)
    group = np.arange(len(unique), dtype=np.int64)  # a sentence: its own group
    for r, longer in containers.items():
        sentences = [s for s in longer if s not in containers]  # the maximal texts containing it
        group[r] = sentences[0] if len(sentences) == 1 else TRAIN_SIDE
    return group[of_row]


def sentence_groups(spec, columns: dict[str, list]) -> np.ndarray:
    """`row_groups` of a task's train split, computed once per content (kept in this process and in the
    tokenised-data cache, `suite.run.cache`)."""
    from suite.run.cache import cached

    texts = list(zip(*(columns[f] for f in spec.text_fields)))
    digest = hashlib.sha256(json.dumps([_VERSION, spec.phrase_rows, texts]).encode()).hexdigest()[:24]
    if digest not in _MEMO:
        _MEMO[digest] = np.asarray(cached(f"groups-{digest}", lambda: row_groups(texts, spec.phrase_rows),
                                          lambda v: isinstance(v, np.ndarray) and v.shape == (len(texts),)))
    return _MEMO[digest]


def _targets(labels: Sequence, size: int, stratify: bool) -> dict:
    """Rows of each label the carved split holds: the train split's shares, largest remainders rounded up."""
    if not stratify:
        return {None: size}
    kinds, counts = np.unique(np.asarray(labels), return_counts=True)
    exact = counts / counts.sum() * size
    target = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - target), kind="stable")[:size - target.sum()]:
        target[i] += 1
    return dict(zip(kinds.tolist(), target.tolist()))


def carve_groups(labels: Sequence, groups: np.ndarray, size: int, seed: int, stratify: bool,
                 setting: str = "holdout") -> tuple[list[int], list[int]]:
    """(rows left, carved rows): whole groups taken in a seeded order until `size` rows are carved, each taken only
    while it keeps every label within its share (`_targets`, when `stratify`); if that leaves the split short, a
    second pass fills it with the groups that fit. `TRAIN_SIDE` rows are never carved."""
    if size == 0:
        return list(range(len(labels))), []
    keys = np.asarray(labels) if stratify else np.zeros(len(labels), dtype=np.int64)
    target = _targets(labels, size, stratify)
    members: dict[int, list[int]] = defaultdict(list)
    for row, g in enumerate(groups.tolist()):
        if g != TRAIN_SIDE:
            members[g].append(row)
    units = list(members.values())
    order = np.random.default_rng(seed).permutation(len(units))
    taken: list[int] = []
    held = dict.fromkeys(target, 0)
    for strict in (True, False):
        for u in order:
            rows = units[u]
            if rows is None or len(taken) + len(rows) > size:
                continue
            need = defaultdict(int)
            for row in rows:
                need[keys[row].item() if stratify else None] += 1
            if strict and any(held.get(k, 0) + c > target.get(k, 0) for k, c in need.items()):
                continue
            taken += rows
            for k, c in need.items():
                held[k] = held.get(k, 0) + c
            units[u] = None
            if len(taken) == size:
                chosen = set(taken)
                return [i for i in range(len(labels)) if i not in chosen], sorted(taken)
    what = "tuning split" if setting == "holdout" else "held-out test split"
    raise DataError(f"train.{setting}: cannot carve a {what} of exactly {size} rows from whole sentence groups (it "
                    f"reached {len(taken)}); give another size, or train.carve=row")
