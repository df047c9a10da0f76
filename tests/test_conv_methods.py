"""lightconv, dynamicconv and less_attention against hand-computed values: the convolution's taps, its banded-matrix
form, the kernel schedule, and the attention-free layers."""
import pytest
import torch

import suite
from suite.api.attention import probes
from suite.methods.convolution import banded_matrix, convolve, kernel_sizes
from suite.methods.less_attention import LessAttention
from suite.testing import one_thread, padded_batch, tiny_model


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_fairseq_kernel_schedule():
    assert kernel_sizes(6) == [3, 7, 15, 31, 31, 31]
    assert kernel_sizes(2) == [3, 7]
    assert kernel_sizes(3, kernel_size=5) == [5, 5, 5]


def test_uniform_width3_kernel_is_a_moving_average_with_zero_borders():
    value = torch.arange(1.0, 6.0).view(1, 1, 5, 1)              # 1 2 3 4 5
    weights = torch.full((1, 1, 1, 3), 1 / 3)
    out = convolve(value, weights).flatten()
    expected = torch.tensor([1 + 2, 1 + 2 + 3, 2 + 3 + 4, 3 + 4 + 5, 4 + 5]) / 3
    torch.testing.assert_close(out, expected)


def test_taps_align_left_to_right():
    value = torch.arange(1.0, 6.0).view(1, 1, 5, 1)
    weights = torch.tensor([1.0, 0.0, 0.0]).view(1, 1, 1, 3)      # tap 0 reads the previous position
    torch.testing.assert_close(convolve(value, weights).flatten(), torch.tensor([0.0, 1, 2, 3, 4]))
    m = banded_matrix(weights, 5)[0, 0]
    torch.testing.assert_close(m, torch.diag(torch.ones(4), -1))


def test_banded_matrix_equals_the_taps():
    g = torch.Generator().manual_seed(0)
    value = torch.randn(2, 3, 9, 4, generator=g)
    weights = torch.softmax(torch.randn(2, 3, 9, 5, generator=g), -1)   # a kernel per position (dynamic)
    torch.testing.assert_close(banded_matrix(weights, 9) @ value, convolve(value, weights))


@pytest.mark.parametrize("name", ["lightconv", "dynamicconv"])
def test_probe_path_equals_fast_path_with_padding(name):
    model = tiny_model("bert").eval()
    cls = suite.METHODS.get(name)
    cls(cls.Config(kernel_size=5)).attach(model)
    kernels = [p for n, p in model.named_parameters() if n.endswith(("lightconv_kernel", "dynamicconv_predictor"))]
    assert len(kernels) == 2
    for p in kernels:  # leave the zero start, so that kernels differ per head (and position)
        torch.nn.init.normal_(p, generator=torch.Generator().manual_seed(0))
    ids, mask = padded_batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask).logits
        with probes(model, lambda module, probs: None):
            slow = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_dynamicconv_starts_where_lightconv_starts():
    ids, mask = padded_batch(vocab=40)
    outs = []
    for name in ("lightconv", "dynamicconv"):
        model = tiny_model("bert").eval()
        suite.METHODS.get(name)().attach(model)
        with torch.no_grad():
            outs.append(model(input_ids=ids, attention_mask=mask).logits)
    torch.testing.assert_close(outs[0], outs[1])


def test_dropconnect_only_in_training():
    model = tiny_model("bert")
    suite.METHODS.get("lightconv")().attach(model)
    ids, mask = padded_batch(vocab=model.config.vocab_size)
    model.eval()
    a, b = (model(input_ids=ids, attention_mask=mask).logits for _ in range(2))
    torch.testing.assert_close(a, b)
    model.train()
    torch.manual_seed(0)
    assert not torch.allclose(model(input_ids=ids, attention_mask=mask).logits, a)


def _layer_probs(model, ids, mask):
    found = {}
    with torch.no_grad(), probes(model, lambda module, probs: found.__setitem__(module.layer_idx, probs)):
        model(input_ids=ids, attention_mask=mask)
    return found


