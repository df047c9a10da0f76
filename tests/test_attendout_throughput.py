"""AttendOut's step on a GPU's terms: no host synchronisation beyond vanilla's (counted on the CPU with
suite.profiling.counters), the K masks' batched reward passes equal one pass per mask, and no timing probe on a GPU."""
import pytest
import torch
from test_attendout import _attach, _batch, _ctx
from transformers import get_constant_schedule

import suite
from suite.methods.attendout import reward as rw
from suite.methods.attendout.cost import CostMeter
from suite.profiling.counters import counting
from suite.run.training import StepContext


def _counted_step(name: str, amp=None, **hp):
    """Counts of a method's third training step (the first two warm up lazy state) on a tiny BERT, dropout on."""
    model, method = _attach(model_kw={"hidden_dropout_prob": 0.1}, **hp) if name == "attendout" else (None, None)
    if method is None:
        from conftest import tiny_model

        model = tiny_model(hidden_dropout_prob=0.1)
        method = suite.METHODS.get(name)()
        method.attach(model)
        model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # the default reads its step counts
    ctx = StepContext(model, method, optimizer, get_constant_schedule(optimizer), torch.device("cpu"), amp, 1.0,
                      total_steps=100)
    method.setup_training(ctx)
    for i in range(2):
        ctx.step += 1
        method.training_step(ctx, _batch(seed=i), _batch(seed=i + 1))
    ctx.step += 1
    with counting() as counts:
        method.training_step(ctx, _batch(seed=2), _batch(seed=3))
    return counts


@pytest.mark.parametrize("hp", [{}, {"placebo": True}, {"baseline": "ema", "mask_samples": 1},
                                {"baseline": "rloo", "mask_samples": 2}, {"baseline": "defender", "mask_samples": 3},
                                {"credit": "batch", "g_accumulate": 2},
                                {"entropy_coef": 0.1, "rate_penalty": 1.0, "cost_every": 1}, {"amp": torch.bfloat16}],
                         ids=["default", "placebo", "ema", "rloo", "defender-3", "batch-credit", "entropy-rate-probe",
                              "bf16"])
def test_a_step_waits_for_the_host_no_more_than_vanilla(hp):
    """Every .item(), float(t), copy to the host or data-dependent shape stalls a GPU; AttendOut adds none (it used
    to add about 30 per step: reward statistics, seeding its masks, G's Adam, the diagnostics' copies)."""
    hp = dict(hp)
    amp = hp.pop("amp", None)
    vanilla = _counted_step("vanilla", amp)
    attendout = _counted_step("attendout", amp, **hp)
    assert attendout.syncs <= vanilla.syncs, (attendout.sync_kinds, vanilla.sync_kinds)
    assert attendout.ops > vanilla.ops  # it did run its reward passes


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_batched_reward_passes_equal_one_pass_per_mask(amp):
    """The rewards of the K masks from one batched pass per point (the batch repeated K times, one mask per copy, one
    hidden-dropout mask shared by the copies) equal K separate passes, one mask at a time, under the same masks and
    random state, in float64. Under autocast the training forward's base is redone in fp32, as before."""
    model, method = _attach(seed=3, model_kw={"hidden_dropout_prob": 0.2}, p_max=0.5, p_init=0.2, mask_samples=3,
                            cost_every=0)
    model.double()  # autocast leaves float64 alone: the batched and the looped rewards are then exact to rounding
    base = _ctx(model, method)
    ctx = StepContext(model, method, base.optimizer, base.scheduler, base.device, amp, base.grad_clip, total_steps=100)
    batch, nxt = _batch(seed=0), _batch(seed=1)
    found = {}

    def looped(update):  # a reward hook: runs inside the step, before the weights move
        torch.manual_seed(11)
        state = rw.RandomState(torch.device("cpu"))  # the state the step's training forward started from
        v = rw.next_batch_gradient(model, nxt)
        eps = rw.probe_size(method.cfg.fd_decrease, rw.squared_norm(v))
        moved = rw.shifted(model, v, eps)
        per_mask = []
        for masks in update.samples:
            replayed = {s.layer: ("drop", s.drop) for s in masks}
            with torch.no_grad(), method.forward_mode("replay", state, copies=1, masks=replayed):
                base_losses = rw.losses_at(model, None, batch)
            replay = method.forward_mode("replay", state, copies=1)
            per_mask.append(rw.alignment_rewards(model, batch, base_losses, moved, eps, ctx.lr, replay))
        found["batched"], found["looped"] = update.rewards, torch.stack(per_mask)
        found["distinct"] = not torch.equal(update.samples[0][0].drop, update.samples[1][0].drop)

    method.reward_hooks.append(looped)
    torch.manual_seed(11)
    method.training_step(ctx, batch, nxt)
    assert found["batched"].shape == (3, 4) and found["distinct"]
    torch.testing.assert_close(found["batched"], found["looped"], rtol=1e-7, atol=1e-12)
    assert found["batched"].abs().min() > 0


def test_tiled_dropout_shares_one_draw_among_copies():
    x = torch.randn(3, 5, 6)
    torch.manual_seed(0)
    one = rw.tiled_dropout(x, 0.3, 1)
    torch.manual_seed(0)
    three = rw.tiled_dropout(torch.cat([x, 2 * x, x]), 0.3, 3)
    torch.testing.assert_close(three, torch.cat([one, 2 * one, one]))
    kept = (one != 0).float().mean()
    assert 0.5 < kept < 0.9 and torch.allclose(one[one != 0], x[one != 0] / 0.7)


def test_shifting_in_place_is_the_same_arithmetic():
    model, _ = _attach()
    v = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    eps = torch.tensor(1e-3, dtype=torch.float64)
    fresh = rw.shifted(model, v, eps)
    in_place = rw.shifted(model, {n: t.clone() for n, t in v.items()}, eps, inplace=True)
    assert all(torch.equal(fresh[n], in_place[n]) for n in fresh)


def test_a_zero_look_ahead_direction_rewards_nothing():
    """v = 0: the first-order reward of every mask is 0, computed without a branch on the value."""
    model, method = _attach(cost_every=0)
    eps = rw.probe_size(1e-2, torch.zeros((), dtype=torch.float64))
    assert torch.isfinite(eps)
    zero = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    moved = rw.shifted(model, zero, eps)
    assert all(torch.equal(moved[n], p) for n, p in model.named_parameters())


def test_the_cost_probe_times_cpu_steps_only():
    """Timing a step on a GPU needs host syncs that drain its queue: no probe there, and the record says so."""
    _, method = _attach(cost_every=2)
    every = method.cfg.cost_every
    assert method.cost.due(1, every, torch.device("cpu")) and not method.cost.due(1, every, torch.device("cuda"))
    assert not method.cost.due(2, every, torch.device("cpu"))
    meter = CostMeter()
    meter.device = "cuda"
    meter.add_untimed_step()
    summary = meter.summary()
    assert summary["step_ratio"] is None and "not measured in-run on cuda" in summary["note"]
    meter.device = "cpu"
    assert meter.summary()["note"] is None
