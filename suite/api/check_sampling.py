"""The method check's rules for what a method draws in training (see suite.api.testing for the whole check): fresh
draws at every step, training weights that keep the expectation of the evaluation weights where the method claims
it, and a backward pass that differentiates the forward under the same draws (a float64 finite difference)."""
from __future__ import annotations

import copy
import math

import torch

from suite.api.attention import AttentionMethod, attention_modules, probes
from suite.api.check_common import (
    ROWS,
    CheckResult,
    attached,
    checked_batch,
    finite_diff,
    forward,
    paired_with_eval,
    repeat_twin,
    rows,
)

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_draws", "check_expectation", "check_gradient"]

# train-mode passes whose row sums the expectation rule averages; z beyond Z_LIMIT standard errors fails it
EXPECTATION_DRAWS = range(16)
Z_LIMIT = 6.0
# of the central finite difference in float64, along a direction of unit-variance entries
# the first has the least rounding; the others where it meets a kink (ReLA's ReLU on a tiny ModernBERT meets one at
# one step in three or so; a backward that does not match its forward is off at every step)
GRADIENT_STEPS = (1e-5, 1e-6, 1e-7, 3e-6, 3e-7, 3e-5)
# relative difference between autograd's and the finite difference's derivative, beyond the quotient's rounding:
# correct built-ins stay below 5e-6 at seeds 0-2, .data dropout at p = 0.1 is 6.5e-4 or more off (issue 64)
GRADIENT_TOLERANCE = 1e-5


def check_draws(method: AttentionMethod, kind: str, rates: list[str]) -> CheckResult:
    """Two training passes one after the other, under different random seeds (gradients enabled, as in training):
    with a stochastic parameter above 0 they differ (a mask cached across steps, or drawn from a generator of the
    method's own that is re-seeded at every call, repeats); with none they agree, or the method draws without saying
    what it draws."""
    setting = f"{kind}, train"
    model = attached(method, kind)
    model.train()
    ids, mask, labels = checked_batch(model)
    valid = mask.bool()
    first, _ = forward(model, ids, mask, labels, seed=0)
    second, _ = forward(model, ids, mask, labels, seed=1)
    diff, non_finite = finite_diff(first.hidden_states[-1][valid], second.hidden_states[-1][valid])
    if diff == 0.0 and non_finite:
        return CheckResult("draws", setting, None, "not judged: the outputs are not finite (see the finite check)")
    if not rates:
        if diff == 0.0:
            return CheckResult("draws", setting, True, "nothing is drawn (measured: two training passes under "
                               "different seeds agree) and no stochastic parameter is above 0")
        return CheckResult("draws", setting, False, f"two training passes under different seeds differ by "
                           f"{diff:.2e}, yet no stochastic parameter is above 0: the method draws without saying "
                           "what it draws, so no rule tests it. Declare it: stochastic = (suite.Stochastic(\"sigma\", "
                           "kind=\"scale\"),) names a Config field and what its draws do")
    if diff == 0.0:
        return CheckResult("draws", setting, False, f"two training passes in a row gave identical outputs at "
                           f"{', '.join(rates)}: no new dropout mask is drawn per step (a mask kept across steps, or "
                           "a generator of the method's own re-seeded at every call?), or the rate does nothing. Draw "
                           "from torch's generator (torch.rand, F.dropout) at every forward")
    return CheckResult("draws", setting, True, f"consecutive training passes draw afresh at {', '.join(rates)}")


def _paired_row_sums(method: AttentionMethod, model, real_query: torch.Tensor, seed: int) -> list[tuple]:
    """Calls `attention()` in training as the model does, and once more in evaluation on the same inputs; keeps the
    row sums of real queries' weights that each call hands to `suite.attend`, as (train, eval) per call."""
    found: list[tuple] = []
    seen: list[torch.Tensor] = []

    def probe(module, probs):
        seen.append(probs.detach().double().sum(-1))

    def keep(seen):
        if len(seen) == 2:
            rows = real_query.expand_as(seen[0])
            found.append((seen[0][rows], seen[1][rows]))

    with paired_with_eval(method, seen, keep), torch.no_grad(), probes(model, probe):
        forward(model, *checked_batch(model), seed=seed)
    return found


