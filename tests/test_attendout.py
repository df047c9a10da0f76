"""AttendOut (reconstruction, methods.md §3.3): the generator's gradients, masks, log-probabilities, the Defender's
synchronisation, the Attacker's masked update, the policy following its reward, and an end-to-end run."""
import pytest
import torch
from transformers import get_linear_schedule_with_warmup

import suite
from conftest import padded_batch, tiny_model
from suite.methods.attendout import AttendOut, valid_pairs
from suite.attention import HyperParameterError
from suite.runner import StepContext


def _attach(seed=0, model_seed=0, **hp):
    model = tiny_model(seed=model_seed)
    torch.manual_seed(seed)
    method = AttendOut(AttendOut.Config(**hp))
    method.attach(model)
    model.train()
    return model, method


def _batch(seed=0, batch=4, length=12, vocab=40):
    ids, mask = padded_batch(batch, length, vocab, seed)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.arange(batch) % 2}


def _ctx(model, method, lr=1e-3):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = get_linear_schedule_with_warmup(opt, 0, 100)
    ctx = StepContext(model, method, opt, sched, torch.device("cpu"), None, 1.0)
    method.setup_training(ctx)
    return ctx


def _g_params(method):
    return list(method.generator.parameters())


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
    assert method.training_only_parameters == sum(p.numel() for p in _g_params(method)) > 0
    assert not any("generator" in k for k in model.state_dict())
    # per layer: Wq, Wk (hidden x d_g) and a bias; shared: one of each plus a layer embedding
    hidden, layers = model.config.hidden_size, model.config.num_hidden_layers
    assert method.training_only_parameters == layers * (2 * hidden * 32 + 1)
    _, shared = _attach(shared_generator=True, d_g=8)
    assert shared.training_only_parameters == 2 * hidden * 8 + 1 + layers * hidden


def test_generator_gets_gradient_only_from_the_policy_loss():
    model, method = _attach()
    batch = _batch()
    method.collect = True
    loss = model(**batch).loss
    method.collect = False
    assert len(method._samples) == model.config.num_hidden_layers
    loss.backward()
    assert all(p.grad is None for p in _g_params(method))  # the task loss never reaches G
    assert any(p.grad is not None for p in model.parameters())
    method.policy_update(torch.tensor(1.0))   # sets the baseline
    method.collect = True
    model(**batch)
    method.collect = False
    before = [p.detach().clone() for p in _g_params(method)]
    model.zero_grad(set_to_none=True)
    method.policy_update(torch.tensor(2.0))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in _g_params(method))
    assert all(p.grad is None for p in model.parameters())  # G reads detached states: nothing flows back
    assert any(not torch.equal(a, p) for a, p in zip(before, _g_params(method)))


def test_masks_keep_padding_masked_and_never_drop_the_diagonal():
    model, method = _attach(p_max=0.9, p_init=0.6)
    batch = _batch(length=16)
    seen = []
    for m in suite.attention.attention_modules(model):
        m.suite_probe = lambda module, probs: seen.append(probs.detach())
    method.collect = True
    model(**batch)
    method.collect = False
    valid_key = batch["attention_mask"].bool()
    real_query = valid_key[:, None, :, None]
    dropped_share = []
    for probs, sample in zip(seen, method._samples):
        assert torch.isfinite(probs).all()
        # padded keys get no weight from real queries, dropped or not
        assert (probs.masked_fill(~real_query, 0)[~valid_key[:, None, None, :].expand_as(probs)] == 0).all()
        assert (probs.diagonal(dim1=-2, dim2=-1)[real_query[..., 0].expand(-1, probs.shape[1], -1)] > 0).all()
        assert not sample.drop.diagonal(dim1=-2, dim2=-1).any()
        assert not (sample.drop & ~sample.valid).any()
        # the mask is shared across heads and is what zeroes the probabilities
        zero = probs == 0
        assert torch.equal(zero & real_query & valid_key[:, None, None, :],
                           sample.drop[:, None].expand_as(zero))
        dropped_share.append(sample.drop.sum() / sample.valid.expand_as(sample.drop).sum())
    assert 0.3 < float(sum(dropped_share) / len(dropped_share)) < 0.8  # the check above is not vacuous


