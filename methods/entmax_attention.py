"""sparsemax, 1.5-entmax and alpha-entmax with a learned alpha per head (docs/methods.md#sparsemax, #entmax15,
#entmax_alpha), through the `entmax` package.

The mapping replaces the softmax over the keys. It always runs in at least fp32 (autocast off, scores upcast, the
result cast back): the entmax threshold squares the scores and loses the row sum in half precision. Padded keys get
the mask minimum, which lies outside every row's support, so they receive exactly zero weight; a row with no real key
at all (a fully padded sample) gets zero weight everywhere from `entmax_alpha`, the uniform row from the other two.

`entmax_alpha` (Correia et al. 2019, "Adaptively Sparse Transformers"): each attention module stores an unconstrained
parameter `entmax_pre_alpha` (one per head); every forward maps it to
    alpha = ALPHA_MIN + (2 - ALPHA_MIN) * sigmoid(alpha_lr_mult * pre_alpha)     in [ALPHA_MIN, 2]
so no optimizer step can leave (1, 2]. The floor 1.01 (the usual clamp of public implementations) keeps the
bisection's 1/(alpha-1) terms finite. `alpha_lr_mult` multiplies the effective learning rate of alpha under Adam
(Adam is invariant to the gradient's scale, so scaling the parameter inside the map scales its step); at fine-tuning
learning rates (5e-5) and a few hundred steps alpha otherwise barely moves from its initial value.
Bisection is slow on CPU (several times slower than entmax15 per call).
"""
from __future__ import annotations

import dataclasses
import math

import torch
from entmax.activations import Entmax15Function, SparsemaxFunction

from suite.api.attention import (
    AttentionMethod,
    HyperParameterError,
    NoConfig,
    attend,
    attention_modules,
    check_integer,
    register_method,
)

ALPHA_MIN = 1.01


