"""AttendOut (reconstruction): the generator's gradients, masks and log-probabilities, the first-order reward against
autograd's per-sample gradients, leave-one-out advantages, the placebo, the masked update, no reward at lr 0, the
interleaved cost (never below 1), and an end-to-end run."""
import dataclasses

import pytest
import torch
from conftest import padded_batch, tiny_model
from transformers import get_linear_schedule_with_warmup

import suite
from suite.api.attention import HyperParameterError
from suite.methods.attendout import AttendOut, valid_pairs
from suite.methods.attendout import reward as rw
from suite.methods.attendout.cost import CostMeter
from suite.methods.attendout.generator import drop_shares, policy_terms
from suite.methods.attendout.policy import leave_one_out
from suite.run.training import StepContext


def _attach(seed=0, model_seed=0, model_kw=None, **hp):
    model = tiny_model(seed=model_seed, **(model_kw or {}))
    torch.manual_seed(seed)
    method = AttendOut(AttendOut.Config(**hp))
    method.attach(model)
    model.train()
    method.setup_training(_ctx(model, method))
    return model, method


def _batch(seed=0, batch=4, length=12, vocab=40):
    ids, mask = padded_batch(batch, length, vocab, seed)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.arange(batch) % 2}


def _ctx(model, method, lr=1e-3, warmup=0):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = get_linear_schedule_with_warmup(opt, warmup, 100)
    return StepContext(model, method, opt, sched, torch.device("cpu"), None, 1.0, total_steps=100)


def _g_params(method):
    return list(method.generator.parameters())


def _collect(method, model, batch):
    """One forward that draws masks from G and keeps G's graph; returns the samples."""
    method.collect = True
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    method.collect = False
    return method.take_samples()


def _mean_pi(method, model, batch):
    """Mean drop probability of G over the batch's valid pairs (one forward, nothing kept)."""
    method.epoch_record()
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    rates = method.epoch_record()["drop_rate_per_layer"]
    return sum(rates) / len(rates)


def test_generator_is_outside_the_model():
    model, method = _attach()
    ids = {id(p) for p in model.parameters()}
    assert not any(id(p) in ids for p in _g_params(method))
    assert method.training_only_parameters() == sum(p.numel() for p in _g_params(method)) > 0
    assert not any("generator" in k for k in model.state_dict())
    hidden, layers = model.config.hidden_size, model.config.num_hidden_layers
    assert method.training_only_parameters() == layers * (2 * hidden * 32 + 1)  # Wq, Wk and a bias per layer
    _, shared = _attach(shared_generator=True, d_g=8)
    assert shared.training_only_parameters() == 2 * hidden * 8 + 1 + layers * hidden


def test_generator_gets_gradient_only_from_the_policy_loss():
    model, method = _attach()
    batch = _batch()
    method.collect = True
    loss = model(**batch).loss
    method.collect = False
    samples = method.take_samples()
    assert len(samples) == model.config.num_hidden_layers
    loss.backward()
    assert all(p.grad is None for p in _g_params(method))  # the task loss never reaches G
    model.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in _g_params(method)]
    method.policy.update([samples, _collect(method, model, batch)], torch.tensor([[1.0] * 4, [-1.0] * 4]))
    assert all(p.grad is None for p in model.parameters())  # G reads detached states: nothing flows back
    assert any(not torch.equal(a, p) for a, p in zip(before, _g_params(method)))


