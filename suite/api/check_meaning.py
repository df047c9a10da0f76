"""The method check's rules on what a method's draws mean (see suite.api.testing for the whole check): where the
randomness lands (zeros in the probabilities handed to `suite.attend`, at a share that follows the declared rate),
its unit (independent along the axes the method declares, shared along the others), a declared schedule that
advances with the training steps, and a training flag read from `module.training`, not from autograd's mode."""
from __future__ import annotations

import dataclasses

import torch

from suite.api.attention import AttentionMethod, StepContext, probes
from suite.api.check_common import (
    CheckResult,
    accepted,
    attached,
    checked_batch,
    finite_diff,
    forward,
    paired_with_eval,
)
from suite.api.stochastic import AXES, stochastic_fields

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_lands", "check_mode", "check_schedule"]

LAND_SEEDS = range(2)   # training draws the landing rule pairs with evaluation calls
SCHEDULE_SEEDS = range(6)
RESPONSE = 0.03         # the least change of the dropped share across the configurations the rule compares
# a middle rate the rule also measures at: at 0.9 a method that keeps a sample's heads when all are drawn (DropHead)
# drops about as many weights as at 0.1
MIDDLE_RATE = 0.45
SCHEDULE_STEPS = 9      # a run of this many steps; the share is measured at its first, middle and last step


@dataclasses.dataclass
class Drops:
    """What the training calls of `attention()` zeroed that the evaluation call on the same inputs did not, at real
    query-key pairs: per call, (dropped, eligible), each boolean (B, H, Lq, Lk)."""
    calls: list = dataclasses.field(default_factory=list)

    @property
    def share(self) -> float:
        eligible = sum(int(e.sum()) for _, e in self.calls)
        return sum(int((d & e).sum()) for d, e in self.calls) / eligible if eligible else 0.0

    def along(self, axis: str) -> tuple[int, int, int]:
        """(entries compared, of them how many differ from the first index along `axis`, how many were dropped)."""
        dim = AXES.index(axis)  # the weights are (B, H, Lq, Lk)
        compared = differ = dropped = 0
        for d, e in self.calls:
            if axis == "query":  # a method may keep a row whole on purpose (DropAttention's fallback when a narrow
                e = e & (d & e).any(dim=-1, keepdim=True)  # window's every key was dropped): compare rows with drops
            first_d, first_e = d.narrow(dim, 0, 1), e.narrow(dim, 0, 1)
            both = e & first_e
            both = both.narrow(dim, 1, both.shape[dim] - 1)
            rest = d.narrow(dim, 1, d.shape[dim] - 1)
            compared += int(both.sum())
            differ += int((both & (rest != first_d)).sum())
            dropped += int((both & rest).sum())
        return compared, differ, dropped


def _paired_drops(method: AttentionMethod, model, seeds, before=None) -> Drops:
    """Each training call of `attention()` is paired with an evaluation call on the same inputs; a weight is dropped
    where training's is exactly 0 and evaluation's is not."""
    real = checked_batch(model)[1].bool()
    pairs = real[:, None, :, None] & real[:, None, None, :]
    found, seen = Drops(), []

    def probe(module, probs):
        seen.append(probs.detach())

    def keep(seen):
        if len(seen) == 2 and seen[0].dim() == 4 and seen[0].shape == seen[1].shape:
            train, evaluation = seen
            eligible = pairs.expand_as(train) & (evaluation != 0) & torch.isfinite(evaluation) & torch.isfinite(train)
            found.calls.append(((train == 0) & eligible, eligible))

    model.train()
    with paired_with_eval(method, seen, keep), torch.no_grad(), probes(model, probe):
        for seed in seeds:
            if before is not None:
                before()
            forward(model, *checked_batch(model), seed=seed)
    return found


def _landing(cls) -> list:
    return [s for s in stochastic_fields(cls) if s.lands == "probabilities"]


def _rate(cls, values: dict) -> float:
    cfg = cls.Config(**values)
    return max((getattr(cfg, s.field) for s in _landing(cls) if s.kind == "rate"), default=0.0)


