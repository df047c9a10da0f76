"""lightconv, dynamicconv and less_attention against hand-computed values: the convolution's taps, its banded-matrix
form, the kernel schedule, and the attention-free layers."""
import pytest
import torch

import suite
from suite.methods.convolution import banded_matrix, convolve, kernel_sizes
from suite.methods.less_attention import LessAttention
from suite.api.attention import probes
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


def test_less_attention_frees_the_lower_half():
    model = tiny_model("bert", num_hidden_layers=4).eval()
    method = LessAttention()
    method.attach(model)
    assert method.record() == {"attention_free_layers": 2}
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