def test_masks_keep_padding_masked_and_never_drop_the_diagonal():
    model, method = _attach(p_max=0.9, p_init=0.6)
    batch = _batch(length=16)
    seen = []
    for m in suite.api.attention.attention_modules(model):
        m.suite_probe = lambda module, probs: seen.append(probs.detach())
    method.collect = True
    model(**batch)
    method.collect = False
    valid_key = batch["attention_mask"].bool()
    real_query = valid_key[:, None, :, None]
    dropped_share = []
    for probs, sample in zip(seen, method.take_samples()):
        assert torch.isfinite(probs).all()
        assert (probs.masked_fill(~real_query, 0)[~valid_key[:, None, None, :].expand_as(probs)] == 0).all()
        assert (probs.diagonal(dim1=-2, dim2=-1)[real_query[..., 0].expand(-1, probs.shape[1], -1)] > 0).all()
        assert not sample.drop.diagonal(dim1=-2, dim2=-1).any()
        assert not (sample.drop & ~sample.valid).any()
        zero = probs == 0  # the mask is shared across heads and is what zeroes the probabilities
        assert torch.equal(zero & real_query & valid_key[:, None, None, :], sample.drop[:, None].expand_as(zero))
        dropped_share.append(sample.drop.sum() / sample.valid.expand_as(sample.drop).sum())
    assert 0.3 < float(sum(dropped_share) / len(dropped_share)) < 0.8  # the check above is not vacuous


def test_valid_pairs_exclude_padding_and_diagonal():
    _, mask = padded_batch(3, 6)
    additive = torch.zeros(3, 1, 6, 6).masked_fill(~mask.bool()[:, None, None, :], torch.finfo(torch.float32).min)
    real = mask.bool()
    expected = real[:, :, None] & real[:, None, :] & ~torch.eye(6, dtype=torch.bool)
    assert torch.equal(valid_pairs(additive, 6, "cpu"), expected)
    assert torch.equal(valid_pairs(None, 6, "cpu")[0], ~torch.eye(6, dtype=torch.bool))


def test_policy_terms_of_k_masks_match_bernoulli_per_mask():
    """The batched log p(m), entropy, summed pi and drop shares of K masks against torch's Bernoulli, one mask at a
    time, on valid pairs only (a padded batch)."""
    model, method = _attach(p_max=0.5, p_init=0.2)
    batch = _batch(length=10)
    masks = [_collect(method, model, batch) for _ in range(3)]
    logp, entropy, pi_sum, pairs = policy_terms(masks, 0.5, entropy=True, rate=True)
    assert logp.shape == entropy.shape == (3, 4)
    shares = drop_shares(masks)
    all_pi, all_pairs = 0.0, 0.0
    for k, samples in enumerate(masks):
        lp = ent = dropped = valid_pairs_k = 0.0
        for s in samples:
            bernoulli = torch.distributions.Bernoulli(probs=0.5 * torch.sigmoid(s.logits))
            v = s.valid.expand_as(s.logits).float()
            lp = lp + (bernoulli.log_prob(s.drop.float()) * v).sum((-1, -2))
            ent = ent + (bernoulli.entropy() * v).sum((-1, -2))
            dropped, valid_pairs_k = dropped + (s.drop.float() * v).sum((-1, -2)), valid_pairs_k + v.sum((-1, -2))
            all_pi, all_pairs = all_pi + (bernoulli.probs * v).sum(), all_pairs + v.sum()
        torch.testing.assert_close(logp[k], lp, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(entropy[k], ent, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(shares[k], dropped / valid_pairs_k)
    torch.testing.assert_close(pi_sum, all_pi, rtol=1e-5, atol=1e-4)
    assert float(pairs) == float(all_pairs)


def test_first_order_reward_matches_autograd_per_sample_gradients():
    """eta * v . grad l_i under a fixed mask and hidden-dropout draws, against autograd in float64."""
    model, method = _attach(model_kw={"hidden_dropout_prob": 0.2}, p_max=0.5, p_init=0.2)
    model.double()  # G stays in fp32: it reads the states as fp32, the masks are what matter
    batch, nxt = _batch(seed=0), _batch(seed=1)
    v = rw.next_batch_gradient(model, nxt)
    state = rw.RandomState(torch.device("cpu"))
    with method.forward_mode("attacker", state):
        base = rw.losses_at(model, None, batch)
    eps = 1e-6 / rw.squared_norm(v)
    replay = method.forward_mode("replay", state)
    got = rw.alignment_rewards(model, batch, base, rw.shifted(model, v, eps), eps, 0.5, replay)
    expected = []
    for i in range(4):  # autograd: the same masks and draws, one sample's loss at a time
        with method.forward_mode("replay", state):
            li = rw.losses_at(model, None, batch)[i]
        g = torch.autograd.grad(li, [p for n, p in rw.trainable(model).items() if n in v])
        expected.append(0.5 * sum((a * b).sum() for a, b in zip(g, v.values())))
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-4, atol=1e-9)
    assert got.abs().min() > 0


def test_leave_one_out_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0], [3.0, 6.0], [5.0, 3.0]])
    expected = torch.tensor([[1 - 4.0, 0 - 4.5], [3 - 3.0, 6 - 1.5], [5 - 2.0, 3 - 3.0]])
    torch.testing.assert_close(leave_one_out(r), expected)


