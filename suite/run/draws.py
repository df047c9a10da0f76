"""Which rows of a task a run uses: the tuning split carved from the train set, the training subset of the run's
data draw, the dev subset.

- The tuning split (`train.holdout`: a fraction of the train split, or a count) is drawn first, with its own seed
  (`train.holdout_seed`), stratified by label for classification; it is the same for every draw and every size, and
  no run ever trains on it.
- The training subset comes from the rest. Its draw follows the run's seed unless `train.data_seed` fixes it. With
  `train.subset_draw=nested` a subset is the prefix of the draw's seeded permutation, so the subsets of one draw are
  nested (250 rows within 500 within 1000); `legacy` is the unnested draw of the records written before.
- The dev subset (`train.max_eval_samples`) never follows the run seed: runs are compared on the same examples.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Sequence

import numpy as np

from suite.api.errors import DataError
from suite.run.data import seeded_subset  # the legacy draw, and the dev subset's

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_holdouts", "dev_rows", "draw_seed", "draw_train", "holdout_size", "nested_subset", "tuning_split"]


def nested_subset(n: int, limit: int | None, seed: int) -> list[int]:
    """The first `limit` rows of a seeded permutation of range(n), sorted: for one seed, a smaller subset lies
    within every larger one."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(np.random.default_rng(seed).permutation(n)[:limit].tolist())


def draw_seed(t, run_seed: int) -> int:
    """The seed of a run's training-subset draw: train.data_seed when fixed, else the run's own seed."""
    return run_seed if t.data_seed is None else int(t.data_seed)


def holdout_size(holdout: float | None, n: int) -> int:
    """Rows of the tuning split for a train split of `n` rows: a count, or a fraction of the split (0: none)."""
    if holdout is None:
        return 0
    size = int(holdout) if holdout >= 1 else int(round(holdout * n))
    if not 1 <= size < n:
        raise DataError(f"train.holdout={holdout:g} gives a tuning split of {size} of the {n} training rows; it "
                        f"needs at least 1 and must leave rows to train on")
    return size


def tuning_split(labels: Sequence, size: int, seed: int, stratify: bool) -> tuple[list[int], list[int]]:
    """(rows left to train on, tuning rows): a seeded split, stratified by label when `stratify`."""
    from sklearn.model_selection import train_test_split

    if size == 0:
        return list(range(len(labels))), []
    try:
        rest, tune = train_test_split(np.arange(len(labels)), test_size=size, random_state=seed,
                                      stratify=np.asarray(labels) if stratify else None)
    except ValueError as exc:  # a class too rare to split, or fewer tuning rows than classes
        raise DataError(f"train.holdout: cannot draw a stratified tuning split of {size} rows ({exc}); give a "
                        "larger holdout") from None
    return sorted(rest.tolist()), sorted(tune.tolist())


def fingerprint(rows: Sequence[int]) -> str:
    """A short digest of a set of rows: two records used the same rows exactly when theirs agree."""
    return hashlib.sha256(np.asarray(sorted(rows), dtype=np.int64).tobytes()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class Draw:
    """The rows of the train split a run trains on and tunes on, and how they were drawn."""

    train: list[int]
    tune: list[int]
    seed: int
    subset_draw: str
    holdout_seed: int

    def facts(self) -> dict[str, Any]:
        """What the record keeps: which draw, which subset (its size and digest), which tuning split."""
        facts = {"subset_draw": self.subset_draw, "data_seed": self.seed, "train_rows": len(self.train),
                 "train_rows_sha": fingerprint(self.train)}
        if self.tune:
            facts |= {"holdout_seed": self.holdout_seed, "tune_rows": len(self.tune),
                      "tune_rows_sha": fingerprint(self.tune)}
        return facts


def draw_train(labels: Sequence, t, run_seed: int, classification: bool) -> Draw:
    """The tuning split and the training subset of one run, as rows of the train split."""
    rest, tune = tuning_split(labels, holdout_size(t.holdout, len(labels)), t.holdout_seed, classification)
    seed = draw_seed(t, run_seed)
    subset = nested_subset if t.subset_draw == "nested" else seeded_subset
    train = [rest[i] for i in subset(len(rest), t.max_train_samples, seed)]
    return Draw(train, tune, seed, t.subset_draw, t.holdout_seed)


def check_holdouts(labels: Sequence, trains, classification: bool, task: str) -> None:
    """Draw every distinct tuning split that runs with settings `trains` ask for, so that an impossible one (larger
    than the train split, or a class too rare to stratify) stops a grid before anything trains."""
    for holdout, seed in {(t.holdout, t.holdout_seed) for t in trains if t.holdout is not None}:
        try:
            tuning_split(labels, holdout_size(holdout, len(labels)), seed, classification)
        except DataError as exc:
            raise DataError(f"{task}: {exc}") from None


def dev_rows(n: int, t) -> list[int]:
    """The dev subset: drawn with train.data_seed when it is fixed, else with 0 (never with the run seed)."""
    return seeded_subset(n, t.max_eval_samples, t.data_seed or 0)
