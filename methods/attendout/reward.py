"""AttendOut's reward: the first-order look-ahead, per sample, under common random numbers.

A virtual SGD step theta' = theta - eta * g on the masked batch x_t changes the loss of the next batch x_{t+1} by
L(x_{t+1}; theta') - L(x_{t+1}; theta) ~ -eta * v . g with v = grad L(x_{t+1}; theta) (eval mode). The reward of a mask
is the predicted decrease, eta * v . g_m, positive when the step under that mask helps the next batch more. This is
the gradient-alignment signal of learning-to-reweight methods (Ren et al. 2018): it needs one extra backward pass on
x_{t+1} and never subtracts two nearly equal losses (the full look-ahead's loss difference sits at fp32 rounding
level at fine-tuning learning rates).

Per-sample credit: g_m is the mean of per-sample gradients, so sample i's share is eta * v . grad l_i(theta; m_i),
and only sample i's own mask affects it. It is read off as a directional derivative of l_i along v by a forward
difference, eta * (l_i(theta + eps v; m) - l_i(theta; m)) / eps, with eps = fd_decrease / |v|^2: theta + eps v moves
up the next batch's gradient, so the probe point raises the next-batch loss by about fd_decrease (eps |v|^2 to first
order); only the size of the step is chosen, the reward's sign comes from the formula. Forward passes only, in fp32,
with the same masks and the same hidden-dropout draws at both points (`RandomState`), so the difference is the
derivative and not dropout noise.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call


def per_sample_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The task loss of each sample, matching transformers' choice of loss for sequence classification."""
    cfg = model.config
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least fp32; float64 stays
    if cfg.problem_type == "regression" or (cfg.problem_type is None and cfg.num_labels == 1):
        return (logits.view(labels.shape[0], -1).squeeze(-1) - labels.to(logits.dtype)) ** 2
    if cfg.problem_type == "multi_label_classification" or (cfg.problem_type is None and labels.is_floating_point()):
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none").mean(-1)
    return F.cross_entropy(logits.view(-1, cfg.num_labels), labels.view(-1), reduction="none")


class RandomState:
    """The global generators' state at one moment, to replay the same dropout draws (common random numbers)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def model_inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def losses_at(model: nn.Module, params: dict[str, torch.Tensor] | None, batch: dict) -> torch.Tensor:
    """Per-sample fp32 losses of the model (with `params` substituted, if given) on `batch`, in its current mode."""
    with torch.autocast(batch["input_ids"].device.type, enabled=False):
        if params is None:
            logits = model(**model_inputs(batch)).logits
        else:
            logits = functional_call(model, params, args=(), kwargs=model_inputs(batch)).logits
    return per_sample_loss(model, logits, batch["labels"])


def next_batch_gradient(model: nn.Module, next_batch: dict) -> dict[str, torch.Tensor]:
    """v = grad of the mean fp32 loss on the next batch at the current weights, in eval mode (no dropout)."""
    params = trainable(model)
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            loss = losses_at(model, None, next_batch).mean()
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    finally:
        model.train(was_training)
    return {n: g for n, g in zip(params, grads) if g is not None}


def shifted(model: nn.Module, direction: dict[str, torch.Tensor], eps: float) -> dict[str, torch.Tensor]:
    """The trainable weights moved by eps * direction (a new dict of tensors; the model is unchanged)."""
    return {n: (p.detach() + eps * direction[n]) if n in direction else p.detach()
            for n, p in trainable(model).items()}


def squared_norm(direction: dict[str, torch.Tensor]) -> float:
    return float(sum((g.double() ** 2).sum() for g in direction.values()))


@torch.no_grad()
def alignment_rewards(model: nn.Module, batch: dict, base_losses: torch.Tensor, moved: dict[str, torch.Tensor],
                      eps: float, eta: float, replay: contextlib.AbstractContextManager) -> torch.Tensor:
    """Per-sample rewards eta * v . grad l_i by a forward difference from `base_losses` (the losses at theta under the
    same masks and draws) to the losses at theta + eps v; `replay` re-enters the masks and the random state."""
    with replay:
        moved_losses = losses_at(model, moved, batch)
    return eta * (moved_losses - base_losses) / eps