def masked_scores_fp32(query, key, scaling, attention_mask) -> torch.Tensor:
    """Scaled scores in at least fp32, padded keys at the mask minimum (fp32's with transformers' fp32 mask).
    One operator scales and masks: mask + scaling * scores, computed in fp32 (scores from bf16 autocast are scaled
    after the upcast, not before); a real key's mask entry is 0, and a padded one's scores vanish beside the mask
    minimum."""
    s = torch.matmul(query, key.transpose(-1, -2))
    work = at_least_fp32(s.dtype)
    if attention_mask is None:
        return (s * scaling).to(work)
    return torch.add(attention_mask.to(at_least_fp32(attention_mask.dtype)), s, alpha=scaling).to(work)


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    """torch.promote_types(dtype, float32) in Python: the torch call is an operator of its own at every layer."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# The `entmax` package's three mappings declared again with static methods: torch.compile cannot bind the package's
# classmethod `forward` and broke the graph at every layer. sparsemax's and entmax15's forwards are the package's own,
# the bisection's is the package's arithmetic in fewer operators; each backward is the package's formula (entmax 1.3:
# activations.SparsemaxFunction / Entmax15Function, root_finding.EntmaxBisectFunction), written out because a compiled
# graph cannot call another Function's backward.

class _Sparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, dim: int):
        return SparsemaxFunction.forward(ctx, X, dim, None)

    @staticmethod
    def backward(ctx, dY):
        supp_size, output = ctx.saved_tensors
        dim = ctx.dim
        grad = dY.masked_fill(output == 0, 0)
        v_hat = (grad.sum(dim=dim) / supp_size.to(output.dtype).squeeze(dim)).unsqueeze(dim)
        return torch.where(output != 0, grad - v_hat, grad), None


class _Entmax15(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, dim: int):
        return Entmax15Function.forward(ctx, X, dim, None)

    @staticmethod
    def backward(ctx, dY):
        (Y,), dim = ctx.saved_tensors, ctx.dim
        gppr = Y.sqrt()  # = 1 / g''(Y)
        dX = dY * gppr
        return dX - (dX.sum(dim) / gppr.sum(dim)).unsqueeze(dim) * gppr, None


def sparsemax(X: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _Sparsemax.apply(X, dim)


def entmax15(X: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _Entmax15.apply(X, dim)


class _EntmaxBisect(torch.autograd.Function):
    """The package's bisection (root_finding.EntmaxBisectFunction, ensure_sum_one) with the same arithmetic in
    fewer operators: 1 / (alpha - 1) is taken once rather than at every step, the step's midpoint is the lower end
    plus the first bracket scaled by 2^-(it + 1) (exact, as the package's repeated halving), and `sum >= 1` stands
    for `sum - 1 >= 0` (the same test: S - 1 is exact near 1). A row whose keys are all masked (a fully padded
    sample) keeps its bracket at the mask minimum and finds no support: it gets zero attention, where the package
    divides 0 by 0, and no gradient."""

    @staticmethod
    def forward(ctx, X, alpha, dim: int, n_iter: int):
        shape = list(X.shape)
        shape[dim] = 1
        alpha = alpha.expand(*shape)
        ctx.alpha, ctx.dim = alpha, dim
        am1 = alpha - 1
        inv = am1.reciprocal()
        max_val = X.max(dim=dim, keepdim=True).values * am1
        X = X * am1
        tau_lo = max_val - 1
        dm = (max_val - (1 / X.shape[dim]) ** am1) - tau_lo
        for it in range(n_iter):
            tau_m = torch.add(tau_lo, dm, alpha=0.5 ** (it + 1))
            p_m = torch.clamp(X - tau_m, min=0) ** inv
            tau_lo = torch.where(p_m.sum(dim, keepdim=True) >= 1, tau_m, tau_lo)
        p_m = p_m / p_m.sum(dim, keepdim=True).clamp_min(torch.finfo(p_m.dtype).tiny)
        ctx.save_for_backward(p_m)
        return p_m

    @staticmethod
    def backward(ctx, dY):
        (Y,), alpha, dim = ctx.saved_tensors, ctx.alpha, ctx.dim
        support = Y > 0
        gppr = torch.where(support, Y ** (2 - alpha), 0.0)
        # a row without support (fully masked) has gppr summing to 0: clamped, its gradients are 0, not 0 / 0
        gppr_sum = gppr.sum(dim, keepdim=True).clamp_min(torch.finfo(gppr.dtype).tiny)
        dX = dY * gppr
        dX = dX - dX.sum(dim, keepdim=True) / gppr_sum * gppr
        d_alpha = None
        if ctx.needs_input_grad[1]:
            S = torch.where(support, Y * torch.log(Y), 0.0)  # Shannon terms
            ent = S.sum(dim, keepdim=True)
            Y_skewed = gppr / gppr_sum
            d_alpha = dY * (Y - Y_skewed) / ((alpha - 1) ** 2) - dY * (S - Y_skewed * ent) / (alpha - 1)
            d_alpha = d_alpha.sum(dim, keepdim=True)
        return dX, d_alpha, None, None


def entmax_bisect(X: torch.Tensor, alpha: torch.Tensor, dim: int = -1, n_iter: int = 50) -> torch.Tensor:
    return _EntmaxBisect.apply(X, alpha, dim, n_iter)


def _no_autocast(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


class _EntmaxFamily(AttentionMethod):
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    Config = NoConfig
    identity = None  # a different mapping from softmax: no setting equals it
    stochastic = ()

    def mapping(self, module, s: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = masked_scores_fp32(query, key, scaling, attention_mask)
        with _no_autocast(s.device):
            probs = self.mapping(module, s)
        return attend(module, probs.to(query.dtype), value)


@register_method("sparsemax")
class Sparsemax(_EntmaxFamily):
    """sparsemax over the keys (Euclidean projection onto the simplex): exact zeros, rows sum to 1."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 2.0  # x eager attention step (CUDA)

    def mapping(self, module, s):
        return sparsemax(s, dim=-1)


@register_method("entmax15")
class Entmax15(_EntmaxFamily):
    """1.5-entmax over the keys (exact sort-based algorithm): sparse, smoother than sparsemax."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)
    cost_target = 2.0  # x eager attention step (CUDA)

    def mapping(self, module, s):
        return entmax15(s, dim=-1)


@dataclasses.dataclass
class EntmaxAlphaConfig:
    alpha_init: float = 1.5     # initial alpha of every head, in (1.01, 2)
    alpha_lr_mult: float = 1.0  # effective learning-rate multiplier of alpha (see the module docstring)
    n_iter: int = 25            # bisection iterations (the package: 24 reach fp32 precision)


def alpha_from_pre(pre_alpha: torch.Tensor, lr_mult: float = 1.0) -> torch.Tensor:
    scaled = pre_alpha if lr_mult == 1.0 else lr_mult * pre_alpha  # x * 1.0 is x: no operator for it
    return ALPHA_MIN + (2.0 - ALPHA_MIN) * torch.sigmoid(scaled)


def pre_from_alpha(alpha: float, lr_mult: float = 1.0) -> float:
    u = (alpha - ALPHA_MIN) / (2.0 - ALPHA_MIN)
    return math.log(u / (1.0 - u)) / lr_mult


@register_method("entmax_alpha")
class EntmaxAlpha(AttentionMethod):
    """alpha-entmax with one learned alpha in (1, 2] per head and layer (bisection); alphas go into the record."""
    capturable = True  # the standard step replays from a CUDA graph (suite.run.capture)

    Config = EntmaxAlphaConfig
    identity = None
    stochastic = ()

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self._attention_modules: list[torch.nn.Module] = []

    def validate(self) -> None:
        super().validate()
        a, m, n = self.cfg.alpha_init, self.cfg.alpha_lr_mult, self.cfg.n_iter
        if not (isinstance(a, (int, float)) and ALPHA_MIN < a < 2):
            raise HyperParameterError(f"entmax_alpha.alpha_init={a!r} is impossible: it must lie in "
                                      f"({ALPHA_MIN}, 2) (alpha=2 is sparsemax, alpha->1 softmax)")
        if not (isinstance(m, (int, float)) and math.isfinite(m) and m > 0):
            raise HyperParameterError(f"entmax_alpha.alpha_lr_mult={m!r} is impossible: it must be > 0")
        check_integer("entmax_alpha.n_iter", n, 1)

    def extra_parameters(self, config) -> int:
        return config.num_hidden_layers * config.num_attention_heads  # one alpha per head and layer

    def prepare(self, model: torch.nn.Module) -> None:
        self._attention_modules = sorted(attention_modules(model), key=lambda m: m.layer_idx)
        start = pre_from_alpha(self.cfg.alpha_init, self.cfg.alpha_lr_mult)
        for module in self._attention_modules:
            like = next(module.parameters())
            module.register_parameter("entmax_pre_alpha", torch.nn.Parameter(
                torch.full((module.num_attention_heads,), start, dtype=torch.float32, device=like.device)))

    def alpha(self, module) -> torch.Tensor:
        """(H,) alphas of this module, recomputed from the unconstrained parameter at every call."""
        pre = module.entmax_pre_alpha
        return alpha_from_pre(pre.to(at_least_fp32(pre.dtype)), self.cfg.alpha_lr_mult)

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = masked_scores_fp32(query, key, scaling, attention_mask)
        with _no_autocast(s.device):
            alpha = self.alpha(module).to(s.dtype).view(1, -1, 1, 1)
            probs = entmax_bisect(s, alpha=alpha, dim=-1, n_iter=self.cfg.n_iter)
        return attend(module, probs.to(query.dtype), value)

    def learned_alphas(self) -> list[list[float]]:
        with torch.no_grad():
            return [[round(float(a), 6) for a in self.alpha(m)] for m in self._attention_modules]

    def epoch_record(self) -> dict:
        return {"alpha": self.learned_alphas()}

    def record(self) -> dict:
        return {"alpha": self.learned_alphas()}
