"""Less attention (after LIT, Pan et al. 2022, "Less is More: Pay Less Attention in Vision Transformers");
docs/methods.md#less_attention.

The first encoder layers do no token mixing. Two forms:
- "lit" (default, as in LIT): LIT's MLP blocks: the attention sublayer is removed entirely (its output is its
  input), so the layer is the feed-forward block with its residual and LayerNorm alone;
- "linear" (the suite's first version, which the published records ran): every position attends only to itself, so
  the attention sublayer is a position-wise map through the pre-trained value and output projections, with its
  residual and LayerNorm.
How many layers: `layers` (a number), or with layers=-1 a share of the depth, `fraction` (default: the form's own,
a third for "lit": LIT frees the first 4 of 12 layers; half for "linear"), rounded down. The other layers keep softmax
attention with attention-probability dropout, as `vanilla` (the fused SDPA kernel unless a statistics probe needs
the probabilities). At layers=0 and p=0 the method is softmax attention.
"""
from __future__ import annotations

import dataclasses

import torch

from suite.api.attention import (
    HyperParameterError,
    attend,
    attention_modules,
    check_integer,
    has_probe,
    register_method,
)

from .dropout import Vanilla

FORMS = ("linear", "lit")
DEFAULT_FRACTION = {"linear": 0.5, "lit": 1 / 3}  # lit: LIT's 4 of 12 layers


@dataclasses.dataclass
class LessAttentionConfig:
    layers: int = -1   # attention-free layers counted from the bottom; -1: `fraction` of the model's layers
    p: float = 0.1     # attention-probability dropout in the layers that keep attention
    form: str = "lit"  # LIT's: no attention sublayer at all; linear: a position-wise sublayer through V and O
    fraction: float | None = None  # with layers=-1, the share freed (rounded down); None: the form's, LIT's third


def mixing_free_layers(cfg: LessAttentionConfig, num_layers: int) -> int:
    """How many of `num_layers` layers, counted from the bottom, do no token mixing."""
    if cfg.layers != -1:
        return cfg.layers
    fraction = DEFAULT_FRACTION[cfg.form] if cfg.fraction is None else cfg.fraction
    return int(fraction * num_layers + 1e-9)  # rounded down; the epsilon keeps 1/3 * 12 at 4


@register_method("less_attention")
class LessAttention(Vanilla):
    """The first layers do no token mixing: no attention sublayer at all (form "lit", default, as LIT's MLP blocks in
    a third of the layers) or a position-wise sublayer (form "linear", in half); the others keep softmax attention."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

    description = ("Less attention (after LIT): the first layers do no token mixing, the rest keep softmax attention "
                   "with dropout p. Default as in LIT: no attention sublayer at all in the first third of the layers "
                   "(form=lit); form=linear, the setting the published records ran, keeps a position-wise sublayer "
                   "through V and O in the first half.")
    Config = LessAttentionConfig
    identity = {"layers": 0, "p": 0.0}
    cost_target = 1.0  # it does less than softmax attention in every layer
    layer_specific = "attention or none by its depth (the lowest layers mix no tokens)"
    # the published records ran "linear" with half the layers, before the forms existed and while it was the default:
    # at these values the fields stay out of the hash, so those records keep theirs; the default "lit" enters it
    hashed_when_changed = {"form": "linear", "fraction": None}
    reconstruction = ("the lower layers' attention removed from an encoder pre-trained with attention in every "
                      "layer: it measures how much fine-tuning depends on it, not LIT's model trained that way")

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.free_layers: int | None = None

    def validate(self) -> None:
        super().validate()
        c = self.cfg
        n = c.layers
        check_integer("less_attention.layers", n, -1, "-1: a fraction of the layers")
        if c.form not in FORMS:
            raise HyperParameterError(f"less_attention.form={c.form!r}: choose one of {', '.join(FORMS)}")
        if c.fraction is not None:
            if isinstance(c.fraction, bool) or not isinstance(c.fraction, (int, float)) or not 0 <= c.fraction <= 1:
                raise HyperParameterError(f"less_attention.fraction={c.fraction!r} is impossible: it must lie in "
                                          "[0, 1] (or be None for the form's own)")
            if n != -1:
                raise HyperParameterError(f"less_attention.fraction={c.fraction} and layers={n} both say how many "
                                          "layers: give one (fraction applies with layers=-1)")

    def check_model_config(self, config) -> None:
        """Refuse a model with fewer layers than asked for (also run by the grid's preflight, before training)."""
        total = config.num_hidden_layers
        if self.cfg.layers > total:
            raise HyperParameterError(f"less_attention.layers={self.cfg.layers} exceeds the model's {total} layers")

    def prepare(self, model: torch.nn.Module) -> None:
        self.check_model_config(model.config)
        self.free_layers = mixing_free_layers(self.cfg, model.config.num_hidden_layers)
        if self.cfg.form == "lit":
            for module in attention_modules(model):
                if module.layer_idx < self.free_layers:
                    # its forward replaced, not hooked: the sublayer's dropout then draws nothing, so a compiled
                    # graph (which drops the unused draw) and the eager step use the same random numbers
                    _sublayer_output(model, module).forward = _residual_only

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if module.layer_idx >= mixing_free_layers(self.cfg, module.config.num_hidden_layers):
            return super().attention(module, query, key, value, attention_mask, scaling, **kwargs)
        if not has_probe(module):  # lit: discarded by the sublayer's hook anyway
            return value.transpose(1, 2).contiguous(), None
        b, h, length, _ = value.shape  # analyses see what the layer mixes: nothing
        eye = torch.eye(length, dtype=value.dtype, device=value.device).expand(b, h, length, length)
        return attend(module, eye, value)

    def record(self) -> dict:
        if self.free_layers is None:
            return {}
        return {"attention_free_layers": self.free_layers, "form": self.cfg.form}


def _sublayer_output(model: torch.nn.Module, attention: torch.nn.Module) -> torch.nn.Module:
    """The module that closes the attention sublayer (BERT's SelfOutput: dense, dropout, residual, LayerNorm)."""
    for parent in model.modules():
        if getattr(parent, "self", None) is attention and hasattr(parent, "output"):
            return parent.output
    raise HyperParameterError(f"less_attention.form='lit' cannot run on model type {model.config.model_type!r}: it "
                              "removes the attention sublayer through BERT's `attention.output` module, which "
                              f"{type(model).__name__} has none of; form='linear' runs on every type")


def _residual_only(*args, **kwargs):
    """The sublayer's forward (hidden_states, input_tensor) -> its residual input: the attention sublayer is an
    identity (LIT's MLP block)."""
    return args[1] if len(args) > 1 else kwargs["input_tensor"]