def test_less_attention_linear_frees_the_lower_half():
    model = tiny_model("bert", num_hidden_layers=4).eval()
    method = LessAttention(LessAttention.Config(form="linear"))
    method.attach(model)
    assert method.record() == {"attention_free_layers": 2, "form": "linear"}
    ids, mask = padded_batch(vocab=model.config.vocab_size)
    probs = _layer_probs(model, ids, mask)
    eye = torch.eye(ids.shape[1])
    for layer in (0, 1):
        torch.testing.assert_close(probs[layer], eye.expand_as(probs[layer]))
    for layer in (2, 3):
        real = mask[1].bool()
        assert not torch.allclose(probs[layer][1, :, real][..., real], eye[real][:, real].expand(4, -1, -1))
        torch.testing.assert_close(probs[layer].sum(-1), torch.ones_like(probs[layer].sum(-1)))


def test_less_attention_layers_beyond_depth_is_bad_input():
    with pytest.raises(suite.HyperParameterError, match="exceeds the model's 2 layers"):
        LessAttention(LessAttention.Config(layers=3)).attach(tiny_model("bert"))
    with pytest.raises(suite.HyperParameterError):
        LessAttention(LessAttention.Config(layers=-2))


def test_shared_kernel_conv1d_path_equals_the_tap_loop():
    g = torch.Generator().manual_seed(1)
    value = torch.randn(2, 3, 9, 4, generator=g)
    for k in (3, 4):  # odd and even widths
        kernel = torch.softmax(torch.randn(1, 3, 1, k, generator=g), -1)
        torch.testing.assert_close(convolve(value, kernel), convolve(value, kernel.expand(1, 3, 9, k)))


