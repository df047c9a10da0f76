"""Lightweight and dynamic convolutions in place of attention (Wu et al. 2019, "Pay Less Attention with Lightweight
and Dynamic Convolutions"); docs/methods.md#lightconv and #dynamicconv.

Per layer, the probabilities-times-values product becomes a depthwise convolution of width k over the value vectors:
    O[i, h] = sum_t w[t] * V[i + t - k // 2, h]       t = 0 .. k-1, zero outside the sequence and at padding
with the kernel softmax-normalised over its taps and DropConnect on it in training, drawn per batch element,
position and head as in fairseq (not once per head and tap for the whole batch). `lightconv` has one kernel per head
(shared by the head's channels); `dynamicconv` predicts a kernel per position and head by a linear map of the
convolution's own input, the value vectors (as fairseq; `kernel_input="query"`: of the query vectors instead).
Kernel logits (and the dynamic map) start at zero: a uniform window average.

The fast path loops over the k taps (cost linear in the length); under a statistics probe the same weights are laid
out as the banded (L x L) mixing matrix and passed to `suite.attend`, so statistics and analyses see the convolution.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from suite.api.attention import (
    AttentionMethod,
    HyperParameterError,
    attend,
    attention_modules,
    has_probe,
    register_method,
    valid_keys,
)

FAIRSEQ_ENCODER_KERNELS = (3, 7, 15, 31)  # then 31 for every further layer


@dataclasses.dataclass
class ConvConfig:
    kernel_size: int = 0     # 0: the fairseq encoder schedule 3, 7, 15, 31, 31, ... cut to the depth; else one width
    p_weight: float = 0.1    # DropConnect on the normalised kernel in training (fairseq's weight dropout)


def kernel_sizes(num_layers: int, kernel_size: int = 0) -> list[int]:
    """Kernel width of every layer."""
    if kernel_size:
        return [kernel_size] * num_layers
    return [FAIRSEQ_ENCODER_KERNELS[min(i, len(FAIRSEQ_ENCODER_KERNELS) - 1)] for i in range(num_layers)]


def key_padding(attention_mask, value: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, 1) float: 1 at real positions, 0 at padding (a key is real if some query may attend it)."""
    valid = valid_keys(attention_mask, value.new_empty(1, 1, value.shape[2], value.shape[2]))
    return valid.any(dim=-2).to(value.dtype).unsqueeze(-1).expand(value.shape[0], 1, value.shape[2], 1)