def test_valid_pairs_exclude_padding_and_diagonal():
    _, mask = padded_batch(3, 6)
    additive = torch.zeros(3, 1, 6, 6).masked_fill(~mask.bool()[:, None, None, :], torch.finfo(torch.float32).min)
    v = valid_pairs(additive, 6, "cpu")
    real = mask.bool()
    expected = real[:, :, None] & real[:, None, :] & ~torch.eye(6, dtype=torch.bool)
    assert torch.equal(v, expected)
    assert torch.equal(valid_pairs(None, 6, "cpu")[0], ~torch.eye(6, dtype=torch.bool))


def test_log_prob_matches_bernoulli_on_valid_pairs():
    model, method = _attach(p_max=0.5, p_init=0.2)
    method.collect = True
    model(**_batch(length=10))
    method.collect = False
    expected = 0.0
    for s in method._samples:
        pi = 0.5 * torch.sigmoid(s.logits)
        lp = torch.distributions.Bernoulli(probs=pi).log_prob(s.drop.float())
        expected = expected + (lp * s.valid.expand_as(lp)).sum((-1, -2))
    got = method.log_prob()
    assert got.shape == (4,)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("sync_every", [1, 2])
def test_defender_equals_attacker_after_each_sync(sync_every):
    model, method = _attach(sync_every=sync_every, cost_probe_steps=0)
    ctx = _ctx(model, method)
    checks = []
    original = method.sync_defender

    def spy(m):
        original(m)
        d = method.defender_parameters(m)
        checks.append(all(torch.equal(d[n], p) for n, p in method.trainable(m).items()))

    method.sync_defender = spy
    batches = [_batch(seed=i) for i in range(6)]
    for i in range(5):
        method.training_step(ctx, batches[i], batches[i + 1])
    assert checks and all(checks)
    assert len(checks) == (5 if sync_every == 1 else 3)  # before rewards 0, 2, 4
    if sync_every == 1:  # the Defender reads the Attacker's own tensors
        assert all(method.defender_parameters(model)[n] is p for n, p in model.named_parameters())
    else:  # between syncs it has trained on its own: it differs from the Attacker
        d = method.defender_parameters(model)
        assert any(not torch.equal(d[n], p) for n, p in model.named_parameters())


def test_attacker_update_uses_the_masked_gradient():
    """A reward step moves the Attacker exactly as a plain step under the same sampled masks would."""
    batch, nxt = _batch(seed=0), _batch(seed=1)
    results = []
    for reward in (True, False):
        model, method = _attach(seed=3, cost_probe_steps=0)
        ctx = _ctx(model, method)
        torch.manual_seed(7)  # same masks and hidden dropout draws in the Attacker's forward
        method.training_step(ctx, batch, nxt if reward else None)
        results.append({n: p.detach().clone() for n, p in model.named_parameters()})
    changed = False
    for n in results[0]:
        torch.testing.assert_close(results[0][n], results[1][n], rtol=1e-5, atol=1e-7)
    model0 = tiny_model(seed=0)
    for n, p in model0.named_parameters():
        changed |= not torch.equal(p, results[0][n])
    assert changed


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_policy_moves_the_drop_rate_in_the_direction_of_its_reward(sign):
    """Toy reward under our control: +share of dropped pairs (rate must rise) or -share (rate must fall)."""
    model, method = _attach(g_lr=0.01)
    batch = _batch(length=16)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    start = _mean_pi(method, model, batch)
    for _ in range(40):
        method.collect = True
        with torch.no_grad():
            model(**inputs)
        method.collect = False
        dropped = sum(s.drop.sum() for s in method._samples)
        pairs = sum(s.valid.expand_as(s.drop).sum() for s in method._samples)
        method.policy_update(sign * dropped.float() / pairs)
    end = _mean_pi(method, model, batch)
    assert start == pytest.approx(0.1, abs=0.02)  # p_init
    if sign > 0:
        assert end > start + 0.04
    else:
        assert end < start - 0.04


