"""The method check's padding rule (see suite.api.testing for the whole check): padded positions are never attended,
in evaluation and in training over several draws, and a failure names its cause: the mask not used, rows whose real
keys were all dropped and whose weight went to the padded keys they tie with, or queries mixed across positions."""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from suite.api.attention import AttentionMethod, probes
from suite.api.check_common import (
    CheckResult,
    attached,
    checked_batch,
    finite_diff,
    forward,
    pass_seeds,
    repeat_twin,
    training_seeds,
)

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_padding"]

PERTURBATION = 3.0  # size of the noise put on padded positions' embeddings
TOLERANCE = 1e-5


@contextlib.contextmanager
def _noise_on_padding(model, mask: torch.Tensor, scale: float):
    """Adds noise to the word embeddings of padded positions: their keys and values change in every layer."""
    noise = torch.randn(*mask.shape, model.config.hidden_size, generator=torch.Generator().manual_seed(1)) * scale
    noise = noise * (mask == 0).unsqueeze(-1)
    handle = model.get_input_embeddings().register_forward_hook(lambda mod, args, out: out + noise.to(out))
    try:
        yield
    finally:
        handle.remove()


@dataclasses.dataclass
class PaddedWeight:
    """What the probabilities handed to `suite.attend` put on padded keys, over the passes of one mode."""
    calls: int = 0
    worst: float = 0.0          # the largest finite weight a real query puts on a padded key
    non_finite: bool = False
    emptied_rows: int = 0       # real queries' rows spread evenly over all their keys, padded ones included


def _padded_weight_probe(mask: torch.Tensor, found: PaddedWeight):
    padded_key = (mask == 0)[:, None, None, :]
    real_query = mask.bool()[:, None, :, None]

    def probe(module, probs):
        p = probs.detach().float().abs()
        weight = p.masked_fill(~(padded_key & real_query), 0)
        # NaN or inf is the finite check's finding, not weight on padding: such rows are left out and noted
        found.non_finite |= not bool(torch.isfinite(weight).all())
        weight = weight.nan_to_num(0.0, 0.0, 0.0)
        found.worst = max(found.worst, float(weight.max()))
        # a row whose real keys all sit at the mask's value, as its padded keys do, is flat over all its keys
        flat = (p.amax(-1) - p.amin(-1)) <= 1e-6 * p.amax(-1)
        found.emptied_rows += int(((weight.sum(-1) > 0) & flat).sum())
        found.calls += 1

    return probe


def _output_change(method: AttentionMethod, model, batch: tuple, mode: str,
                   found: PaddedWeight) -> tuple[float, bool, int]:
    """(the largest change of real tokens' outputs when only padded positions' inputs change, whether a compared
    output was not finite, the seed of the largest change); the clean passes' probabilities go to `found`. In
    training each seed's noisy pass runs where the clean one's draws repeat: on the model itself, or, where the method
    keeps state between calls (a generator of its own), on a copy taken before the clean pass."""
    ids, mask, labels = batch
    valid = mask.bool()
    model.train(mode == "train")
    worst, non_finite, worst_seed = 0.0, False, 0
    for seed in pass_seeds(method, mode):
        with torch.no_grad():
            twin = repeat_twin(method, model, mode)
            with probes(model, _padded_weight_probe(mask, found)):
                clean, _ = forward(model, ids, mask, labels, seed=seed)
            with _noise_on_padding(twin, mask, PERTURBATION):
                noisy, _ = forward(twin, ids, mask, labels, seed=seed)
        diff, nf = finite_diff(clean.hidden_states[-1][valid], noisy.hidden_states[-1][valid])
        non_finite |= nf
        if diff > worst:
            worst, worst_seed = diff, seed
    return worst, non_finite, worst_seed


def _queries_mixed(method: AttentionMethod, model, batch: tuple) -> bool:
    """Whether noise on the padded positions' queries alone (keys and values unchanged) changes `attention()`'s
    output at real positions, in an eval pass: queries mixed across positions (a reshape of the wrong axes)."""
    real = batch[1].bool()
    original = method.attention
    mixed = []

    def probing(module, query, key, value, *args, **kwargs):
        result = original(module, query, key, value, *args, **kwargs)
        noise = torch.randn(query.shape, generator=torch.Generator().manual_seed(3)).to(query)
        noisy = original(module, query + noise * (~real)[:, None, :, None].to(query), key, value, *args, **kwargs)
        if isinstance(result, tuple) and isinstance(noisy, tuple) and result[0].shape == noisy[0].shape:
            change = (noisy[0] - result[0]).float().nan_to_num(0.0, 0.0, 0.0)
            if change.dim() == 4 and change.shape[:2] == real.shape:
                mixed.append(float(change[real].abs().max()) > TOLERANCE)
        return result

    method.attention = probing
    model.eval()
    try:
        with torch.no_grad():
            forward(model, *batch)
    finally:
        del method.attention
    return any(mixed)