def check_lands(cls: type[AttentionMethod], values: dict, high: dict | None, kind: str) -> list[CheckResult]:
    """Where a stochastic parameter is declared to land on the probabilities: training zeroes weights that
    evaluation keeps on the same inputs (not the values or the output), at a share no higher than the declared rate
    that moves when the rate moves (a configured rate ignored does not), and its draws are independent along the
    axes the declaration names and shared along the others."""
    setting = f"{kind}, train, probabilities"
    landing = _landing(cls)
    if not landing:
        return [CheckResult("lands", setting, None, "no stochastic parameter declared to land on the probabilities"
                            + ("" if cls.stochastic is not None else " (declare stochastic to have it measured)"))]
    middle = _raised(cls, values, MIDDLE_RATE)
    configs = [(values, "")] + ([(high, " at high rates")] if high else []) + (
        [(middle, f" at {MIDDLE_RATE}")] if middle not in (values, high) else [])
    measured = []
    for config, label in configs:
        if len(measured) == 2 and abs(measured[0][2] - measured[1][2]) >= RESPONSE:
            break  # the share moved with the rate: the middle rate is measured only where it did not
        rate = _rate(cls, config)
        if rate <= 0:
            continue
        method = cls(cls.Config(**config))
        drops = _paired_drops(method, attached(method, kind), LAND_SEEDS)
        if not drops.calls:
            return [CheckResult("lands", setting, None, "the method never calls suite.attend in training: where "
                                "its draws land cannot be measured")]
        where = f"{', '.join(f'{s.field}={config.get(s.field, getattr(cls.Config(), s.field))}' for s in landing)}"
        if drops.share > min(2 * rate + 0.1, 1.0):  # loose: a draw per sample and head is a few dozen units
            return [CheckResult("lands", setting + label, False, f"at {where} training drops {drops.share:.1%} of "
                                f"the weights, more than the declared rate {rate:g}")]
        measured.append((label, where, drops.share, drops))
    if not measured:
        return [CheckResult("lands", setting, None, "no rate declared to land on the probabilities is above 0")]
    if all(share == 0.0 for _, _, share, _ in measured):
        return [CheckResult("lands", setting, False, f"at {measured[0][1]} the probabilities handed to suite.attend "
                            "in training hold no zero that evaluation's do not: the draws land elsewhere (dropout "
                            "applied to the values, or to the attention output, instead of the probabilities?, or no "
                            "drop under torch.no_grad: see the mode rule); drop the weights (suite.probs_dropout), or "
                            "declare lands=\"elsewhere\"")]
    results = []
    shares = [share for _, _, share, _ in measured]
    if len(measured) > 1 and max(shares) - min(shares) < RESPONSE:
        told = ", ".join(f"{share:.1%} at {where}" for _, where, share, _ in measured)
        results.append(CheckResult("lands", f"{kind}, train, rate", False, f"training drops {told} of the weights: "
                                   "the configured rate is ignored (a rate hard-coded, or read from another field?); "
                                   "draw with the Config's own rate"))
    # the units are read where drops are neither rare nor nearly everywhere
    label, where, share, drops = max(measured, key=lambda m: m[2] * (1 - m[2]))
    results.append(_unit(cls, drops, f"{kind}, train, unit{label}", where) or CheckResult(
        "lands", setting, True, "training zeroes " + ", ".join(f"{s:.1%} of the weights at {w}" for _, w, s, _ in
                                                              measured) + " that evaluation keeps; draws independent "
        f"along {', '.join(_varies(cls))}"))
    return results


def _raised(cls, values: dict, rate: float) -> dict:
    """`values` with each rate landing on the probabilities raised to `rate`, in the Config's order, where the method
    accepts it together with the fields raised before it."""
    raised = dict(values)
    for s in _landing(cls):
        if s.kind == "rate" and accepted(cls, {**raised, s.field: rate}):
            raised[s.field] = rate
    return raised


def _varies(cls) -> tuple[str, ...]:
    return tuple(a for a in AXES if any(a in s.varies for s in _landing(cls)))


