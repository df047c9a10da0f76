"""The method check's window rule (see suite.api.testing for the whole check), on a model with local layers (the tiny
ModernBERT): the mask a local layer's method receives holds the layer's sliding window, and no query attends outside
it, in evaluation and in training: changing the keys and values beyond a query's window leaves its output alone
(sparse methods select within the window, uniform spreads over it, dropout renormalises over it)."""
from __future__ import annotations

import copy

import torch

from suite.api.attention import AttentionMethod
from suite.api.check_common import CheckResult, attached, checked_batch, forward, pass_seeds, training_seeds
from suite.api.layers import local_window
from suite.api.tiny_models import seed_cpu

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_window"]

TOLERANCE = 1e-5
NOISE = 3.0  # size of the noise put on the keys and values beyond a query's window


def check_window(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """In each of eval and train mode (over SEEDS, one where nothing is drawn): the received mask's window, and the
    largest change of a real query's output in a local layer when only the keys and values beyond its window
    change."""
    model = attached(method, kind)
    batch = checked_batch(model)
    real = batch[1].bool()
    original = method.attention
    found = {"calls": 0, "mask": [], "worst": 0.0, "seed": 0}
    results = []

    def probing(module, query, key, value, attention_mask, *args, **kwargs):
        before = _state(method)
        result = original(module, query, key, value, attention_mask, *args, **kwargs)
        window = local_window(module)
        if window is None:
            return result
        after = _state(method)
        found["calls"] += 1
        length = key.shape[-2]
        beyond = (torch.arange(length)[None, :] - torch.arange(length)[:, None]).abs() > window  # (Lq, Lk)
        if attention_mask is None or not bool((attention_mask[..., beyond] < 0).all()):
            found["mask"].append(module.layer_idx)
        for q in range(query.shape[-2]):
            outside = beyond[q].to(key)[None, None, :, None]
            noise = torch.randn(key.shape, generator=torch.Generator().manual_seed(q)).to(key) * NOISE * outside
            _restore(method, before)
            noisy = _replayed(method, lambda: original(module, query, key + noise, value + noise, attention_mask,
                                                        *args, **kwargs), found["seed"])
            change = (noisy[0][:, q] - result[0][:, q]).float().nan_to_num(0.0, 0.0, 0.0)[real[:, q]]
            found["worst"] = max(found["worst"], float(change.abs().max()) if change.numel() else 0.0)
        _restore(method, after)
        return result

    method.attention = lambda *args, **kwargs: _replayed(method, lambda: probing(*args, **kwargs), found["seed"])
    try:
        for mode in ("eval", "train"):
            found.update(calls=0, mask=[], worst=0.0)
            model.train(mode == "train")
            worst_seed, worst = 0, 0.0
            for seed in pass_seeds(method, mode):
                found["seed"] = seed
                with torch.no_grad():
                    forward(model, *batch, seed=seed)
                if found["worst"] > worst:
                    worst, worst_seed = found["worst"], seed
            results.append(_result(kind, mode, found, worst, worst_seed, len(training_seeds(method))))
    finally:
        del method.attention
    return results


def _replayed(method: AttentionMethod, call, seed: int):
    """`call()` with torch's generator seeded: each pass over one layer draws the same masks, so what changes between
    them is the input alone."""
    with torch.random.fork_rng(devices=[]):
        seed_cpu(seed)
        return call()


def _state(method: AttentionMethod) -> dict:
    """What a method keeps between calls (its generators' states, its dicts and lists, e.g. AttendOut's captured
    hidden states, which a call consumes), to put back before a layer's call is repeated."""
    return {name: value.get_state() if isinstance(value, torch.Generator) else copy.copy(value)
            for name, value in vars(method).items() if isinstance(value, (torch.Generator, dict, list))}


def _restore(method: AttentionMethod, state: dict) -> None:
    for name, value in state.items():
        held = getattr(method, name)
        if isinstance(held, torch.Generator):
            held.set_state(value)
        else:
            setattr(method, name, copy.copy(value))


def _result(kind: str, mode: str, found: dict, worst: float, seed: int, draws: int) -> CheckResult:
    setting = f"{kind}, {mode}"
    if not found["calls"]:
        return CheckResult("window", setting, None, "no local layer called the method")
    if found["mask"]:
        return CheckResult("window", setting, False, f"the mask of local layers {sorted(set(found['mask']))} lets "
                           "keys beyond the window through: the sliding window is not part of the mask")
    if worst > TOLERANCE:
        drawn = f" (seed {seed})" if mode == "train" else ""
        return CheckResult("window", setting, False, f"a query's output changed by {worst:.2e} when only keys and "
                           f"values beyond its window changed{drawn}: the method attends outside the window (does "
                           "it use the attention_mask it receives, which holds the window, for every key it picks?)")
    return CheckResult("window", setting, True, "no query attends beyond its window" + (
        _draws(draws) if mode == "train" else ""))


def _draws(draws: int) -> str:
    return f" ({draws} draws)" if draws > 1 else " (one pass: nothing is drawn at this configuration)"
