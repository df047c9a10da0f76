"""How examples become batches: padding (`collate`) to bucketed widths (`Widths`), and the batch orders a run can train
with.

`BATCHINGS` is the one table of training batch orders: `train.batching` takes its names (validated against it) and the
training loop calls the chosen entry as `order(lengths, batch_size, generator)`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

__all__ = ["BATCHINGS", "BUCKETS", "PAD_TO", "Widths", "bucket_widths", "collate", "length_grouped_batches",
           "padded_widths", "random_batches", "resolve_pad_to", "sorted_batches", "to_device",
           "trainer_length_batches"]  # what the rest of the suite uses; other names are this module's own


def collate(features: list[dict[str, list[int]]], labels: list, pad_id: int, regression: bool,
            width: int | None = None) -> dict:
    """Padding to `width` tokens (None: the longest sequence in the batch)."""
    import torch

    width = width or max(len(f["input_ids"]) for f in features)
    batch = {"input_ids": torch.full((len(features), width), pad_id, dtype=torch.long),
             "attention_mask": torch.zeros((len(features), width), dtype=torch.long)}
    if "token_type_ids" in features[0]:
        batch["token_type_ids"] = torch.zeros((len(features), width), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        batch["input_ids"][i, :n] = torch.tensor(f["input_ids"])
        batch["attention_mask"][i, :n] = 1
        if "token_type_ids" in batch:
            batch["token_type_ids"][i, :n] = torch.tensor(f["token_type_ids"])
    batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return batch


def to_device(batch: dict, device) -> dict:
    if device.type == "cuda":  # from pinned memory the copy is asynchronous: the host does not wait for it
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def cut(order: list[int], batch_size: int) -> list[list[int]]:
    """Consecutive batches of `batch_size` indices (the last one shorter)."""
    return [order[j:j + batch_size] for j in range(0, len(order), batch_size)]


def length_grouped_batches(lengths: list[int], batch_size: int, generator, mega: int = 50) -> list[list[int]]:
    """Shuffled batches of similar lengths: shuffle, sort within mega-batches of `mega` batches by length, cut into
    batches, shuffle the batch order. Less padding, still random. HF's LengthGroupedSampler groups the same way but
    keeps each mega-batch's batches in descending length (a long-to-short sweep per mega-batch); shuffling the batches
    keeps the order of lengths out of the optimisation."""
    import torch

    perm = torch.randperm(len(lengths), generator=generator).tolist()
    batches = []
    step = mega * batch_size
    for start in range(0, len(perm), step):
        chunk = sorted(perm[start:start + step], key=lambda i: -lengths[i])
        batches.extend(cut(chunk, batch_size))
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in order]


def trainer_length_batches(lengths: list[int], batch_size: int, generator) -> list[list[int]]:
    """HF Trainer's `group_by_length` order, from transformers itself: length-grouped mega-batches whose batches come
    longest first (the longest batch of all at the very start). For comparisons with Trainer runs."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    return cut(get_length_grouped_indices(lengths, batch_size, generator=generator), batch_size)


def random_batches(lengths: list[int], batch_size: int, generator) -> list[list[int]]:
    """Plain shuffled batches, whatever the lengths (Trainer's default sampler)."""
    import torch

    return cut(torch.randperm(len(lengths), generator=generator).tolist(), batch_size)


def sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Evaluation batches sorted by length (order does not change metrics; padding does cost time)."""
    return cut(sorted(range(len(lengths)), key=lambda i: -lengths[i]), batch_size)


@dataclasses.dataclass(frozen=True)
class Batching:
    order: Callable[[list[int], int, object], list[list[int]]]  # (lengths, batch_size, torch.Generator) -> batches
    help: str


BATCHINGS: dict[str, Batching] = {
    "length": Batching(length_grouped_batches, "shuffled batches of similar lengths: less padding, faster"),
    "trainer_length": Batching(trainer_length_batches, "HF Trainer's group_by_length order: each mega-batch's "
                                                       "batches longest first"),
    "random": Batching(random_batches, "plain shuffle, HF Trainer's default"),
}


# ---------------------------------------------------------------------------------------------------------
# Widths: how far each batch is padded (train.pad_to)
# ---------------------------------------------------------------------------------------------------------

BUCKETS = 7       # widths per split: with the one shorter last batch, an epoch sees at most 8 batch shapes
WIDTH_MULTIPLE = 8  # bucket widths are multiples of 8 (tensor-core tiles), unless max_length caps them
PAD_TO = {"buckets": f"each batch padded to the smallest of {BUCKETS} widths (multiples of {WIDTH_MULTIPLE}, chosen "
                     "per split to waste the fewest padded tokens) that holds its longest row: few distinct shapes, "
                     "so a GPU plans and captures each once",
          "longest": "each batch padded to its longest row (dynamic padding, as the records before buckets ran)",
          "auto": "buckets on a GPU or with train.compile (a new shape costs a plan or a compilation there), longest "
                  "on the CPU (buckets pad 7-25% more tokens on GLUE, which a CPU pays in time); resolved before the "
                  "run is named"}


def resolve_pad_to(pad_to: str, device_type: str, compiled: bool) -> str:
    """What `train.pad_to` means on a `device_type` device (see PAD_TO['auto'])."""
    if pad_to != "auto":
        return pad_to
    return "buckets" if device_type == "cuda" or compiled else "longest"


@dataclasses.dataclass(frozen=True)
class Widths:
    """The width each batch of one split is padded to: its longest row (`buckets` None) or the smallest bucket that
    holds it."""

    buckets: tuple[int, ...] | None = None

    def width(self, batch: list[int], lengths: list[int]) -> int:
        longest = max(lengths[i] for i in batch)
        if self.buckets is None:
            return longest
        return next(w for w in self.buckets if w >= longest)


def padded_widths(lengths: list[int], pad_to: str, max_length: int) -> Widths:
    """A split's `Widths` under `train.pad_to` (already resolved: `resolve_pad_to`)."""
    if pad_to == "longest" or not lengths:
        return Widths(None)
    return Widths(bucket_widths(lengths, BUCKETS, max_length))


def bucket_widths(lengths: list[int], count: int, cap: int, multiple: int = WIDTH_MULTIPLE) -> tuple[int, ...]:
    """At most `count` widths, multiples of `multiple` (capped at `cap`), the largest holding the longest row, that
    minimise the padded tokens when every row is padded to the smallest width that holds it (exact dynamic
    programme over the candidate widths; a batch's own width is its longest row's, so this counts rows, not
    batches)."""
    import collections

    rows = collections.Counter(min(-(-n // multiple) * multiple, cap) for n in lengths)  # rows per candidate width
    cands = sorted(rows)
    n = len(cands)
    if n <= count:
        return tuple(cands)
    cum = [0]  # rows at or below each candidate
    for w in cands:
        cum.append(cum[-1] + rows[w])
    inf = float("inf")
    # best[m][j]: fewest padded tokens for the rows up to cands[j] with m widths, the largest being cands[j]
    best = [[inf] * n for _ in range(count + 1)]
    back = [[-1] * n for _ in range(count + 1)]
    for j in range(n):
        best[1][j] = cands[j] * cum[j + 1]
    for m in range(2, count + 1):
        for j in range(n):
            for i in range(j):
                cost = best[m - 1][i] + cands[j] * (cum[j + 1] - cum[i + 1])
                if cost < best[m][j]:
                    best[m][j], back[m][j] = cost, i
    m = min(range(1, count + 1), key=lambda k: best[k][n - 1])
    chosen, j = [], n - 1
    while j >= 0 and m >= 1:
        chosen.append(cands[j])
        j, m = back[m][j], m - 1
    return tuple(sorted(chosen))