def check_padding(method: AttentionMethod, kind: str) -> list[CheckResult]:
    """Padding never attended, in eval mode and in train mode over SEEDS (one where nothing is drawn): real tokens'
    outputs do not change when only padded positions' inputs change, and real queries put exactly 0 weight on padded
    keys."""
    model = attached(method, kind)
    batch = checked_batch(model)
    weights = {mode: PaddedWeight() for mode in ("eval", "train")}
    changes = {mode: _output_change(method, model, batch, mode, weights[mode]) for mode in ("train", "eval")}
    draws = len(training_seeds(method))
    results = []
    for mode, (diff, non_finite, seed) in changes.items():
        setting = f"{kind}, {mode}"
        if diff > TOLERANCE:
            cause = _cause(method, model, batch, mode, weights, changes)
            drawn = f" (seed {seed})" if mode == "train" else ""
            results.append(CheckResult("padding", setting, False, f"real tokens' outputs changed by {diff:.2e} "
                                       f"when only padded positions' inputs changed{drawn}: {cause}"))
        elif non_finite:
            results.append(CheckResult("padding", setting, None, "not judged: real tokens' outputs are not finite "
                                       "(see the finite check)"))
        else:
            results.append(CheckResult("padding", setting, True, "real tokens' outputs unchanged when padded "
                                       "positions change" + (_draws(draws) if mode == "train" else "")))
    for mode, found in weights.items():
        results.append(_weight_result(kind, mode, found, draws))
    return results


def _cause(method, model, batch, mode: str, weights: dict, changes: dict) -> str:
    """The likeliest cause of real outputs that follow padded inputs, from what else the check saw."""
    train_only = mode == "train" and changes["eval"][0] <= TOLERANCE
    emptied = weights[mode].emptied_rows
    if train_only and (emptied or weights[mode].worst > 0):
        return (f"the method attends to padding in training only, {_emptied_rows(emptied)}")
    if weights[mode].calls and weights[mode].worst == 0.0 and _queries_mixed(method, model, batch):
        return ("padded positions' queries reach real tokens' outputs (noise on those queries alone changes them) "
                "while padded keys get no weight: the queries are mixed across positions (a .view/.reshape of "
                "(B, L, H, d) queries as (B, H, L, d) without .transpose(1, 2)?)")
    if train_only:
        return ("the method attends to padding in training only: is a row whose real keys are all dropped left "
                "with only padded keys (dropped keys filled with the padding mask's value tie with padding)?")
    return "the method attends to padding (is the attention_mask used, also when it is None or boolean?)"


def _emptied_rows(rows: int) -> str:
    return ((f"where it drops keys: {rows} rows of real queries were spread evenly over all their keys, padded "
             "ones included (every real key dropped). " if rows else "where it drops keys. ") +
            "Dropped keys filled with the padding mask's value (masked_fill with the mask minimum) tie with padded "
            "keys, so a row whose real keys are all dropped spreads its weight over its padding; keep such a row's "
            "keys (as suite's dropkey does) or give dropped keys a score above the mask's, so they never tie with "
            "padding")


def _weight_result(kind: str, mode: str, found: PaddedWeight, draws: int) -> CheckResult:
    setting = f"{kind}, {mode}, probabilities"
    if not found.calls:
        return CheckResult("padding", setting, None, "the method never calls suite.attend: its probabilities "
                           "cannot be inspected (attention statistics and analyses will be empty)")
    if found.worst != 0.0:
        return CheckResult("padding", setting, False, f"real queries put weight up to {found.worst:.3g} on padded "
                           "keys (must be exactly 0)" + (f" in training, {_emptied_rows(found.emptied_rows)}"
                                                          if mode == "train" and found.emptied_rows else ""))
    if found.non_finite:
        return CheckResult("padding", setting, None, "finite weights on padded keys are 0; some rows are not finite "
                           "(see the finite check)")
    return CheckResult("padding", setting, True, f"weight on padded keys is 0 in all {found.calls} calls"
                       + (_draws(draws) if mode == "train" else ""))


def _draws(draws: int) -> str:
    return f" ({draws} draws)" if draws > 1 else " (one pass: nothing is drawn at this configuration)"