def check_expectation(method: AttentionMethod, kind: str, rates: list[str]) -> CheckResult:
    """Where the method keeps the expectation (`keeps_expectation`, the default), its training-mode rows sum, on
    average over draws, to what its evaluation rows sum to on the same inputs (1 for a softmax): dropout without the
    1/(1-p) rescale shrinks them by 1 - p. A difference beyond Z_LIMIT standard errors of the per-draw means fails."""
    setting = f"{kind}, train"
    if not type(method).keeps_expectation:
        return CheckResult("expect", setting, None, "declared keeps_expectation = False (dropout without a rescale "
                           "on purpose)")
    if not rates:
        return CheckResult("expect", setting, None, "no rate above 0 (p, p_*): training weights are evaluation's")
    model = attached(method, kind)
    model.train()
    real_query = checked_batch(model)[1].bool()[:, None, :]  # (B, 1, L): rows of real queries, every head
    per_draw, train_sum, eval_sum = [], 0.0, 0.0
    for seed in EXPECTATION_DRAWS:
        calls = _paired_row_sums(method, model, real_query, seed)
        if not calls:
            return CheckResult("expect", setting, None, "the method never calls suite.attend: its weights cannot "
                               "be inspected")
        train = torch.cat([t for t, _ in calls])
        evaluation = torch.cat([e for _, e in calls])
        if not (torch.isfinite(train).all() and torch.isfinite(evaluation).all()):
            return CheckResult("expect", setting, None, "not judged: some rows are not finite (see the finite "
                               "check)")
        per_draw.append(float((train - evaluation).mean()))
        train_sum, eval_sum = train_sum + float(train.mean()), eval_sum + float(evaluation.mean())
    n = len(per_draw)
    mean = sum(per_draw) / n
    if max(per_draw) == min(per_draw) and mean != 0.0:
        return CheckResult("expect", setting, None, "not judged: every draw gave the same weights (see the draws "
                           "check)")
    se = math.sqrt(sum((d - mean) ** 2 for d in per_draw) / (n - 1) / n)
    floor = 1e-6 * max(1.0, abs(eval_sum / n))  # rounding, where the sums agree by construction (DropHead's H / kept)
    z = abs(mean) / se if se > 0 else (math.inf if abs(mean) > floor else 0.0)
    if abs(mean) > floor and z > Z_LIMIT:
        return CheckResult("expect", setting, False, f"training rows sum to {train_sum / n:.3f} on average where the "
                           f"same rows in evaluation sum to {eval_sum / n:.3f} ({mean:+.3f}, {z:.0f} standard errors "
                           f"over {n} draws, at {', '.join(rates)}): dropout that keeps the expectation rescales the "
                           "kept weights by 1/(1-p) (F.dropout, suite.probs_dropout do); a method that drops without "
                           "a rescale on purpose declares keeps_expectation = False")
    return CheckResult("expect", setting, True, f"training row sums average evaluation's ({mean:+.1e}, within "
                       f"{Z_LIMIT:.0f} standard errors over {n} draws)")


def _directional_loss(model, batch: tuple, direction: dict, step: float, seed: int, stateful: bool) -> float:
    """The loss of `model` moved by step * direction, under `seed`: on a copy where the method keeps state between
    calls (its own generator then draws as in every other copy), else on the model, its parameters put back after."""
    twin = copy.deepcopy(model) if stateful else model
    named = dict(twin.named_parameters())
    with torch.no_grad():
        kept = {} if stateful else {name: named[name].clone() for name in direction}
        try:
            for name in direction:
                named[name].add_(direction[name], alpha=step)
            _, loss = forward(twin, *batch, seed=seed)
        finally:
            for name, value in kept.items():
                named[name].copy_(value)
    return float(loss)