def _toy_run(sign, updates=15, **hp):
    """Policy updates whose reward is +-the share of pairs each sample's mask drops (RLOO over 2 masks)."""
    model, method = _attach(g_lr=0.02, baseline="rloo", mask_samples=2, **hp)
    batch = _batch(length=16)
    start = _mean_pi(method, model, batch)
    for _ in range(updates):
        samples = [_collect(method, model, batch) for _ in range(2)]
        shares = torch.stack([sum(s.drop.sum((-1, -2)).float() for s in k) for k in samples])
        adv = method.policy.advantages(sign * shares)
        method.policy.update(samples, adv)
    return start, _mean_pi(method, model, batch), method


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_policy_moves_the_drop_rate_in_the_direction_of_its_reward(sign):
    start, end, _ = _toy_run(sign)
    assert start == pytest.approx(0.1, abs=0.02)  # p_init
    assert (end > start + 0.04) if sign > 0 else (end < start - 0.04)


def test_placebo_ignores_the_reward():
    """With the placebo, opposite rewards give the same G: only the advantages' spread reaches the policy."""
    _, end_up, up = _toy_run(1.0, updates=8, placebo=True)
    _, end_down, down = _toy_run(-1.0, updates=8, placebo=True)
    assert end_up == pytest.approx(end_down, abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(_g_params(up), _g_params(down)))


def test_entropy_bonus_raises_capped_drop_rates_without_reward_signal():
    """pi <= p_max < 0.5, so the Bernoulli entropy grows with pi: the bonus alone pushes rates up."""
    model, method = _attach(g_lr=0.01, entropy_coef=1.0, baseline="ema", mask_samples=1)
    batch = _batch(length=16)
    start = _mean_pi(method, model, batch)
    for _ in range(10):
        adv = method.policy.advantages(torch.full((1, 4), 0.5))
        samples = [_collect(method, model, batch)]
        method.policy.update(samples, torch.zeros(1, 4) if adv is None else adv)
        assert adv is None or adv.abs().max() < 1e-6  # a constant reward: no signal
    assert _mean_pi(method, model, batch) > start + 0.01


def test_attacker_update_uses_the_masked_gradient():
    """A reward step moves the Attacker exactly as a plain step under the same sampled masks would."""
    batch, nxt = _batch(seed=0), _batch(seed=1)
    results = []
    for reward in (True, False):
        model, method = _attach(seed=3, model_kw={"hidden_dropout_prob": 0.1}, cost_every=0)
        ctx = _ctx(model, method)
        torch.manual_seed(7)
        method.training_step(ctx, batch, nxt if reward else None)
        assert method._epoch["g_updates"] == (1 if reward else 0)
        results.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for n in results[0]:
        torch.testing.assert_close(results[0][n], results[1][n], rtol=0, atol=0)
    assert any(not torch.equal(p, results[0][n]) for n, p in tiny_model(seed=0).named_parameters())


