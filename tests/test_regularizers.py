"""The AttendOut-motivated regularizers: per-layer rates follow their formulas, the dynamic rate has mean p_mean."""
import types

import pytest
import torch

import suite
from suite.api.attention import HyperParameterError
from suite.methods.regularizers import layerwise_rate

NEG = torch.finfo(torch.float32).min


def _module(layer, layers, training=True):
    return types.SimpleNamespace(training=training, layer_idx=layer,
                                 config=types.SimpleNamespace(num_hidden_layers=layers))


def _dropped_share(method, module, batch=8, heads=4, length=48, seed=0):
    """Per-sample share of off-diagonal pairs whose probability is exactly zero (a dropped score)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, 8, generator=g) * 0.3 for _ in range(3))
    torch.manual_seed(seed)
    _, probs = method.attention(module, q, k, v, None, 8 ** -0.5)
    off_diag = ~torch.eye(length, dtype=torch.bool)
    assert (probs.diagonal(dim1=-2, dim2=-1) > 0).all()  # the diagonal is never dropped
    return (probs == 0)[..., off_diag].float().mean(-1).mean(-1)  # (B,)


@pytest.mark.parametrize("layers", [1, 2, 12])
def test_layerwise_rates_follow_the_formula(layers):
    cls = suite.METHODS.get("scores_dropout_layerwise")
    method = cls(cls.Config(p_bottom=0.3, p_top=0.05))
    rates = method.rates(layers)
    assert rates[0] == pytest.approx(0.3)
    if layers > 1:
        assert rates[-1] == pytest.approx(0.05)
        steps = [a - b for a, b in zip(rates, rates[1:])]
        assert steps == pytest.approx([0.25 / (layers - 1)] * (layers - 1))  # linear in depth
    for layer in range(layers):
        assert method.drop_rate(_module(layer, layers), 2, "cpu") == pytest.approx(
            0.05 + 0.25 * (1 - (layer / (layers - 1) if layers > 1 else 0)))


def test_layerwise_defaults_and_measured_rates():
    cls = suite.METHODS.get("scores_dropout_layerwise")
    method = cls()
    assert (method.cfg.p_bottom, method.cfg.p_top) == (0.2, 0.0)
    layers = 3
    expected = [0.2, 0.1, 0.0]
    assert [layerwise_rate(i, layers, 0.2, 0.0) for i in range(layers)] == pytest.approx(expected)
    for layer, p in enumerate(expected):
        share = _dropped_share(method, _module(layer, layers)).mean().item()
        assert share == pytest.approx(p, abs=0.01), f"layer {layer}"
    # eval mode: no dropout at all
    assert _dropped_share(method, _module(0, layers, training=False)).max().item() == 0.0


def test_dynamic_rate_draws_per_sample_with_mean_p_mean():
    cls = suite.METHODS.get("scores_dropout_dynamic")
    method = cls()
    assert method.cfg.p_mean == 0.1
    torch.manual_seed(0)
    draws = torch.cat([method.drop_rate(_module(0, 2), 1000, "cpu").flatten() for _ in range(20)])
    assert method.drop_rate(_module(0, 2), 5, "cpu").shape == (5, 1, 1, 1)
    assert draws.min() >= 0 and draws.max() < 0.2
    assert draws.mean().item() == pytest.approx(0.1, abs=0.003)
    assert draws.std().item() == pytest.approx(0.2 / 12 ** 0.5, abs=0.003)  # uniform on [0, 0.2]


def test_dynamic_rate_measured_through_attention():
    cls = suite.METHODS.get("scores_dropout_dynamic")
    method = cls(cls.Config(p_mean=0.15))
    shares = torch.cat([_dropped_share(method, _module(layer, 2), batch=16, seed=s)
                        for s in range(4) for layer in range(2)])
    assert shares.mean().item() == pytest.approx(0.15, abs=0.02)
    assert shares.std().item() > 0.04  # samples get different rates, not one shared rate
    # each layer's call draws its own rates: the same inputs give different masks
    torch.manual_seed(1)
    q = torch.randn(8, 4, 48, 8) * 0.3
    _, p1 = method.attention(_module(0, 2), q, q, q, None, 8 ** -0.5)
    _, p2 = method.attention(_module(1, 2), q, q, q, None, 8 ** -0.5)
    assert not torch.equal(p1 == 0, p2 == 0)


def test_dynamic_rate_rejects_impossible_mean():
    cls = suite.METHODS.get("scores_dropout_dynamic")
    with pytest.raises(HyperParameterError):
        cls(cls.Config(p_mean=0.5))
    with pytest.raises(HyperParameterError):
        cls(cls.Config(p_mean=-0.1))
    cls(cls.Config(p_mean=0.49))
    lw = suite.METHODS.get("scores_dropout_layerwise")
    with pytest.raises(HyperParameterError):
        lw(lw.Config(p_bottom=1.0))


def test_layerwise_record_after_attach():
    from conftest import tiny_model

    cls = suite.METHODS.get("scores_dropout_layerwise")
    method = cls()
    method.attach(tiny_model(num_hidden_layers=3))
    assert method.record()["drop_rate_per_layer"] == pytest.approx([0.2, 0.1, 0.0])
