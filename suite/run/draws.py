"""Which rows of a task a run uses: the tuning split carved from the train set, the training subset of the run's
data draw, the dev subset.

- The tuning split (`train.holdout`: a fraction of the train split, or a count) is drawn first, with its own seed
  (`train.holdout_seed`), stratified by label for classification; it is the same for every draw and every size, and
  no run ever trains on it.
- The held-out test split (`train.test_holdout`: a fraction of the train split, or a count) is drawn before
  everything else, with a fixed seed (`TEST_SEED`) that no setting changes: every run of a task that asks for one
  many rows is scored on the same rows, whatever its seed, method, draw or tuning split. Stratified by label for
  classification; no run trains, tunes or chooses anything on it. Without it the tuning split and the subsets are
  drawn from the whole train split exactly as before, so records made without it keep their rows.
- The tuning split then comes from the rows the held-out test split leaves (its size still counted on the whole
  train split).
- The training subset comes from the rest. Its draw follows the run's seed unless `train.data_seed` fixes it. With
  `train.subset_draw=nested` a subset is the prefix of the draw's seeded permutation, so the subsets of one draw are
  nested (250 rows within 500 within 1000); `legacy` is the unnested draw of the records written before.
- The dev subset (`train.max_eval_samples`) never follows the run seed: runs are compared on the same examples.
- Both carved splits take whole groups of rows with `train.carve=sentence` (the default): rows with equal texts, and
  on SST-2 a sentence with its phrases, land in one split (`suite.run.carving`), so that no carved row is a copy or
  a phrase of a row left to train on. `row` carves single rows, as the records written before it existed did.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, NamedTuple, Sequence

import numpy as np

from suite.api.errors import DataError, HyperParameterError
from suite.run.carving import carve_groups, sentence_groups
from suite.run.data import seeded_subset  # the legacy draw, and the dev subset's

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_heldout_task", "check_holdouts", "dev_rows", "draw_seed", "draw_train", "heldout_makeup",
           "holdout_size", "nested_subset", "train_groups", "tuning_split"]

TEST_SEED = 0  # the held-out test split's draw: fixed, so that every run of a task is scored on the same rows


def nested_subset(n: int, limit: int | None, seed: int) -> list[int]:
    """The first `limit` rows of a seeded permutation of range(n), sorted: for one seed, a smaller subset lies
    within every larger one."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(np.random.default_rng(seed).permutation(n)[:limit].tolist())


def draw_seed(t, run_seed: int) -> int:
    """The seed of a run's training-subset draw: train.data_seed when fixed, else the run's own seed."""
    return run_seed if t.data_seed is None else int(t.data_seed)


def holdout_size(holdout: float | None, n: int, setting: str = "holdout", left: int | None = None) -> int:
    """Rows of the tuning split (or, with `setting="test_holdout"`, of the held-out test split) for a train split of
    `n` rows: a count, or a fraction of the split (0: none). `left`: the rows it is drawn from, when another split
    took some before it (default `n`)."""
    if holdout is None:
        return 0
    left = n if left is None else left
    size = int(holdout) if holdout >= 1 else int(round(holdout * n))
    if not 1 <= size < left:
        what = "a tuning split" if setting == "holdout" else "a held-out test split"
        taken = "" if left == n else f" ({n - left} of them are the held-out test split's)"
        raise DataError(f"train.{setting}={holdout:g} gives {what} of {size} of the {n} training rows{taken}; it "
                        f"needs at least 1 and must leave rows to train on")
    return size


def tuning_split(labels: Sequence, size: int, seed: int, stratify: bool,
                 setting: str = "holdout") -> tuple[list[int], list[int]]:
    """(rows left to train on, tuning rows): a seeded split, stratified by label when `stratify` (`setting`: the one
    that asked for it, named when it cannot be drawn)."""
    from sklearn.model_selection import train_test_split

    if size == 0:
        return list(range(len(labels))), []
    try:
        rest, tune = train_test_split(np.arange(len(labels)), test_size=size, random_state=seed,
                                      stratify=np.asarray(labels) if stratify else None)
    except ValueError as exc:  # a class too rare to split, or fewer tuning rows than classes
        what = "tuning split" if setting == "holdout" else "held-out test split"
        raise DataError(f"train.{setting}: cannot draw a stratified {what} of {size} rows ({exc}); give a larger "
                        f"{setting}") from None
    return sorted(rest.tolist()), sorted(tune.tolist())


def carve(labels: Sequence, t, stratify: bool, groups: np.ndarray | None = None
          ) -> tuple[list[int], list[int], list[int]]:
    """(rows the subsets are drawn from, tuning rows, held-out test rows), as rows of the train split: the held-out
    test split first, then the tuning split from what it leaves. With train.carve=sentence whole `groups` of rows
    are carved (`suite.run.carving`; None: each row its own group); with row, single rows, as records made before."""
    if t.carve == "row":
        groups = None
    elif groups is None:
        groups = np.arange(len(labels))
    left, test = _split(labels, holdout_size(t.test_holdout, len(labels), "test_holdout"), TEST_SEED, stratify,
                        "test_holdout", groups)
    if not test:  # exactly the draw of the records made before the held-out test split existed
        rest, tune = _split(labels, holdout_size(t.holdout, len(labels)), t.holdout_seed, stratify, "holdout", groups)
        return rest, tune, []
    size = holdout_size(t.holdout, len(labels), left=len(left))
    rest, tune = _split([labels[i] for i in left], size, t.holdout_seed, stratify, "holdout",
                        None if groups is None else groups[left])
    return [left[i] for i in rest], sorted(left[i] for i in tune), test