def test_no_reward_or_policy_update_while_the_learning_rate_is_zero():
    model, method = _attach(cost_every=0)
    ctx = _ctx(model, method, warmup=5)  # linear warm-up: the first step's learning rate is 0
    before = [p.detach().clone() for p in _g_params(method)]
    method.training_step(ctx, _batch(seed=0), _batch(seed=1))
    assert all(torch.equal(a, p) for a, p in zip(before, _g_params(method)))
    entry = method.epoch_record()
    assert entry["skipped_zero_lr"] == 1 and entry["rewards"] == 0
    method.training_step(ctx, _batch(seed=1), _batch(seed=2))  # lr > 0 now
    assert method.epoch_record()["g_updates"] == 1


def test_cost_probe_leaves_training_unchanged():
    params = []
    for every in (0, 1):
        model, method = _attach(seed=5, model_kw={"hidden_dropout_prob": 0.1}, cost_every=every)
        ctx = _ctx(model, method)
        for i in range(3):
            method.training_step(ctx, _batch(seed=i), _batch(seed=i + 1))
        params.append([p.detach().clone() for p in [*model.parameters(), *_g_params(method)]])
        assert method.cost.summary()["paired_steps"] == 3 * every
    assert all(torch.equal(a, b) for a, b in zip(*params))


def test_cost_ratio_is_interleaved_sums_and_never_below_one():
    meter = CostMeter()
    meter.add_pair(3.0, 0.8, 0.2)  # vanilla step 1.0
    meter.add_pair(5.0, 1.5, 0.5)  # vanilla step 2.0
    assert meter.summary()["measured_step_ratio"] == pytest.approx(8.0 / 3.0)
    noisy = CostMeter()
    noisy.add_pair(0.9, 0.9, 0.1)  # timing noise: AttendOut cannot be cheaper than vanilla
    s = noisy.summary()
    assert s["measured_step_ratio"] == pytest.approx(0.9) and s["step_ratio"] == 1.0
    assert CostMeter().summary()["step_ratio"] is None


def test_identity_and_eval_are_plain_softmax():
    model, method = _attach(p_max=0.3)
    batch = _batch()
    ref = tiny_model()
    ref.eval()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, ref(**batch).logits)
    assert method._samples == [] and method._hidden == {}  # G is not used at test time


@pytest.mark.parametrize("hp", [{"p_init": 0.3}, {"p_max": 1.0}, {"baseline": "mean"}, {"credit": "token"},
                                {"baseline": "rloo", "mask_samples": 1}, {"mask_samples": 0}, {"g_update_every": 0},
                                {"g_accumulate": 0}, {"rate_target": 1.5}, {"lookahead_lr": 0.0}, {"d_g": 0},
                                {"fd_decrease": 0.0},
                                {"entropy_coef": float("nan")}, {"rate_penalty": float("inf")},
                                {"reward_scale_floor": float("nan")}])
def test_impossible_hyper_parameters_are_rejected(hp):
    with pytest.raises(HyperParameterError):
        AttendOut(AttendOut.Config(**hp))


@pytest.mark.parametrize("hp", [{"baseline": "rloo", "mask_samples": 2}, {"baseline": "defender", "mask_samples": 2},
                                {"credit": "batch", "g_accumulate": 2},
                                {"baseline": "ema", "mask_samples": 1, "credit": "batch"}])
def test_other_baselines_and_credit_train(hp):
    model, method = _attach(cost_every=0, **hp)
    ctx = _ctx(model, method)
    for i in range(2):
        method.training_step(ctx, _batch(seed=i), _batch(seed=i + 1))
    r = method.last_reward
    assert r["rewards"].shape == (hp.get("mask_samples", 1), 4)
    assert (r["defender"] is not None) == (hp.get("baseline", "defender") == "defender")
    # g_accumulate=2 steps G once per two rewards; the ema baseline has no history at the first reward, so G first
    # steps at the second
    assert method.policy.updates == (1 if hp.get("g_accumulate") == 2 or hp.get("baseline") == "ema" else 2)