def test_entropy_bonus_raises_capped_drop_rates_without_reward_signal():
    """pi <= p_max < 0.5, so the Bernoulli entropy grows with pi: the bonus alone pushes rates up."""
    model, method = _attach(g_lr=0.01, entropy_coef=1.0)
    batch = _batch(length=16)
    start = _mean_pi(method, model, batch)
    for _ in range(10):
        method.collect = True
        with torch.no_grad():
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        method.collect = False
        assert abs(method.policy_update(torch.tensor(0.5))["advantage"]) < 1e-6  # a constant reward: no signal
    assert _mean_pi(method, model, batch) > start + 0.01


def test_identity_and_eval_are_plain_softmax():
    model, method = _attach(p_max=0.3)
    batch = _batch()
    ref = tiny_model()
    ref.eval()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, ref(**batch).logits)
    assert method._samples == [] and method._hidden == {}  # G is not used at test time


def test_impossible_hyper_parameters_are_rejected():
    for hp in ({"p_init": 0.3}, {"p_max": 1.0}, {"reward": "token"}, {"sync_every": 0}, {"g_update_every": 0},
               {"rate_target": 1.5}, {"lookahead_lr": 0.0}, {"d_g": 0}):
        with pytest.raises(HyperParameterError):
            AttendOut(AttendOut.Config(**hp))
    AttendOut(AttendOut.Config(p_max=0.0))  # the identity setting


def test_g_update_every_skips_rewards_but_applies_masks():
    model, method = _attach(g_update_every=3, cost_probe_steps=0)
    ctx = _ctx(model, method)
    batches = [_batch(seed=i) for i in range(7)]
    for i in range(6):
        method.training_step(ctx, batches[i], batches[i + 1])
    method.training_step(ctx, batches[6], None)  # last batch of the epoch: no reward
    entry = method.epoch_record()
    assert entry["rewards"] == 2 and entry["g_updates"] == 2  # steps 1 and 4
    assert all(r is not None and r > 0 for r in entry["sampled_drop_rate_per_layer"])
    assert len(method._cost["masked_step_s"]) == 5


def test_runner_end_to_end_records_traces_and_cost(tiny_bert_dir, glue_dir):
    from suite.config import RunConfig, TrainSettings
    from suite.runner import run_one

    train = TrainSettings(epochs=2, batch_size=8, eval_batch_size=16, max_length=64, max_train_samples=24,
                          train_eval_samples=8, stats_batches=1, lr=1e-3)
    hp = dict(suite.METHODS.get("attendout").Config().__dict__)
    rec = run_one(RunConfig(tiny_bert_dir, "rte", "attendout", hp, 1, train), data_dir=glue_dir, device="cpu",
                  quiet=True)
    assert rec["status"] == "ok", rec.get("traceback")
    assert len(rec["history"]) == 2
    for e in rec["history"]:
        m = e["method"]
        assert len(m["drop_rate_per_layer"]) == 2 and all(0 < r < 0.3 for r in m["drop_rate_per_layer"])
        assert m["rewards"] == 2 and m["reward_mean"] is not None  # 3 batches per epoch, the last has no reward
    mr = rec["method_record"]
    assert mr["drop_rate_per_layer"] == rec["history"][-1]["method"]["drop_rate_per_layer"]
    assert len(mr["reward_trace"]) == 2 and len(mr["drop_rate_per_layer_per_epoch"]) == 2
    assert mr["g_parameters"] == rec["parameters"]["training_only"] > 0
    assert rec["parameters"]["extra"] == 0  # G is not part of the saved model
    cost = mr["cost"]
    assert cost["steps"] == 6 and cost["step_s"] > 0 and cost["vanilla_step_s"] > 0 and cost["step_ratio"] > 0
    assert cost["peak_memory_mb"] is None  # CPU: no per-allocator peak to compare
