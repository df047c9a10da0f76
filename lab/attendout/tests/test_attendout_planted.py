"""The planted-reward positive control: G learns a planted signal in the rewarded layer only, a placebo moves G no
further than noise does, and a planted reward of strength 0 is indistinguishable from the placebo."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import get_constant_schedule

from lab.attendout.planted import PlantedReward, layer_drop_share, planted_rewards
from suite.api.attention import StepContext
from suite.methods.attendout import AttendOut, AttendOutConfig, MaskSample
from suite.testing import tiny_model

pytestmark = pytest.mark.slow  # the slow tier (about 100 s): `python -m pytest -m slow`

STEPS = 160        # G updates per run (the planted layer rises about 2.4x beyond the band by then)
G_LR = 3e-3
P_MAX = 0.9        # room to move: at the default cap 0.3 a drift from 0.1 saturates near the noise's size
STRENGTH = 3.0     # planted signal / noise per reward
BAND_FACTOR = 2.0  # a change counts as movement only beyond twice the largest placebo change
LOO = {"baseline": "rloo", "mask_samples": 2}  # the control's baseline: a planted reward leaves a Defender's real


def batches(n: int, vocab: int, size: int = 16, length: int = 12) -> list[dict]:
    """Padded batches of random tokens (lengths 6 to `length`) with a learnable label."""
    g = torch.Generator().manual_seed(100)
    out = []
    for _ in range(n):
        ids = torch.randint(3, vocab, (size, length), generator=g)
        lengths = torch.randint(6, length + 1, (size,), generator=g)
        mask = (torch.arange(length)[None] < lengths[:, None]).long()
        ids[mask == 0] = 0
        labels = (ids[:, 1] % 2).long()  # a learnable rule, so the model's gradients carry information
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


@torch.no_grad()
def mean_policy(method: AttendOut, states) -> np.ndarray:
    """G's mean drop probability per layer over the valid pairs of a fixed reference input."""
    out = []
    for layer, h in enumerate(states["hidden"]):
        pi = method.cfg.p_max * torch.sigmoid(method.generator(h, layer))
        out.append(float(pi[states["valid"]].mean()))
    return np.array(out)


def reference(model, batch) -> dict:
    model.eval()
    with torch.no_grad():
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       output_hidden_states=True).hidden_states[:-1]
    model.train()
    mask = batch["attention_mask"].bool()
    valid = mask[:, :, None] & mask[:, None, :] & ~torch.eye(mask.shape[1], dtype=torch.bool)
    return {"hidden": [h.float() for h in hidden], "valid": valid}