def _unit(cls, drops: Drops, setting: str, where: str) -> CheckResult | None:
    """A failure when the draws are shared along an axis the declaration says they vary along, or vary along one it
    says they share; None when they follow the declaration."""
    varies = _varies(cls)
    for axis in ("head", "sample", "query", "key"):
        compared, differ, dropped = drops.along(axis)
        if not compared or dropped in (0, compared):
            continue
        if axis in varies and differ == 0:
            how = {"head": "one mask shared by all heads (drawn with shape (B, 1, L, L)?)",
                   "sample": "drawn once per batch (shape (1, H, ...)?) rather than per sample",
                   "query": "one draw shared by a key's queries", "key": "one draw shared by a query's keys"}[axis]
            return CheckResult("lands", setting, False, f"at {where} every {axis} drew the same drops ({compared} "
                               f"entries compared, none differ): {how}, though the method declares its draws "
                               f"independent along {axis} (Stochastic.varies)")
        if axis not in varies and differ:
            return CheckResult("lands", setting, False, f"at {where} the drops differ along {axis} ({differ} of "
                               f"{compared} entries) though the method declares one draw per "
                               f"{', '.join(varies) or 'batch'} (Stochastic.varies): declare what it draws")
    return None


def check_schedule(cls: type[AttentionMethod], values: dict, kind: str) -> CheckResult:
    """A declared schedule advances: run as the runner runs it (setup_training, then before_step at each step), the
    share of weights dropped at the first, middle and last step of a run is not the same."""
    setting = f"{kind}, train, schedule"
    scheduled = [s for s in _landing(cls) if s.schedule]
    cfg = cls.Config(**values)
    if not scheduled or all(getattr(cfg, s.schedule) == "constant" for s in scheduled):
        return CheckResult("schedule", setting, None, "no schedule declared" if not scheduled else
                           "the declared schedule is constant here")
    method = cls(cfg)
    model = attached(method, kind)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    ctx = StepContext(model, method, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
                      torch.device("cpu"), None, grad_clip=1.0, total_steps=SCHEDULE_STEPS)
    method.setup_training(ctx)
    shares = {}
    for step in (1, (SCHEDULE_STEPS + 1) // 2, SCHEDULE_STEPS):
        ctx.step = step
        shares[step] = _paired_drops(method, model, SCHEDULE_SEEDS, lambda: method.before_step(ctx)).share
    told = ", ".join(f"{v:.1%} at step {k}" for k, v in shares.items())
    fields = ", ".join(f"{s.field} ({s.schedule}={getattr(cfg, s.schedule)!r})" for s in scheduled)
    if max(shares.values()) - min(shares.values()) < RESPONSE:
        return CheckResult("schedule", setting, False, f"the declared schedule of {fields} never advances: over "
                           f"{SCHEDULE_STEPS} steps run through setup_training and before_step, training drops "
                           f"{told}; read the step from the StepContext (ctx.step, ctx.total_steps) in before_step")
    return CheckResult("schedule", setting, True, f"the schedule of {fields} advances: {told}")


def check_mode(method_for, kind: str, rates: list[str]) -> CheckResult:
    """The training flag is `module.training`: evaluation with gradients enabled draws nothing (it equals evaluation
    under torch.no_grad), and training under torch.no_grad draws as training with gradients does."""
    setting = f"{kind}, training flag"
    if not rates:
        return CheckResult("mode", setting, None, "no stochastic parameter above 0")
    model = attached(method_for(), kind)
    batch = checked_batch(model)
    valid = batch[1].bool()

    def outputs(train: bool, grad: bool, seed: int) -> torch.Tensor:
        model.train(train)
        with torch.set_grad_enabled(grad):
            out, _ = forward(model, *batch, seed=seed)
        return out.hidden_states[-1][valid].detach()

    eval_grad, _ = finite_diff(outputs(False, False, 0), outputs(False, True, 1))
    drawn_grad, _ = finite_diff(outputs(True, True, 0), outputs(True, True, 1))
    drawn_plain, _ = finite_diff(outputs(True, False, 0), outputs(True, False, 1))
    cause = ("decide from module.training (suite.probs_dropout does), not from torch.is_grad_enabled() or a "
             "tensor's requires_grad: evaluation may run with gradients and training without them")
    if eval_grad > 0:
        return CheckResult("mode", setting, False, f"evaluation with gradients enabled differs from evaluation "
                           f"under torch.no_grad by {eval_grad:.2e}: the method draws in eval mode when gradients "
                           f"are on; {cause}")
    if drawn_grad > 0 and drawn_plain == 0:
        return CheckResult("mode", setting, False, f"training under torch.no_grad draws nothing (two passes agree) "
                           f"where training with gradients draws at {', '.join(rates)}; {cause}")
    return CheckResult("mode", setting, True, "draws follow module.training, with and without gradients")
