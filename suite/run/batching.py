"""How examples become batches: padding (`collate`), and the batch orders a run can train with.

`BATCHINGS` is the one table of training batch orders: `train.batching` takes its names (validated against it) and the
training loop calls the chosen entry as `order(lengths, batch_size, generator)`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


def collate(features: list[dict[str, list[int]]], labels: list, pad_id: int, regression: bool) -> dict:
    """Dynamic padding to the longest sequence in the batch."""
    import torch

    width = max(len(f["input_ids"]) for f in features)
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