def _taps(value: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The convolution tap by tap, zero outside the sequence: out[i] = sum_t w[i, t] v[i + t - k // 2]."""
    k, length = weights.shape[-1], value.shape[2]
    w = weights.expand(*value.shape[:3], k)
    out = torch.zeros_like(value)
    for t in range(k):
        lo, hi = max(0, k // 2 - t), min(length, length + k // 2 - t)  # positions whose tap t reads inside
        if lo < hi:
            out[:, :, lo:hi] += w[:, :, lo:hi, t:t + 1] * value[:, :, lo + t - k // 2:hi + t - k // 2]
    return out


@pytest.mark.parametrize("length", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 15, 31, 33, 90])
def test_blocked_convolution_equals_the_taps_values_and_gradients(length, k):
    """The blocked band (any block boundary, odd and even widths, kernels wider than the sequence, per-position and
    shared kernels) computes the taps' sums, and their gradients, in float64."""
    g = torch.Generator().manual_seed(length * 100 + k)
    for rows in (length, 1):
        value = torch.randn(2, 3, length, 4, generator=g, dtype=torch.float64, requires_grad=True)
        weights = torch.randn(2 if rows > 1 else 1, 3, rows, k, generator=g, dtype=torch.float64,
                              requires_grad=True)
        out, ref = convolve(value, weights), _taps(value, weights)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
        cot = torch.randn(out.shape, generator=g, dtype=torch.float64)
        for a, r in zip(torch.autograd.grad((out * cot).sum(), [value, weights]),
                        torch.autograd.grad((ref * cot).sum(), [value, weights])):
            torch.testing.assert_close(a, r, atol=1e-12, rtol=1e-12)


def test_convolution_is_a_fixed_handful_of_operators_whatever_the_width():
    """One batched matmul per call, not a pass per tap: the operator count does not grow with k."""
    from suite.profiling.counters import counting

    value = torch.randn(2, 3, 64, 4, requires_grad=True)
    counts = []
    for k in (3, 31):
        weights = torch.randn(2, 3, 64, k, requires_grad=True)
        with counting() as c:
            convolve(value, weights).sum().backward()
        counts.append(c.ops - c.views)
    assert max(counts) <= 16, counts  # a pass per tap costs about 10 operators per tap (fwd + bwd)


# --- DropConnect drawn per (batch element, position, head), as fairseq's LightweightConv1dTBC -----------------------

def _conv_inputs(length: int = 9, heads: int = 4, d: int = 8, seed: int = 0):
    """(value (B, H, L, d) with row 1 padded after 6 tokens, its additive mask (B, 1, L, L), the real positions)."""
    g = torch.Generator().manual_seed(seed)
    value = torch.randn(2, heads, length, d, generator=g)
    real = torch.ones(2, length, dtype=torch.bool)
    real[1, 6:] = False
    mask = torch.zeros(2, 1, length, length)
    mask.masked_fill_(~real[:, None, None, :], torch.finfo(torch.float32).min)
    return value, mask, real


def _lightconv_module(p_weight: float, kernel_size: int = 5, seed: int = 0):
    model = tiny_model("bert")
    method = suite.METHODS.get("lightconv")
    method = method(method.Config(kernel_size=kernel_size, p_weight=p_weight))
    method.attach(model)
    module = next(m for m in model.modules() if hasattr(m, "lightconv_kernel"))
    with torch.no_grad():  # kernels that differ per head and tap
        module.lightconv_kernel.copy_(torch.randn(module.lightconv_kernel.shape,
                                                  generator=torch.Generator().manual_seed(seed)))
    return method, module


def _fairseq_reference(kernel: torch.Tensor, value: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """fairseq's LightConvEncoderLayer + LightweightConv1dTBC (odd K, padding_l = K // 2, weight_softmax, no
    dropout), written out in float64: x zeroed at padding, then
    out[b, i, h] = sum_t softmax(w_h)[t] x[b, i + t - P, h]."""
    heads, k = kernel.shape
    x = value.double() * real[:, None, :, None]
    w = torch.softmax(kernel.double(), -1)
    b, _, length, d = x.shape
    out = torch.zeros(b, length, heads, d, dtype=torch.float64)
    for i in range(length):
        for t in range(k):
            j = i + t - k // 2
            if 0 <= j < length:
                out[:, i] += w[None, :, t, None] * x[:, :, j]
    return out


@pytest.mark.parametrize("training", [False, True])
def test_lightconv_matches_fairseq_formula_at_p0_on_padded_batches(training):
    method, module = _lightconv_module(p_weight=0.0)
    module.train(training)
    value, mask, real = _conv_inputs(heads=module.num_attention_heads, d=module.attention_head_size)
    out, _ = method.attention(module, value, value, value, mask, 1.0)
    torch.testing.assert_close(out.double(), _fairseq_reference(module.lightconv_kernel.detach(), value, real),
                               atol=1e-6, rtol=1e-6)


def test_lightconv_dropconnect_differs_between_identical_sequences_and_positions():
    method, module = _lightconv_module(p_weight=0.5)
    module.train()
    value, mask, _ = _conv_inputs(heads=module.num_attention_heads, d=module.attention_head_size)
    value[1] = value[0]                 # two identical sequences in the batch, both unpadded
    value[:, :, :, :] = value[:, :, :1, :]  # every position of a sequence the same vector
    mask.zero_()
    torch.manual_seed(0)
    out, _ = method.attention(module, value, value, value, mask, 1.0)   # (B, L, H, d)
    assert not torch.allclose(out[0], out[1])               # a mask per batch element
    interior = out[0, 2:-2]                                 # positions whose window lies inside the sequence
    assert not torch.allclose(interior[0], interior[1])     # a mask per position
    module.eval()
    ref, _ = method.attention(module, value, value, value, mask, 1.0)
    torch.testing.assert_close(ref[0], ref[1])               # without dropout identical inputs agree


def test_lightconv_dropconnect_keeps_the_expectation():
    method, module = _lightconv_module(p_weight=0.3)
    value, mask, real = _conv_inputs(heads=module.num_attention_heads, d=module.attention_head_size)
    module.eval()
    with torch.no_grad():
        expected, _ = method.attention(module, value, value, value, mask, 1.0)
    module.train()
    torch.manual_seed(0)
    with torch.no_grad():
        draws = torch.stack([method.attention(module, value, value, value, mask, 1.0)[0] for _ in range(3000)])
    se = draws.std(0) / 3000 ** 0.5
    z = ((draws.mean(0) - expected).abs() / se.clamp_min(1e-12))[se > 0]
    assert float(z.max()) < 5.5, float(z.max())   # inverted dropout: E[out] equals the eval output
    assert float(z.mean()) < 1.2                   # and no systematic offset (|N(0,1)| has mean 0.8)


# --- dynamicconv: the kernel predicted from the convolution's own input (fairseq) or from the query --------------

def _fairseq_dynamic_reference(predictor, source, value, real, k):
    """fairseq's DynamicConv1dTBC (weight_softmax, no dropout, padding_l = K // 2) in float64 at the real positions:
    w[b, i, h] = softmax_t((W q[b, i])[h, :]) with q the kernel's input,
    out[b, i, h] = sum_t w[b, i, h, t] x[b, i+t-P, h]."""
    b, heads, length, d = value.shape
    x = value.double() * real[:, None, :, None]
    q = source.double().transpose(1, 2).reshape(b, length, heads * d)
    w = torch.softmax((q @ predictor.double().T).view(b, length, heads, k), -1)
    out = torch.zeros(b, length, heads, d, dtype=torch.float64)
    for i in range(length):
        for t in range(k):
            j = i + t - k // 2
            if 0 <= j < length:
                out[:, i] += w[:, i, :, t, None] * x[:, :, j]
    return out


@pytest.mark.parametrize("kernel_input", ["input", "query"])
def test_dynamicconv_matches_fairseq_formula_on_its_kernel_input(kernel_input):
    model = tiny_model("bert").eval()
    cls = suite.METHODS.get("dynamicconv")
    method = cls(cls.Config(kernel_size=5, p_weight=0.0, kernel_input=kernel_input))
    method.attach(model)
    module = next(m for m in model.modules() if hasattr(m, "dynamicconv_predictor"))
    with torch.no_grad():
        module.dynamicconv_predictor.normal_(generator=torch.Generator().manual_seed(0))
    value, mask, real = _conv_inputs(heads=module.num_attention_heads, d=module.attention_head_size)
    query = torch.randn(value.shape, generator=torch.Generator().manual_seed(1))
    out, _ = method.attention(module, query, query, value, mask, 1.0)
    source = value if kernel_input == "input" else query
    ref = _fairseq_dynamic_reference(module.dynamicconv_predictor.detach(), source, value, real, 5)
    torch.testing.assert_close(out.double()[real], ref[real], atol=1e-6, rtol=1e-6)
    other = _fairseq_dynamic_reference(module.dynamicconv_predictor.detach(), query if kernel_input == "input"
                                       else value, value, real, 5)
    assert not torch.allclose(out.double()[real], other[real], atol=1e-3)  # the other input gives other kernels


def test_dynamicconv_kernel_input_is_validated():
    cls = suite.METHODS.get("dynamicconv")
    assert cls.Config().kernel_input == "input"   # the paper's and fairseq's choice
    with pytest.raises(suite.HyperParameterError, match="kernel_input"):
        cls(cls.Config(kernel_input="key"))


def test_dynamicconv_records_of_the_query_version_keep_their_hash():
    """Records made before kernel_input existed ran the query version: they are found again under
    kernel_input="query", while the new default is a new configuration with a hash of its own."""
    import hashlib
    import json

    from suite.run.settings import RunConfig, TrainSettings, unhashed_at_default

    hparams = {"kernel_size": 0, "p_weight": 0.1}
    old = RunConfig("minilm", "cola", "dynamicconv", hparams, 1, TrainSettings())
    old_dict = old.to_dict()   # as an old record holds it: no kernel_input, no later training settings
    for name in unhashed_at_default():
        old_dict["train"].pop(name, None)
    old_hash = hashlib.sha256(json.dumps(old_dict, sort_keys=True, default=str).encode()).hexdigest()[:12]
    query = RunConfig("minilm", "cola", "dynamicconv", hparams | {"kernel_input": "query"}, 1, TrainSettings())
    new = RunConfig("minilm", "cola", "dynamicconv", hparams | {"kernel_input": "input"}, 1, TrainSettings())
    assert old.hash == old_hash and query.hash == old_hash
    assert new.hash != old_hash


# --- less_attention's LIT form: no attention sublayer at all in the freed layers --------------------------------

def test_less_attention_lit_layer_is_the_feed_forward_block_alone():
    model = tiny_model("bert", num_hidden_layers=3).eval()
    method = LessAttention(LessAttention.Config(form="lit", layers=2))
    method.attach(model)
    ids, mask = padded_batch(vocab=model.config.vocab_size)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for i in range(3):
            layer = model.bert.encoder.layer[i]
            h = hidden[i].double()
            # written out by hand: LayerNorm(W2 gelu(W1 h + b1) + b2 + h), the FFN with its residual, in float64
            inner = torch.nn.functional.gelu(h @ layer.intermediate.dense.weight.double().T
                                             + layer.intermediate.dense.bias.double())
            ffn = inner @ layer.output.dense.weight.double().T + layer.output.dense.bias.double() + h
            ln = layer.output.LayerNorm
            expected = torch.nn.functional.layer_norm(ffn, ffn.shape[-1:], ln.weight.double(), ln.bias.double(),
                                                      ln.eps)
            close = torch.allclose(hidden[i + 1].double(), expected, atol=1e-5)
            assert close == (i < 2), i   # the third layer keeps its attention sublayer


def test_less_attention_lit_frees_a_third_by_default_as_lit():
    from suite.methods.less_attention import mixing_free_layers

    cfg = LessAttention.Config(form="lit")
    assert [mixing_free_layers(cfg, n) for n in (12, 6, 2)] == [4, 2, 0]   # LIT: 4 of 12
    assert mixing_free_layers(LessAttention.Config(form="linear"), 6) == 3  # linear frees half
    assert mixing_free_layers(LessAttention.Config(fraction=0.5, form="lit"), 12) == 6
    model = tiny_model("bert", num_hidden_layers=6)
    method = LessAttention(cfg)
    method.attach(model)
    assert method.record() == {"attention_free_layers": 2, "form": "lit"}


@pytest.mark.parametrize("hp", [{"form": "mlp"}, {"fraction": 1.5}, {"fraction": 0.3, "layers": 2},
                                {"fraction": True}])
def test_less_attention_impossible_forms_are_refused(hp):
    with pytest.raises(suite.HyperParameterError):
        LessAttention(LessAttention.Config(**hp))


def test_less_attention_depth_is_checked_before_training(tiny_bert_dir):
    """The grid's preflight refuses more freed layers than the model has, before any model is built."""
    from suite.grid.preflight import check_methods_fit_models
    from suite.run.settings import RunConfig, TrainSettings

    ok = RunConfig(tiny_bert_dir, "rte", "less_attention", {"layers": 2, "form": "lit"}, 1, TrainSettings())
    check_methods_fit_models([ok])
    bad = RunConfig(tiny_bert_dir, "rte", "less_attention", {"layers": 9, "form": "lit"}, 1, TrainSettings())
    with pytest.raises(suite.HyperParameterError, match="exceeds the model's 2 layers"):
        check_methods_fit_models([ok, bad])


def test_less_attention_records_keep_their_hash():
    from suite.run.settings import RunConfig, TrainSettings

    old = RunConfig("minilm", "rte", "less_attention", {"layers": -1, "p": 0.1}, 1, TrainSettings())
    same = RunConfig("minilm", "rte", "less_attention", {"layers": -1, "p": 0.1, "form": "linear",
                                                          "fraction": None}, 1, TrainSettings())
    lit = RunConfig("minilm", "rte", "less_attention", {"layers": -1, "p": 0.1, "form": "lit",
                                                         "fraction": None}, 1, TrainSettings())
    assert same.hash == old.hash and lit.hash != old.hash


def test_older_dynamicconv_records_are_found_under_the_query_version():
    """A record made before kernel_input existed (no such key) recomputes to the same hash with kernel_input="query"
    filled in as `with_added_defaults` does for older records, and not to today's default ("input")."""
    import dataclasses

    from suite.run.settings import RunConfig, TrainSettings, with_added_defaults

    config = RunConfig("minilm", "sst2", "dynamicconv", {"kernel_size": 0, "p_weight": 0.1}, 1,
                       TrainSettings()).to_dict()
    assert "kernel_input" not in config["hparams"]
    hparams, train = with_added_defaults("dynamicconv", config["hparams"], config["train"])
    assert hparams["kernel_input"] == "query"
    old = RunConfig.from_dict(config)
    assert RunConfig.from_dict(config | {"hparams": hparams, "train": train}).hash == old.hash
    today = dataclasses.replace(old, hparams={**hparams, "kernel_input": "input"})
    assert today.hash != old.hash