def convolve(value: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_t weights[..., t] * value shifted by t - k // 2 along the length; value (B, H, L, d), weights broadcastable
    to (B, H, L, k). Zero outside the sequence. Cost: k passes over the values (one depthwise conv1d when the
    kernel is the same for every sample and position)."""
    k, length = weights.shape[-1], value.shape[2]
    left = k // 2
    if weights.shape[0] == 1 and weights.shape[2] == 1:
        return _depthwise(value, weights[0, :, 0, :], left)
    padded = F.pad(value, (0, 0, left, k - 1 - left))
    out = torch.zeros_like(value)
    for t in range(k):
        out = out + weights[..., t:t + 1].to(value.dtype) * padded[:, :, t:t + length]
    return out


def _depthwise(value: torch.Tensor, kernel: torch.Tensor, left: int) -> torch.Tensor:
    """`convolve` with one (H, k) kernel: a grouped conv1d over the B x (H * d) channels, head h owning its d."""
    b, h, length, d = value.shape
    k = kernel.shape[-1]
    x = F.pad(value.permute(0, 1, 3, 2).reshape(b, h * d, length), (left, k - 1 - left))
    weight = kernel.to(value.dtype).repeat_interleave(d, dim=0).unsqueeze(1)      # (H * d, 1, k)
    out = F.conv1d(x, weight, groups=h * d)                                        # cross-correlation: tap t
    return out.view(b, h, d, length).permute(0, 1, 3, 2)                           # reads position i + t - left


def banded_matrix(weights: torch.Tensor, length: int) -> torch.Tensor:
    """The convolution as a mixing matrix: M[..., i, j] = weights[..., i, j - i + k // 2] inside the band, 0 outside.
    weights (B or 1, H, L or 1, k) -> (B or 1, H, L, L)."""
    k = weights.shape[-1]
    w = weights.expand(*weights.shape[:2], length, k)
    offset = torch.arange(length, device=w.device)[None, :] - torch.arange(length, device=w.device)[:, None]
    tap = offset + k // 2                                                   # (L, L): which tap links i to j
    inside = (tap >= 0) & (tap < k)
    gathered = torch.gather(w, -1, tap.clamp(0, k - 1).expand(*w.shape[:2], length, length))
    return gathered * inside


class _Convolution(AttentionMethod):
    Config = ConvConfig
    identity = None  # replaces attention: no setting equals softmax
    cost_target = 1.3
    # reports footnote it: the paper trains convolutional models from scratch, the suite swaps attention out of an
    # encoder pre-trained with softmax attention
    reconstruction = ("attention replaced by a convolution in an encoder pre-trained with softmax attention: it "
                      "measures how much fine-tuning depends on attention, not the paper's from-scratch model")

    def validate(self) -> None:
        super().validate()
        k = self.cfg.kernel_size
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise HyperParameterError(f"{self.name}.kernel_size={k!r} is impossible: it must be an integer >= 1 "
                                      "(or 0 for the fairseq schedule 3, 7, 15, 31, ...)")

    def check_model_config(self, config) -> None:
        """A tap more than the longest input away from every position only ever meets zeros."""
        positions = getattr(config, "max_position_embeddings", None)
        if positions and self.cfg.kernel_size > 2 * positions - 1:
            raise HyperParameterError(f"{self.name}.kernel_size={self.cfg.kernel_size} is wider than any input of "
                                      f"this model can use: its position embeddings hold {positions} tokens, so at "
                                      f"most {2 * positions - 1} taps ever reach a token; give a smaller width")

    def _widths(self, config) -> list[int]:
        return kernel_sizes(config.num_hidden_layers, self.cfg.kernel_size)

    def kernel_logits(self, module, query: torch.Tensor) -> torch.Tensor:
        """Unnormalised kernel, broadcastable to (B, H, L, k)."""
        raise NotImplementedError

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        weights = torch.softmax(self.kernel_logits(module, query).float(), dim=-1)
        if module.training and self.cfg.p_weight > 0:
            # fairseq drops kernel weights per batch element, position and head (it expands the kernel to T x B x H
            # first): a shared (1, H, 1, k) kernel is expanded so that no two positions share a mask
            b, h, length, _ = value.shape
            weights = F.dropout(weights.expand(b, h, length, weights.shape[-1]), p=self.cfg.p_weight)
        real = key_padding(attention_mask, value)                   # (B, 1, L, 1)
        value = value * real                                        # padded positions contribute nothing
        if has_probe(module):
            return attend(module, banded_matrix(weights, value.shape[2]) * real.transpose(-1, -2), value)
        return convolve(value, weights).transpose(1, 2).contiguous(), None


def _like(module) -> torch.Tensor:
    return module.query.weight if hasattr(module, "query") else next(module.parameters())


@register_method("lightconv")
class LightConv(_Convolution):
    """Lightweight convolution over the values in place of attention: one softmax-normalised kernel per head."""

    def prepare(self, model: torch.nn.Module) -> None:
        modules = attention_modules(model)
        for module, k in zip(sorted(modules, key=lambda m: m.layer_idx),
                             kernel_sizes(len(modules), self.cfg.kernel_size)):
            like = _like(module)
            module.register_parameter("lightconv_kernel", torch.nn.Parameter(
                torch.zeros(module.num_attention_heads, k, dtype=like.dtype, device=like.device)))

    def extra_parameters(self, config) -> int:
        return sum(config.num_attention_heads * k for k in self._widths(config))

    def kernel_logits(self, module, query):
        return module.lightconv_kernel[None, :, None, :]


KERNEL_INPUTS = ("input", "query")


@dataclasses.dataclass
class DynamicConvConfig(ConvConfig):
    # what the kernel is predicted from: "input", the convolution's own input (the value vectors it convolves), as
    # in the paper and fairseq's DynamicConv1dTBC (its `query` defaults to its input x); "query": the layer's query
    # vectors, what this suite did first
    kernel_input: str = "input"


@register_method("dynamicconv")
class DynamicConv(_Convolution):
    """Dynamic convolution in place of attention: a kernel per position and head predicted by a linear map from the
    convolution's own input, the value vectors (`kernel_input="input"`, the paper's and fairseq's choice), or from
    the layer's query vectors (`kernel_input="query"`, the suite's first version)."""

    Config = DynamicConvConfig
    # records made before kernel_input existed predicted the kernel from the query: they keep their hash only there
    hashed_when_changed = {"kernel_input": "query"}

    def validate(self) -> None:
        super().validate()
        if self.cfg.kernel_input not in KERNEL_INPUTS:
            raise HyperParameterError(f"dynamicconv.kernel_input={self.cfg.kernel_input!r}: choose one of "
                                      f"{', '.join(KERNEL_INPUTS)}")

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        source = value if self.cfg.kernel_input == "input" else query
        return super().attention(module, source, key, value, attention_mask, scaling, **kwargs)

    def prepare(self, model: torch.nn.Module) -> None:
        modules = attention_modules(model)
        for module, k in zip(sorted(modules, key=lambda m: m.layer_idx),
                             kernel_sizes(len(modules), self.cfg.kernel_size)):
            like = _like(module)
            heads = module.num_attention_heads
            module.dynamicconv_width = k
            module.register_parameter("dynamicconv_predictor", torch.nn.Parameter(
                torch.zeros(heads * k, heads * module.attention_head_size, dtype=like.dtype, device=like.device)))

    def extra_parameters(self, config) -> int:
        return sum(config.num_attention_heads * k * config.hidden_size for k in self._widths(config))

    def kernel_logits(self, module, source):
        """`source`: the value (kernel_input="input") or query vectors, (B, H, L, d)."""
        b, h, length, d = source.shape
        flat = source.transpose(1, 2).reshape(b, length, h * d)                      # every head's vector
        logits = F.linear(flat, module.dynamicconv_predictor.to(flat.dtype))         # (B, L, H * k)
        return logits.view(b, length, h, module.dynamicconv_width).transpose(1, 2)   # (B, H, L, k)