def _split(labels: Sequence, size: int, seed: int, stratify: bool, setting: str, groups: np.ndarray | None
           ) -> tuple[list[int], list[int]]:
    """(rows left, carved rows): by row (`tuning_split`) without `groups`, else by whole groups (`carve_groups`)."""
    if groups is None:
        return tuning_split(labels, size, seed, stratify, setting)
    return carve_groups(labels, groups, size, seed, stratify, setting)


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
    test: list[int] = dataclasses.field(default_factory=list)  # the held-out test split (train.test_holdout)
    carve: str = "row"  # how the splits were carved (train.carve)
    groups: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)  # carved together

    def groups_of(self, rows: Sequence[int]) -> list[int] | None:
        """The carving group of each of `rows` (None where rows were carved one by one: each its own source)."""
        return None if self.groups is None or self.carve == "row" else self.groups[list(rows)].tolist()

    def facts(self) -> dict[str, Any]:
        """What the record keeps: which draw, which subset (its size and digest), which tuning split, which
        held-out test split, and how those splits were carved."""
        facts = {"subset_draw": self.subset_draw, "data_seed": self.seed, "train_rows": len(self.train),
                 "train_rows_sha": fingerprint(self.train)}
        if self.tune:
            facts |= {"holdout_seed": self.holdout_seed, "tune_rows": len(self.tune),
                      "tune_rows_sha": fingerprint(self.tune)}
        if self.test:
            facts |= {"heldout_seed": TEST_SEED, "heldout_rows": len(self.test),
                      "heldout_rows_sha": fingerprint(self.test)}
        if self.tune or self.test:
            facts["carve"] = self.carve
        return facts


def draw_train(labels: Sequence, t, run_seed: int, classification: bool, groups: np.ndarray | None = None) -> Draw:
    """The held-out test split, the tuning split and the training subset of one run, as rows of the train split
    (`groups`: the rows carved together by sentence, `train_groups`; None: each row alone)."""
    rest, tune, test = carve(labels, t, classification, groups)
    seed = draw_seed(t, run_seed)
    subset = nested_subset if t.subset_draw == "nested" else seeded_subset
    train = [rest[i] for i in subset(len(rest), t.max_train_samples, seed)]
    return Draw(train, tune, seed, t.subset_draw, t.holdout_seed, test, t.carve, groups)


def heldout_makeup(spec, heldout: dict[str, list], dev: dict[str, list], groups: list[int] | None
                   ) -> dict[str, Any]:
    """What the held-out test split is made of, beside dev: its groups of rows that share a source (a sentence and
    its phrases on SST-2; `groups` None: each row its own) and the median words of a row in each."""
    def median_words(columns: dict[str, list]) -> float:
        rows = zip(*(columns[f] for f in spec.text_fields))
        return float(np.median([sum(len(str(text).split()) for text in row) for row in rows]))

    count = len(heldout["label"]) if groups is None else len(set(groups))
    return {"heldout_groups": count, "heldout_median_words": median_words(heldout),
            "dev_median_words": median_words(dev)}


def train_groups(spec, columns: dict[str, list], trains) -> np.ndarray | None:
    """The groups of train rows carved together (`suite.run.carving`) when a run with settings `trains` carves a
    split by sentence; else None, and nothing is computed."""
    if any(t.carve == "sentence" and (t.holdout is not None or t.test_holdout is not None) for t in trains):
        return sentence_groups(spec, columns)
    return None


def check_holdouts(labels: Sequence, trains, classification: bool, task: str, groups: np.ndarray | None = None
                   ) -> None:
    """Draw every distinct held-out test split and tuning split that runs with settings `trains` ask for, so that an
    impossible one (larger than the train split or than what the other leaves, or a class too rare to stratify)
    stops a grid before anything trains."""
    asked = {(t.test_holdout, t.holdout, t.holdout_seed, t.carve) for t in trains
             if t.holdout is not None or t.test_holdout is not None}
    for settings in asked:
        try:
            carve(labels, Holdouts(*settings), classification, groups)
        except DataError as exc:
            raise DataError(f"{task}: {exc}") from None


def check_heldout_task(spec, trains) -> None:
    """A held-out test split is one split scored with the task's unsuffixed metrics: a task scored on several dev
    sets (MNLI's matched and mismatched) has a headline no single split gives, so it is refused there. On a task
    whose train rows include the phrases of its sentences (SST-2) one carved row by row is refused: it leaks."""
    asked = [t.test_holdout for t in trains if t.test_holdout is not None]
    if spec.phrase_rows and any(t.test_holdout is not None and t.carve == "row" for t in trains):
        raise HyperParameterError(
            f"train.test_holdout={asked[0]:g} with train.carve=row: {spec.display}'s train set holds the phrases of "
            "its own sentences as rows of their own, so rows carved one by one are mostly phrases of rows left to "
            "train on (88.6% of a 10,000-row split on SST-2; dev: 2 of 872) and the split would score memorised "
            "text. Carve it by sentence: train.carve=sentence (the default)")
    if asked and len(spec.eval_splits) > 1:
        raise HyperParameterError(
            f"train.test_holdout={asked[0]:g}: {spec.display} is scored on {len(spec.eval_splits)} dev sets "
            f"({', '.join(spec.eval_splits.values())}), the mean of which is its score; a held-out test split carved "
            "from its train set is one split, which cannot stand in for them. Leave train.test_holdout unset for "
            f"{spec.display} (a study can set it in an also: grid of the other tasks)")


class Holdouts(NamedTuple):
    """The settings `carve` reads."""

    test_holdout: float | None
    holdout: float | None
    holdout_seed: int
    carve: str


def dev_rows(n: int, t) -> list[int]:
    """The dev subset: drawn with train.data_seed when it is fixed, else with 0 (never with the run seed)."""
    return seeded_subset(n, t.max_eval_samples, t.data_seed or 0)
