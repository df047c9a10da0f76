"""Lightweight and dynamic convolutions in place of attention (Wu et al. 2019, "Pay Less Attention with Lightweight
and Dynamic Convolutions"); docs/methods.md#lightconv and #dynamicconv.

Per layer, the probabilities-times-values product becomes a depthwise convolution of width k over the value vectors:
    O[i, h] = sum_t w[t] * V[i + t - k // 2, h]       t = 0 .. k-1, zero outside the sequence and at padding
(and, in a local layer such as ModernBERT's, at taps beyond its window)
with the kernel softmax-normalised over its taps and DropConnect on it in training, drawn per batch element,
position and head as in fairseq (not once per head and tap for the whole batch). `lightconv` has one kernel per head
(shared by the head's channels); `dynamicconv` predicts a kernel per position and head by a linear map of the
convolution's own input, the value vectors (as fairseq; `kernel_input="query"`: of the query vectors instead).
Kernel logits (and the dynamic map) start at zero: a uniform window average.

The fast path cuts the length into blocks and multiplies each block's banded (block x (block + k - 1)) kernel matrix
with the values it reads, one batched matmul for all blocks (fairseq's PyTorch path, `_forward_expanded`, builds the
same band over the whole length): a few operators per layer whatever k, a cost linear in the length. Under a
statistics probe the weights are laid out as the full banded (L x L) mixing matrix and passed to `suite.attend`, so
statistics and analyses see the convolution.
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
    check_integer,
    has_probe,
    register_method,
)
from suite.api.layers import local_window
from suite.api.stochastic import Stochastic

from .entmax_attention import at_least_fp32

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


def padding_positions(attention_mask) -> torch.Tensor | None:
    """(B, 1, L, 1) bool: True at padding (a key no query may attend), or None without a mask."""
    if attention_mask is None:
        return None
    return (attention_mask != 0).all(dim=-2).unsqueeze(-1)


def block_size(k: int, length: int) -> int:
    """Positions per block of `convolve`: the power of two at or above max(min(k, length), 16), so that the band a
    block reads (block + k - 1 positions) costs at most about twice the k taps, lengths that are multiples of 16
    split evenly, and a short sequence is one block however wide the kernel."""
    return 1 << max(min(k, length) - 1, 15).bit_length()


def skew(weights: torch.Tensor, block: int, extra_rows: int = 0) -> torch.Tensor:
    """Kernel rows laid out along a band: (..., R, k), with R + extra_rows a multiple of `block` -> (...,
    (R + extra_rows) / block, block, block + k - 1), where row r of a block holds its taps in columns r .. r + k - 1
    and zeros elsewhere (the extra rows are zero). Padding each row with `block` zeros and reading the flat buffer
    with rows one shorter shifts row r by r: one pad and views, whatever the length."""
    *lead, rows, k = weights.shape
    flat = F.pad(weights, (0, block, 0, extra_rows)).reshape(*lead, (rows + extra_rows) // block, block * (block + k))
    return flat[..., :block * (block + k - 1)].unflatten(-1, (block, block + k - 1))


def convolve(value: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_t weights[..., t] * value shifted by t - k // 2 along the length; value (B, H, L, d), weights (B or 1,
    H, L or 1, k). Zero outside the sequence. The length is cut into blocks; each block of positions is one
    (block x (block + k - 1)) banded matrix times the values it reads, so a call is a fixed handful of operators
    (one batched matmul) whatever k, and its cost stays linear in the length."""
    b, h, length, d = value.shape
    k = weights.shape[-1]
    if k > 2 * length - 1:  # taps more than length - 1 away from the centre only ever read zeros
        weights = weights[..., k // 2 - length + 1:k // 2 + length]
        k = 2 * length - 1
    block = block_size(k, length)
    blocks = -(-length // block)
    left = k // 2
    w = weights.to(value.dtype)
    if w.shape[2] == 1:  # one kernel for every position: one band, broadcast over the blocks
        band = skew(w.expand(*w.shape[:2], block, k), block)
    else:                # rows up to whole blocks (the extra rows' outputs are cut off below)
        band = skew(w, block, blocks * block - length)                  # (B, H, blocks, block, block + k - 1)
    padded = F.pad(value, (0, 0, left, blocks * block - length + k - 1 - left))
    windows = padded.unfold(2, block + k - 1, block).transpose(-1, -2)  # (B, H, blocks, block + k - 1, d)
    return torch.matmul(band, windows).flatten(2, 3)[:, :, :length]


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
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    Config = ConvConfig
    identity = None  # replaces attention: no setting equals softmax
    stochastic = (Stochastic("p_weight"),)  # DropConnect per sample, head, position and tap: one mixing weight each
    cost_target = 1.3
    # reports footnote it: the paper trains convolutional models from scratch, the suite swaps attention out of an
    # encoder pre-trained with softmax attention
    reconstruction = ("attention replaced by a convolution in an encoder pre-trained with softmax attention: it "
                      "measures how much fine-tuning depends on attention, not the paper's from-scratch model")

    def validate(self) -> None:
        super().validate()
        k = self.cfg.kernel_size
        check_integer(f"{self.name}.kernel_size", k, 0, "0: the fairseq schedule 3, 7, 15, 31, ...")

    def check_model_config(self, config) -> None:
        """A tap more than the longest input away from every position only ever meets zeros."""
        positions = getattr(config, "max_position_embeddings", None)
        if positions and self.cfg.kernel_size > 2 * positions - 1:
            raise HyperParameterError(f"{self.name}.kernel_size={self.cfg.kernel_size} is wider than any input of "
                                      f"this model can use: its position embeddings hold {positions} tokens, so at "
                                      f"most {2 * positions - 1} taps ever reach a token; give a smaller width")

    def _widths(self, config) -> list[int]:
        return kernel_sizes(config.num_hidden_layers, self.cfg.kernel_size)

    @property
    def layer_specific(self) -> str | None:
        return "a kernel width of its own (the fairseq schedule 3, 7, 15, 31)" if self.cfg.kernel_size == 0 else None

    def kernel_logits(self, module, query: torch.Tensor) -> torch.Tensor:
        """Unnormalised kernel, broadcastable to (B, H, L, k)."""
        raise NotImplementedError

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        logits = self.kernel_logits(module, query)
        # normalised in at least fp32; softmax's own upcast spares a cast (and its backward) under autocast
        weights = torch.softmax(logits, dim=-1, dtype=at_least_fp32(logits.dtype))
        if module.training and self.cfg.p_weight > 0:
            # fairseq drops kernel weights per batch element, position and head (it expands the kernel to T x B x H
            # first): a shared (1, H, 1, k) kernel is expanded so that no two positions share a mask
            b, h, length, _ = value.shape
            weights = F.dropout(weights.expand(b, h, length, weights.shape[-1]), p=self.cfg.p_weight)
        window = local_window(module)
        if window is not None and weights.shape[-1] // 2 > window:  # a local layer's keys end at its window
            k = weights.shape[-1]
            weights = weights * ((torch.arange(k, device=weights.device) - k // 2).abs() <= window).to(weights)
        padding = padding_positions(attention_mask)                 # (B, 1, L, 1)
        if padding is not None:
            value = value.masked_fill(padding, 0.0)                 # padded positions contribute nothing
        if has_probe(module):
            mixing = banded_matrix(weights, value.shape[2])
            if padding is not None:
                mixing = mixing.masked_fill(padding.transpose(-1, -2), 0.0)
            return attend(module, mixing, value)
        return convolve(value, weights).transpose(1, 2).contiguous(), None


def _like(module) -> torch.Tensor:
    return module.query.weight if hasattr(module, "query") else next(module.parameters())


@register_method("lightconv")
class LightConv(_Convolution):
    """Lightweight convolution over the values in place of attention: one softmax-normalised kernel per head."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

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
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

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