def drift(arm: str, strength: float = 0.0, seed: int = 0) -> np.ndarray:
    """Per layer, G's mean drop probability after STEPS updates minus before, on a fixed reference input."""
    torch.manual_seed(seed)
    model = tiny_model(seed=0)
    method = AttendOut(AttendOutConfig(p_max=P_MAX, g_lr=G_LR, placebo=arm == "placebo", cost_every=0, **LOO))
    torch.manual_seed(seed)
    method.attach(model)
    data = batches(STEPS + 1, model.config.vocab_size)
    states = reference(model, data[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx = StepContext(model, method, optimizer, get_constant_schedule(optimizer), torch.device("cpu"), None, 1.0,
                      total_steps=STEPS)
    method.setup_training(ctx)
    if arm == "planted":
        PlantedReward(method, strength, layer=0, seed=seed + 1)
    start = mean_policy(method, states)
    for step in range(STEPS):
        ctx.step = step + 1
        method.training_step(ctx, data[step], data[step + 1])
    assert method.policy.updates == STEPS
    return mean_policy(method, states) - start


@pytest.fixture(scope="module")
def placebo_band() -> float:
    """Twice the largest change of a placebo run in any layer (noise of the same spread, no signal)."""
    return BAND_FACTOR * float(np.abs(drift("placebo", seed=0)).max())


@pytest.mark.parametrize("strength, learns", [(STRENGTH, True), (0.0, False)])
def test_planted_reward_moves_the_rewarded_layer_only(placebo_band, strength, learns):
    change = drift("planted", strength, seed=0)
    # layer 0 is rewarded for dropping more: it must rise beyond the placebo band, and only with a planted signal.
    # The unrewarded layer's end point is not compared with one placebo run: under Adam its zero-mean gradient still
    # random-walks with heavy tails (seed 4 of the earlier code: 0.33 against a band of 0.002; this code's seed 0:
    # 0.46), so whether layer 1 gets any signal is tested on its expected gradient below.
    assert (change[0] > placebo_band) == learns, (change, placebo_band)
    if not learns:
        assert abs(change[1]) <= placebo_band, (change, placebo_band)


class _Frozen(torch.optim.SGD):
    """A learning rate for the look-ahead, but no update: the policy gradients are all taken at one point."""

    @torch.no_grad()
    def step(self, closure=None):
        return None


def test_planted_reward_gives_only_the_rewarded_layer_an_expected_gradient():
    """At fixed weights (model and G), over many reward steps, the policy gradient moves layer 0's mean drop rate on
    the reference input in one direction (t > 5) and layer 1's by no more than chance (|t| < 3)."""
    torch.manual_seed(0)
    model = tiny_model(seed=0)
    method = AttendOut(AttendOutConfig(p_max=P_MAX, g_lr=1e-30, cost_every=0, **LOO))  # G's steps vanish
    method.attach(model)
    data = batches(3, model.config.vocab_size)
    states = reference(model, data[0])
    optimizer = _Frozen(model.parameters(), lr=1e-3)
    ctx = StepContext(model, method, optimizer, get_constant_schedule(optimizer), torch.device("cpu"), None, 1.0,
                      total_steps=STEPS)
    method.setup_training(ctx)
    PlantedReward(method, STRENGTH, layer=0, seed=1)
    g = method.generator
    per_layer = [[g.query[i].weight, g.key[i].weight] for i in range(2)]
    rate = [P_MAX * torch.sigmoid(g(h, i))[states["valid"]].mean() for i, h in enumerate(states["hidden"])]
    towards = [torch.autograd.grad(r, ps) for r, ps in zip(rate, per_layer)]  # raising each layer's mean rate
    moves = [[], []]
    step = method.policy.optimizer.step

    def record(*args, **kwargs):  # -grad . d(rate)/d(params): the first-order change of a gradient step
        for i, (ps, d) in enumerate(zip(per_layer, towards)):
            moves[i].append(-float(sum((p.grad * x).sum() for p, x in zip(ps, d))))
        return step(*args, **kwargs)

    method.policy.optimizer.step = record
    for i in range(STEPS):
        ctx.step = i + 1
        method.training_step(ctx, data[i % 2], data[i % 2 + 1])
    t = [np.mean(m) / (np.std(m) / np.sqrt(len(m))) for m in moves]
    assert t[0] > 5 and abs(t[1]) < 3, t


def test_planted_reward_pays_for_the_layer_share():
    """By hand: two masks on one sample, the first dropping more of layer 0; at a large strength it is paid more."""
    valid = torch.ones(1, 4, 4, dtype=torch.bool)
    drops = [torch.zeros(1, 4, 4, dtype=torch.bool), torch.zeros(1, 4, 4, dtype=torch.bool)]
    drops[0][0, 0, 1:] = True   # 3 of 16 pairs of layer 0
    drops[1][0, 0, 1] = True    # 1 of 16
    samples = [[MaskSample(0, torch.zeros(1, 4, 4), d, valid), MaskSample(1, torch.zeros(1, 4, 4), d, valid)]
               for d in drops]
    assert layer_drop_share(samples[0], 0).tolist() == [3 / 16]
    real = torch.tensor([[1.0], [3.0]])  # std sqrt(2): the planted reward's scale
    g = torch.Generator().manual_seed(0)
    planted = planted_rewards(real, samples, strength=1e6, layer=0, generator=g)
    assert planted[0, 0] > planted[1, 0]
    # standardised shares are +-1/sqrt(2) (unbiased std of two values) and sigma = std(real) = sqrt(2): +-1e6
    assert float(planted[0, 0]) == pytest.approx(1e6, rel=1e-4)
    noise_only = planted_rewards(real, samples, strength=0.0, layer=0, generator=torch.Generator().manual_seed(0))
    expected = 2 ** 0.5 * torch.randn((2, 1), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(noise_only.double(), expected, atol=1e-6)


@pytest.mark.parametrize("baseline, k", [("defender", 4), ("rloo", 3)])
def test_added_reward_adds_beta_z_to_the_advantage(baseline, k):
    """The added term moves the advantage G forms by exactly beta * z, and over many units its correlation with the
    layer's (baseline-centred) share is c when the real reward carries none."""
    from lab.attendout.planted import AddedReward, baseline_advantage, centred_shares, standardised

    g = torch.Generator().manual_seed(0)
    b, c = 400, 0.3
    valid = torch.ones(b, 6, 6, dtype=torch.bool)
    samples = [[MaskSample(layer, torch.zeros(b, 6, 6), torch.rand(b, 6, 6, generator=g) < 0.2, valid)
                for layer in range(2)] for _ in range(k)]
    rewards, defender = torch.randn(k, b, generator=g), torch.randn(b, generator=g)

    class Stub:  # what AddedReward reads from the method
        cfg = AttendOutConfig(baseline=baseline, mask_samples=k)
        reward_hooks: list = []

    added = AddedReward(Stub(), c, layer=1)
    term = added.term(rewards, defender, samples)
    d = defender if baseline == "defender" else None
    moved = baseline_advantage(rewards + term, d, baseline) - baseline_advantage(rewards, d, baseline)
    z = standardised(centred_shares(samples, 1, baseline))
    beta = c / (1 - c * c) ** 0.5 * baseline_advantage(rewards, d, baseline).std()
    assert torch.allclose(moved, beta * z, atol=1e-9)
    corr = np.corrcoef(baseline_advantage(rewards + term, d, baseline).ravel(), z.ravel())[0, 1]
    assert abs(corr - c) < 0.05, corr  # the real part is independent noise: its correlation is 0 +- 1/sqrt(k b)


def test_added_reward_refuses_a_placebo():
    from lab.attendout.planted import AddedReward

    method = AttendOut(AttendOutConfig(placebo=True))
    with pytest.raises(ValueError, match="placebo"):
        AddedReward(method, 0.1)
