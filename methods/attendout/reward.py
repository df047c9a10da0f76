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

The K masks of a step are evaluated in one batched pass at each point: the batch repeated K times, copy k under
mask k. Their hidden dropout draws one mask per copy of the batch and repeats it (`tiled_dropout`), so the K masks
still share every hidden-dropout draw with each other and with the training forward (common random numbers), and
the two points of the difference run the same shapes. eps is a device tensor: nothing here waits for the device.
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
    """The global generators' state at one moment (and that of `extra` generators), to replay the same dropout draws
    (common random numbers). Host-side state: saving and restoring it never waits for the device."""

    def __init__(self, device: torch.device, *extra: torch.Generator):
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.extra = [(g, g.get_state()) for g in extra]

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)
        for g, state in self.extra:
            g.set_state(state)


def tiled_dropout(x: torch.Tensor, p: float, copies: int) -> torch.Tensor:
    """Inverted dropout of `x` whose rows are `copies` copies of one batch: one keep mask is drawn for one copy and
    used for all, so every copy sees the same draws. Drawn in fp32 whatever the dtype of `x`, so that a low-precision
    training forward and the fp32 reward passes draw the same mask from the same random state."""
    rows = x.shape[0] // copies
    # uniform < keep is Bernoulli(keep) and about 1.5x faster than bernoulli_ on a CPU
    scale = (torch.rand((rows, *x.shape[1:]), device=x.device) < 1 - p).to(x.dtype).mul_(1 / (1 - p))
    if copies == 1:
        return x * scale
    return (x.unflatten(0, (copies, rows)) * scale).flatten(0, 1)


class SharedDraws:
    """The model's hidden dropout (nn.Dropout modules, as in BERT and its kin) drawing through `tiled_dropout` while
    `shared(copies)` is active, and unchanged otherwise."""

    def __init__(self, model: nn.Module):
        self.modules = [m for m in model.modules() if isinstance(m, nn.Dropout)]
        self.rates: dict[nn.Module, float] = {}
        self.copies = 1
        for m in self.modules:
            m.register_forward_hook(self._draw)

    def _draw(self, module, args, output):
        p = self.rates.get(module)
        return None if p is None else tiled_dropout(args[0], p, self.copies)

    @contextlib.contextmanager
    def shared(self, copies: int):
        live = [m for m in self.modules if m.training and m.p > 0]
        for m in live:
            m.training = False  # the module then passes its input through, and `_draw` draws instead
        self.rates, self.copies = {m: m.p for m in live}, copies
        try:
            yield
        finally:
            for m in live:
                m.training = True
            self.rates, self.copies = {}, 1


def repeated(batch: dict, copies: int) -> dict:
    """The batch `copies` times over along the batch dimension (copy-major), for one pass over several masks."""
    return batch if copies == 1 else {k: torch.cat([v] * copies) for k, v in batch.items()}


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


def shifted(model: nn.Module, direction: dict[str, torch.Tensor], eps, inplace: bool = False
            ) -> dict[str, torch.Tensor]:
    """The trainable weights moved by eps * direction (a new dict; the model is unchanged). `eps` may be a number or a
    0-d tensor. With `inplace`, the direction's tensors become the moved weights (the same arithmetic, and no new
    memory: fresh tensors of a model's size cost more to allocate and touch on a CPU than the arithmetic itself)."""
    params = {n: p.detach() for n, p in trainable(model).items()}
    names = [n for n in params if n in direction]
    if isinstance(eps, torch.Tensor) and names:  # in the weights' dtype: multi-tensor kernels then take the fast path
        eps = eps.to(direction[names[0]].dtype)
    if inplace:
        moved = [direction[n] for n in names]
        torch._foreach_mul_(moved, eps)
        torch._foreach_add_(moved, [params[n] for n in names])
    else:
        moved = torch._foreach_add([params[n] for n in names], torch._foreach_mul([direction[n] for n in names], eps))
    return params | dict(zip(names, moved))


def squared_norm(direction: dict[str, torch.Tensor]) -> torch.Tensor:
    """|direction|^2 as a 0-d float64 tensor on the direction's device (per-tensor norms, summed in float64)."""
    return torch.stack(torch._foreach_norm(list(direction.values()))).double().square().sum()


def probe_size(fd_decrease: float, norm2: torch.Tensor) -> torch.Tensor:
    """eps = fd_decrease / |v|^2, in fp32 range: v = 0 then gives a finite eps, so theta + eps v = theta and every
    reward is exactly what the first-order formula says, 0 (no branch on the value: it would wait for the device)."""
    return fd_decrease / norm2.clamp_min(torch.finfo(torch.float32).tiny)


@torch.no_grad()
def alignment_rewards(model: nn.Module, batch: dict, base_losses: torch.Tensor, moved: dict[str, torch.Tensor],
                      eps, eta: float, replay: contextlib.AbstractContextManager) -> torch.Tensor:
    """Per-sample rewards eta * v . grad l_i by a forward difference from `base_losses` (the losses at theta under the
    same masks and draws) to the losses at theta + eps v; `replay` re-enters the masks and the random state."""
    with replay:
        moved_losses = losses_at(model, moved, batch)
    return eta * (moved_losses - base_losses) / eps
