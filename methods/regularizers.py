"""Two zero-cost attention regularizers that follow AttendOut's stated findings
(docs/methods.md#scores_dropout_layerwise, #scores_dropout_dynamic).

They are reconstructions, not the paper's formulas (which are not public): both are scores dropout
(docs/methods.md#scores_dropout) whose rate
is set by a rule instead of a generator network, so they cost nothing beyond scores dropout.

- `scores_dropout_layerwise`: lower layers need more dropout. p_l = p_top + (p_bottom - p_top) * (1 - l / (L - 1)).
- `scores_dropout_dynamic`: the pattern must be dynamic and sample-dependent. p ~ Uniform(0, 2 * p_mean), drawn
  afresh for every sample and layer at every forward pass in training.
"""
from __future__ import annotations

import dataclasses

import torch

from suite.api.attention import HyperParameterError, register_method
from suite.api.stochastic import Stochastic

from .dropout import ScoresDropout


def layerwise_rate(layer: int, num_layers: int, p_bottom: float, p_top: float) -> float:
    """Linear from p_bottom at the first layer to p_top at the last (a single layer gets p_bottom)."""
    depth = layer / (num_layers - 1) if num_layers > 1 else 0.0
    return p_top + (p_bottom - p_top) * (1.0 - depth)


@dataclasses.dataclass
class LayerwiseConfig:
    p_bottom: float = 0.2  # rate of the first (lowest) layer
    p_top: float = 0.0     # rate of the last layer


@register_method("scores_dropout_layerwise")
class ScoresDropoutLayerwise(ScoresDropout):
    """Scores dropout whose rate falls linearly with depth, p_bottom to p_top (AttendOut-motivated)."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

    reconstruction = ("AttendOut-motivated regularizer: a reconstruction from the paper's stated findings, "
                      "not its formula.")

    Config = LayerwiseConfig
    identity = {"p_bottom": 0.0, "p_top": 0.0}
    stochastic = (Stochastic("p_bottom"), Stochastic("p_top"))

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.num_layers: int | None = None

    def prepare(self, model) -> None:
        self.num_layers = model.config.num_hidden_layers

    @property
    def layer_specific(self) -> str | None:
        return "a drop rate of its own (falling with depth)" if self.cfg.p_bottom != self.cfg.p_top else None

    def drop_rate(self, module, batch_size: int, device) -> float:
        return layerwise_rate(module.layer_idx, module.config.num_hidden_layers, self.cfg.p_bottom, self.cfg.p_top)

    def rates(self, num_layers: int) -> list[float]:
        return [layerwise_rate(layer, num_layers, self.cfg.p_bottom, self.cfg.p_top) for layer in range(num_layers)]

    def record(self) -> dict:
        return {"drop_rate_per_layer": self.rates(self.num_layers)} if self.num_layers else {}


@dataclasses.dataclass
class DynamicConfig:
    p_mean: float = 0.1  # mean of the per-sample rate; rates are drawn from Uniform(0, 2 * p_mean)


@register_method("scores_dropout_dynamic")
class ScoresDropoutDynamic(ScoresDropout):
    """Scores dropout with a rate drawn per sample and layer at every step from Uniform(0, 2 p_mean)."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

    reconstruction = ("AttendOut-motivated regularizer: a reconstruction from the paper's stated findings, "
                      "not its formula.")

    Config = DynamicConfig
    identity = {"p_mean": 0.0}
    stochastic = (Stochastic("p_mean"),)  # the rate is drawn per sample; each pair's drop per sample, head, query, key

    def validate(self) -> None:
        super().validate()
        if not 2 * self.cfg.p_mean < 1:
            raise HyperParameterError(f"{self.name}.p_mean={self.cfg.p_mean} is impossible: rates are drawn from "
                                      f"Uniform(0, 2 * p_mean), so 2 * p_mean must be < 1")

    def drop_rate(self, module, batch_size: int, device) -> float | torch.Tensor:
        if self.cfg.p_mean == 0.0:
            return 0.0
        # one rate per sample, shared by its heads and query-key pairs; each layer's call draws its own
        return torch.rand(batch_size, 1, 1, 1, device=device) * (2 * self.cfg.p_mean)
