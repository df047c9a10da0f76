"""Scores dropout (both readings), vanilla and uniform attention against their formulas on padded batches."""
import types

import pytest
import torch

import suite
from suite.api.attention import drop_scores

NEG = torch.finfo(torch.float32).min


def _inputs(b=3, h=2, length=7, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, length, d, generator=g, requires_grad=True) for _ in range(3))
    valid = torch.ones(b, length, dtype=torch.bool)
    valid[1, 4:] = False
    valid[2, 2:] = False
    mask = torch.zeros(b, 1, length, length).masked_fill(~valid[:, None, None, :], NEG)
    return q, k, v, mask, valid


def _module(training=True, layer=0, layers=2):
    m = types.SimpleNamespace(training=training, layer_idx=layer,
                              config=types.SimpleNamespace(num_hidden_layers=layers))
    return m


def _probs(name, training=True, seed=0, **hp):
    cls = suite.METHODS.get(name)
    method = cls(cls.Config(**hp))
    q, k, v, mask, valid = _inputs()
    torch.manual_seed(seed)
    out, probs = method.attention(_module(training), q, k, v, mask, q.shape[-1] ** -0.5)
    return out, probs, valid, (q, k, v)


@pytest.mark.parametrize("name", ["scores_dropout", "scores_dropout_naive"])
def test_scores_dropout_never_unmasks_padding_and_rows_stay_finite(name):
    for seed in range(20):
        out, probs, valid, _ = _probs(name, p=0.7, seed=seed)
        assert torch.isfinite(probs).all() and torch.isfinite(out).all()
        assert (probs.masked_select(~valid[:, None, None, :].expand_as(probs)) == 0).all()
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))


def test_scores_dropout_keeps_the_diagonal_and_drops_at_rate_p():
    s = torch.zeros(64, 4, 16, 16)
    torch.manual_seed(0)
    drop = torch.rand(s.shape) < 0.3
    out = drop_scores(s, drop)
    eye = torch.eye(16, dtype=torch.bool)
    assert (out[..., eye] == 0).all()  # diagonal never dropped
    off = out[..., ~eye]
    assert (off == NEG).float().mean().item() == pytest.approx(0.3, abs=0.01)


def test_scores_dropout_all_but_diagonal_dropped_attends_to_self():
    _, probs, valid, _ = _probs("scores_dropout", p=0.999999, seed=0)
    eye = torch.eye(probs.shape[-1])
    for b in range(probs.shape[0]):
        n = int(valid[b].sum())
        torch.testing.assert_close(probs[b, :, :n, :n], eye[:n, :n].expand(probs.shape[1], n, n))


def test_scores_dropout_matches_formula():
    """softmax over the survivors (no rescale): recompute from the same random draw."""
    cls = suite.METHODS.get("scores_dropout")
    q, k, v, mask, valid = _inputs()
    torch.manual_seed(3)
    _, probs = cls(cls.Config(p=0.4)).attention(_module(), q, k, v, mask, 0.5)
    torch.manual_seed(3)
    s = q @ k.transpose(-1, -2) * 0.5 + mask
    drop = (torch.rand(s.shape) < 0.4) & ~torch.eye(7, dtype=torch.bool) & valid[:, None, :, None]
    ref = torch.softmax(s.masked_fill(drop, NEG), -1)
    torch.testing.assert_close(probs, ref)


def test_naive_scores_dropout_matches_formula_and_rescales():
    cls = suite.METHODS.get("scores_dropout_naive")
    q, k, v, mask, valid = _inputs()
    torch.manual_seed(5)
    _, probs = cls(cls.Config(p=0.4)).attention(_module(), q, k, v, mask, 0.5)
    torch.manual_seed(5)
    raw = q @ k.transpose(-1, -2) * 0.5
    ref = torch.softmax(torch.nn.functional.dropout(raw, 0.4, training=True) + mask, -1)
    torch.testing.assert_close(probs, ref)


def test_dropout_is_off_in_eval():
    for name in ("scores_dropout", "scores_dropout_naive"):
        _, p_eval, _, (q, k, v) = _probs(name, training=False, p=0.5)
        q, k, v, mask, _ = _inputs()
        torch.testing.assert_close(p_eval, torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask, -1))


def test_uniform_with_boundary_tokens_is_uniform_over_every_real_token():
    out, probs, valid, (q, k, v) = _probs("uniform", boundary_tokens=True)
    for b in range(3):
        n = int(valid[b].sum())
        torch.testing.assert_close(probs[b, :, :, :n], torch.full_like(probs[b, :, :, :n], 1 / n))
        assert (probs[b, :, :, n:] == 0).all()
        ref = v[b, :, :n].mean(1)  # (H, d): every query gets the mean of the real values
        torch.testing.assert_close(out[b, 0], ref)
    out.sum().backward()
    assert q.grad is None or (q.grad == 0).all()  # queries and keys play no part


def test_uniform_by_default_is_wiegreffe_and_pinter():
    """1 / (len - 2) over each padded row's real tokens without the first and last ([CLS] and the final [SEP]); a
    2-token row keeps both (1 / 2)."""
    assert suite.METHODS.get("uniform").Config().boundary_tokens is False
    _, probs, valid, (_, _, v) = _probs("uniform")
    for b, (n, expected) in enumerate([(7, [0] + [1 / 5] * 5 + [0]), (4, [0, 1 / 2, 1 / 2, 0, 0, 0, 0]),
                                       (2, [1 / 2, 1 / 2, 0, 0, 0, 0, 0])]):
        assert int(valid[b].sum()) == n
        torch.testing.assert_close(probs[b], torch.tensor(expected).expand_as(probs[b]))


def test_impossible_probabilities_are_rejected():
    cls = suite.METHODS.get("scores_dropout")
    for p in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(suite.HyperParameterError, match="scores_dropout.p"):
            cls(cls.Config(p=p))