def _directions(model) -> dict[str, dict[str, torch.Tensor]]:
    """Random directions of the attention modules' parameters: all of them, and the query and key projections alone
    (whose gradient passes through the scores and the method's drop, where the values' path would hide a gap)."""
    g = torch.Generator().manual_seed(5)
    names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    every, scoring = {}, {}
    for module in attention_modules(model):
        scored = {id(p) for part in ("query", "key") if hasattr(module, part)
                  for p in getattr(module, part).parameters()}
        for p in module.parameters():
            if id(p) in names:
                every[names[id(p)]] = torch.randn(p.shape, generator=g, dtype=p.dtype)
                if id(p) in scored:
                    scoring[names[id(p)]] = every[names[id(p)]]
    return {"the attention parameters": every, **({"the query and key projections": scoring} if scoring else {})}


def check_gradient(method: AttentionMethod, kind: str, seed: int = 0) -> CheckResult:
    """In training and float64, autograd's derivative of the loss along random directions (all the attention
    modules' parameters; the query and key projections alone) equals a central finite difference taken under the
    same draws (the same seed, and copies of the same state for a method's own generator), within a relative 1e-5
    (correct methods stay near 1e-7): dropout applied through `.data` or in place behind autograd's back, or a
    custom backward, gives another gradient than the forward it ran."""
    setting = f"{kind}, train, float64"
    model = attached(method, kind).double()
    model.train()
    # rows with a real token: a fully padded row's scores sit at the mask minimum, where adding a score changes no
    # float (autograd's derivative of `s + mask` is 1, a finite difference's 0)
    batch = rows(checked_batch(model), [i for name, which in ROWS.items() if name != "a fully padded row"
                                        for i in which])
    twin = repeat_twin(method, model, "train")
    stateful = twin is not model
    try:
        _, loss = forward(twin, *batch, seed=seed)
        loss.backward()
    except RuntimeError as exc:
        return CheckResult("gradient", setting, None, f"not judged: the model does not run in float64 ({exc})")
    named = dict(twin.named_parameters())
    worst = 0.0
    for along, direction in _directions(model).items():
        autograd = sum(float((named[n].grad * v).sum()) for n, v in direction.items() if named[n].grad is not None)
        # the closest of the steps tried: rounding dominates a small step, a kink (a top-k threshold) a large one,
        # where a backward that does not match its forward is off at both
        error, finite = math.inf, math.nan
        for step in GRADIENT_STEPS:
            plus, minus = (_directional_loss(model, batch, direction, s * step, seed, stateful) for s in (1, -1))
            estimate = (plus - minus) / (2 * step)
            if not (math.isfinite(autograd) and math.isfinite(estimate)):
                return CheckResult("gradient", setting, None, "not judged: the loss or its gradient is not finite "
                                   "(see the finite check)")
            # what rounding alone moves a float64 difference quotient by: a loss through thousands of operations
            # carries errors of some 100 ulps, divided by the step
            rounding = 100 * torch.finfo(torch.float64).eps * max(abs(plus), abs(minus)) / step
            gap = max(abs(autograd - estimate) - rounding, 0.0) / max(abs(autograd), abs(estimate), 1e-30)
            if gap < error:
                error, finite = gap, estimate
            if error <= GRADIENT_TOLERANCE:
                break  # agreed: the other steps are tried only where this one disagrees
        if error > GRADIENT_TOLERANCE:
            return CheckResult("gradient", setting, False, f"the training gradient along a random direction of "
                               f"{along} is {autograd:.9g} by autograd and {finite:.9g} by a float64 finite "
                               f"difference under the same draws at the closest of the steps tried (relative "
                               f"difference "
                               f"{error:.1e}, tolerance {GRADIENT_TOLERANCE:.0e}): the backward pass does not "
                               "differentiate the forward (dropout or another change applied through .data or in "
                               "place after autograd saved the tensor, a detach, or a custom autograd.Function's "
                               "backward)")
        worst = max(worst, error)
    return CheckResult("gradient", setting, True, f"autograd equals a float64 finite difference under the same draws "
                       f"along {' and '.join(_directions(model))} (relative difference beyond rounding up to "
                       f"{worst:.1e})")
