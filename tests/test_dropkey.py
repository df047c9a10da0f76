"""DropKey against an independent float64 re-implementation of the paper's Algorithm 1 on padded batches (a sample
with no real token, a one-token sample), forward and backward; its decreasing layer schedule; and the row whose real
keys are all dropped, which must keep its attention on real keys (the leak of the obvious masked_fill)."""
import types

import pytest
import torch

import suite
from suite.methods.dropkey import dropped_keys

B, H, L, D = 4, 2, 6, 4
LENGTHS = [6, 3, 1, 0]  # an unpadded sample, a padded one, one real token, no real token at all
NEG = torch.finfo(torch.float64).min


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    valid = torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, Lk)
    mask = torch.zeros(B, 1, L, L, dtype=torch.float64).masked_fill(~valid[:, None, None, :], NEG)
    return q, k, v, mask, valid


def _module(layer=0, layers=3, training=True, probe=True):
    config = types.SimpleNamespace(num_hidden_layers=layers)
    m = types.SimpleNamespace(training=training, layer_idx=layer, config=config)
    if probe:
        m.suite_probe = lambda module, probs: None  # the path that materialises the probabilities
    return m


def _dropkey(**hp):
    cls = suite.METHODS.get("dropkey")
    return cls(cls.Config(**hp))


def paper_dropkey(q, k, v, mask, u, rate, scale):
    """The paper's Algorithm 1 with the padding mask added: attn = q kᵀ·scale + mask; attn += bernoulli(rate)·C;
    softmax; times v. C is -1e6 rather than the paper's -1e12: any C below -745 zeroes a dropped weight in float64 as
    -1e12 does, and float64 keeps differences of O(1) scores at 1e6 (spacing 1e-10, hence the 1e-7 tolerance) but
    not at 1e12 (spacing 1e-4), so the row whose keys are all dropped computes what the formula means: the shift
    cancels in the softmax."""
    attn = q @ k.transpose(-1, -2) * scale + mask
    attn = attn + (u < rate).to(attn.dtype) * -1e6
    probs = torch.softmax(attn, dim=-1)
    return (probs @ v).transpose(1, 2), probs


@pytest.mark.parametrize("layer, seed", [(0, 0), (0, 1), (1, 2), (0, 3)])
def test_dropkey_matches_the_papers_formula_forward_and_backward(layer, seed):
    method, module = _dropkey(p=0.6, p_last=0.2), _module(layer=layer)
    rate = method.rate(module)
    assert rate == pytest.approx([0.6, 0.4, 0.2][layer])
    q, k, v, mask, valid = _inputs(seed)
    torch.manual_seed(seed)
    out, probs = method.attention(module, q, k, v, mask, D ** -0.5)
    torch.manual_seed(seed)
    u = torch.rand(B, H, L, L)  # the same draw, replayed
    ref_out, ref_probs = paper_dropkey(q, k, v, mask, u, rate, D ** -0.5)
    torch.testing.assert_close(probs, ref_probs, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(out, ref_out, rtol=1e-7, atol=1e-9)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref_out * w).sum(), (q, k, v))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
    # the draw did what the test is for: some rows lost real keys, and at least one lost all of them
    real = valid[:, None, None, :]
    dropped = (u < rate) & real
    all_dropped = (dropped == real).all(-1) & real.any(-1)
    assert dropped.any() and all_dropped.any()


def test_a_row_whose_real_keys_are_all_dropped_keeps_its_attention_and_never_reaches_padding():
    """The obvious reading (masked_fill of the dropped real keys with the mask minimum) ties them with the padded
    keys, so a row that lost every real key spreads its weight over padding too; DropKey keeps the undropped row."""
    q, k, v, mask, valid = _inputs()
    s = q @ k.transpose(-1, -2) * D ** -0.5 + mask
    drop = torch.zeros(B, H, L, L, dtype=torch.bool)
    drop[1, :, :, :3] = True                     # sample 1: all 3 real keys dropped, for every query and head
    drop[0, 0, 2, 1:4] = True                    # sample 0: some keys of one row
    probs = torch.softmax(s.masked_fill(dropped_keys(drop, mask), NEG), -1)
    undropped = torch.softmax(s, -1)
    torch.testing.assert_close(probs[1], undropped[1])
    real_samples = probs[:3]  # the sample with no real token attends uniformly to its padding, as softmax does
    assert (real_samples.masked_select(~valid[:3, None, None, :].expand_as(real_samples)) == 0).all()
    assert (probs[0, 0, 2, 1:4] == 0).all() and probs[0, 0, 2].sum().item() == pytest.approx(1.0)
    naive = torch.softmax(s.masked_fill(drop & valid[:, None, None, :], NEG), -1)
    assert naive[1, :, :, 3:].sum(-1).min() > 0.4  # half the weight on padding: the leak this guards against


def test_decreasing_schedule_rates_and_record():
    method = _dropkey(p=0.3)
    assert method.rates(4) == pytest.approx([0.3, 0.2, 0.1, 0.0])
    assert method.rates(1) == pytest.approx([0.3])
    assert [method.rate(_module(layer, 4)) for layer in range(4)] == pytest.approx([0.3, 0.2, 0.1, 0.0])
    assert method.record() == {}
    from suite.testing import tiny_model

    method.attach(tiny_model("bert"))
    assert method.record() == {"drop_rate_per_layer": pytest.approx(method.rates(2))}


def test_drops_at_the_layer_rate_and_not_in_eval_or_at_the_last_layer():
    method = _dropkey(p=0.3)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(64, 2, 16, 4, generator=g) for _ in range(3))
    torch.manual_seed(0)
    _, probs = method.attention(_module(0, 3), q, k, v, None, 0.5)
    assert (probs == 0).float().mean().item() == pytest.approx(0.3, abs=0.01)  # no diagonal kept, unlike scores dropout
    _, last = method.attention(_module(2, 3), q, k, v, None, 0.5)
    _, evaluated = method.attention(_module(0, 3, training=False), q, k, v, None, 0.5)
    softmax = torch.softmax(q @ k.transpose(-1, -2) * 0.5, -1)
    torch.testing.assert_close(last, softmax)
    torch.testing.assert_close(evaluated, softmax)


def test_the_fused_path_equals_the_probe_path_for_the_same_draw():
    method = _dropkey(p=0.7)
    q, k, v, mask, _ = (t.float() if t.dtype == torch.float64 else t for t in _inputs(4))
    mask = mask.clamp(min=torch.finfo(torch.float32).min)
    outs = []
    for probe in (True, False):
        torch.manual_seed(4)
        out, _ = method.attention(_module(probe=probe), q, k, v, mask, D ** -0.5)
        outs.append(out)
    torch.testing.assert_close(outs[0][:3], outs[1][:3])  # samples with a real token (SDPA's empty rows differ)