def test_g_update_every_skips_rewards_but_applies_masks():
    model, method = _attach(g_update_every=3, cost_every=0)
    ctx = _ctx(model, method)
    batches = [_batch(seed=i) for i in range(7)]
    for i in range(6):
        method.training_step(ctx, batches[i], batches[i + 1])
    method.training_step(ctx, batches[6], None)  # last batch of the epoch: no reward
    entry = method.epoch_record()
    assert entry["rewards"] == 2 and entry["g_updates"] == 2  # steps 1 and 4
    assert all(r is not None and r > 0 for r in entry["sampled_drop_rate_per_layer"])
    assert method.cost.summary()["steps"] == 7


def test_runner_end_to_end_records_traces_and_cost(tiny_bert_dir, glue_dir):
    from suite.run.runner import run_one
    from suite.run.settings import RunConfig, TrainSettings

    train = TrainSettings(epochs=2, batch_size=8, eval_batch_size=16, max_length=64, max_train_samples=24,
                          train_eval_samples=8, stats_batches=1, lr=1e-3, warmup_ratio=0.0)
    hp = dict(suite.METHODS.get("attendout").Config().__dict__, cost_every=2)
    rec = run_one(RunConfig(tiny_bert_dir, "rte", "attendout", hp, 1, train), data_dir=glue_dir, device="cpu",
                  quiet=True)
    assert rec.status == "ok", rec.traceback
    assert len(rec.history) == 2
    for e in rec.history:
        m = e.method
        assert len(m["drop_rate_per_layer"]) == 2 and all(0 < r < 0.3 for r in m["drop_rate_per_layer"])
        assert m["rewards"] == 2 and m["reward_mean"] is not None  # 3 batches per epoch, the last has no reward
    mr = rec.method_record
    assert mr["drop_rate_per_layer"] == rec.history[-1].method["drop_rate_per_layer"]
    assert len(mr["reward_trace"]) == 2 and mr["g_updates"] == 4
    assert mr["g_parameters"] == rec.parameters.training_only > 0
    assert rec.parameters.extra == 0  # G is not part of the saved model
    cost = mr["cost"]
    assert cost["steps"] == 6 and cost["paired_steps"] == 3
    assert cost["step_ratio"] >= 1 and cost["measured_step_ratio"] > 0 and cost["vanilla_step_s"] > 0
    assert cost["peak_memory_mb"] is None  # CPU: no per-allocator peak to compare


@pytest.mark.parametrize("name", ["cpu:0", "cpu"])
def test_the_generator_keeps_its_policy_on_the_same_device_under_another_name(name):
    """`cpu:0` (like `cuda` against `cuda:0` on a GPU) names the device G already sits on: G's optimizer, baseline
    and advantage scale must survive every step, so G keeps updating."""
    model, method = _attach(cost_every=0)
    policy = method.policy
    ctx = dataclasses.replace(_ctx(model, method), device=torch.device(name))
    for i in range(3):
        method.training_step(ctx, _batch(seed=i), _batch(seed=i + 1))
    assert method.policy is policy and policy.updates == 3


def test_same_device_treats_an_index_and_its_absence_alike():
    from suite.api.attention import same_device

    assert same_device("cpu", "cpu:0") and same_device(torch.device("cpu:0"), "cpu")
    assert not same_device("cpu", "meta")


def test_k_masks_are_each_compared_with_the_defender():
    """baseline=defender with K = 3: K x B advantage units, each a mask's reward minus the Defender's reward on the
    same sample (one normalisation for all), and the K masks differ."""
    model, method = _attach(cost_every=0, baseline="defender", mask_samples=3, p_max=0.9, p_init=0.4)
    ctx = _ctx(model, method)
    method.training_step(ctx, _batch(seed=0, batch=6), _batch(seed=1, batch=6))
    r = method.last_reward
    assert r["rewards"].shape == (3, 6) and r["defender"].shape == (6,) and r["advantages"].shape == (3, 6)
    raw = (r["rewards"].double() - r["defender"].double()[None])
    inside = r["advantages"].abs() < method.cfg.advantage_clip  # clipped units say nothing about the scale
    ratio = raw[inside] / r["advantages"].double()[inside]
    assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-4)
    shares = r["drop_share"]
    assert not torch.equal(shares[0], shares[1])
