"""AttendOut (Wu, Zhao, Zhang 2021, "Not All Attention Is All You Need"): a reconstruction, not the paper's code.

The paper's full text and code are not public; this is the design documented in methods.md §3.3, with every choice
a hyper-parameter.

- Attacker A: the model being fine-tuned; its weights are the ones evaluated. In training its attention scores are
  dropped by masks sampled from the generator G (scores dropout: dropped pairs get the mask minimum before the
  softmax; the diagonal is never dropped; padding stays masked).
- Defender D: the same weights with vanilla attention-probability dropout (`p_defender`), re-synchronised to A
  before every `sync_every`-th reward. With sync_every=1 D simply uses A's tensors (the same as copying them before
  every reward); otherwise D keeps its own copy, advanced between syncs by its own plain-SGD look-ahead step.
- Generator G: a single-head self-attention G-Net per layer (or one shared with a layer embedding) over the detached
  input hidden states h_l of attention layer l: logits = (h Wq)(h Wk)^T / sqrt(d_g) + b, pi = p_max * sigmoid(logits),
  m ~ Bernoulli(pi) of shape (B, T, T), shared across heads. G lives on the method object, outside the model's
  parameters, so it is neither optimised with the model nor saved with it.
- Reward by look-ahead: from the weights theta_t, one virtual plain-SGD step on batch x_t under G's masks (A') and
  one under vanilla dropout (D'); both are evaluated in eval mode on the next batch x_{t+1}:
  r = loss(D', x_{t+1}) - loss(A', x_{t+1}), positive when the masks generalise better.
- G is trained by REINFORCE with an exponential-moving-average baseline, advantage normalisation, an entropy bonus,
  and an optional penalty keeping the mean drop rate near a target; Adam.
- A's real optimizer step uses the gradient computed under the sampled masks.

Scale of the G losses: the policy, entropy and penalty terms are all per query-key pair. One reward is shared by N
pairs, so the policy term's useful gradient shrinks like 1/sqrt(N) per pair, while the entropy bonus and the rate
penalty act on every pair alike: at BERT sizes (N ~ 10^6 per batch) coefficients much above 1/sqrt(N) drown the
reward. Both are off by default. The look-ahead at the fine-tuning learning rate moves the weights very little, so
rewards are small (losses differ in their 7th-8th digit on MiniLM at lr 5e-5); `lookahead_lr` sets a larger step.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from suite.attention import (AttentionMethod, HyperParameterError, attend, attention_modules, check_probability,
                             drop_scores, register_method, scores, softmax)

from .dropout import NoDropout, Vanilla

REWARD_KINDS = ("batch", "sample")


@dataclasses.dataclass
class AttendOutConfig:
    p_max: float = 0.3               # cap on G's drop probabilities: pi = p_max * sigmoid(logits)
    p_init: float = 0.1              # G's drop probability at the start (sets the bias b)
    d_g: int = 32                    # size of G's query/key projections
    shared_generator: bool = False   # one G-Net for all layers plus a learned layer embedding
    p_defender: float = 0.1          # the Defender's vanilla attention-probability dropout
    sync_every: int = 1              # re-synchronise the Defender to the Attacker before every k-th reward
    g_update_every: int = 1          # reward and G update every k steps; the other steps only apply G's masks
    reward: str = "batch"            # "batch": one reward per step; "sample": per-sample rewards on x_{t+1}
    lookahead_lr: float | None = None  # step size of the virtual SGD steps; None: the optimizer's current lr
    lookahead_fp32: bool = True      # evaluate A' and D' in fp32 (their difference is below bf16 resolution)
    g_lr: float = 1e-3               # Adam learning rate of G
    baseline_decay: float = 0.9      # EMA decay of the reward baseline (and of the reward variance)
    entropy_coef: float = 0.0        # entropy bonus of G's Bernoulli policy per query-key pair (0: off; see below)
    rate_penalty: float = 0.0        # weight of (mean drop rate - rate_target)^2; 0 switches it off
    rate_target: float = 0.1         # the mean drop rate the penalty pulls towards
    advantage_clip: float = 5.0      # normalised advantages are clipped to +-this
    reward_scale_floor: float = 1e-9  # advantage scales below this are rounding noise, not a signal
    cost_probe_steps: int = 3        # timed vanilla forward-backward passes before step 1, for the cost (0: none)


class GNet(nn.Module):
    """Single-head self-attention scorer: logits_l = (h Wq_l)(h Wk_l)^T / sqrt(d_g) + b_l over query-key pairs."""

    def __init__(self, hidden: int, d_g: int, num_layers: int, shared: bool, init_bias: float):
        super().__init__()
        n = 1 if shared else num_layers
        self.shared = shared
        self.d_g = d_g
        self.query = nn.ModuleList(nn.Linear(hidden, d_g, bias=False) for _ in range(n))
        self.key = nn.ModuleList(nn.Linear(hidden, d_g, bias=False) for _ in range(n))
        self.bias = nn.Parameter(torch.full((n,), float(init_bias)))
        self.layer_embedding = nn.Embedding(num_layers, hidden) if shared else None
        if shared:
            nn.init.normal_(self.layer_embedding.weight, std=0.02)

    def forward(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """(B, T, hidden) -> logits (B, T, T)."""
        i = 0 if self.shared else layer
        if self.shared:
            h = h + self.layer_embedding.weight[layer]
        q, k = self.query[i](h), self.key[i](h)
        return torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_g) + self.bias[i]


@dataclasses.dataclass
class MaskSample:
    """One layer's sampled mask with what the policy gradient needs."""

    layer: int
    logits: torch.Tensor   # (B, T, T), attached to G's graph when collected for an update
    drop: torch.Tensor     # (B, T, T) bool, False outside `valid`
    valid: torch.Tensor    # (B or 1, T, T) bool: real query, real key, off the diagonal


def valid_pairs(attention_mask: torch.Tensor | None, length: int, device) -> torch.Tensor:
    """(B or 1, T, T) bool: pairs whose query and key are real tokens, diagonal excluded (it is never dropped)."""
    if attention_mask is None:
        keys = torch.ones(1, 1, length, length, dtype=torch.bool, device=device)
    else:
        keys = attention_mask == 0
    queries = keys.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)  # in self-attention query i is real iff key i is
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return (keys & queries & ~eye)[:, 0]


def per_sample_loss(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The task loss of each sample, matching transformers' choice of loss for sequence classification."""
    cfg = model.config
    logits = logits.float()
    if cfg.problem_type == "regression" or (cfg.problem_type is None and cfg.num_labels == 1):
        return (logits.view(labels.shape[0], -1).squeeze(-1) - labels.float()) ** 2
    if cfg.problem_type == "multi_label_classification" or (cfg.problem_type is None and labels.is_floating_point()):
        return F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none").mean(-1)
    return F.cross_entropy(logits.view(-1, cfg.num_labels), labels.view(-1), reduction="none")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@register_method("attendout")
class AttendOut(AttentionMethod):
    """AttendOut reconstruction (§3.3): G-Net scores dropout trained by look-ahead REINFORCE against a Defender."""

    reconstruction = "AttendOut: a reconstruction from the paper's description (its text and code are not public)."
    supports_fp16 = False  # the Defender's and the look-ahead gradients are taken with autograd.grad, unscaled

    Config = AttendOutConfig
    identity = {"p_max": 0.0}  # G can drop nothing: plain softmax attention

    # -- configuration -------------------------------------------------------------------------------
    def validate(self) -> None:
        super().validate()
        c = self.cfg
        if c.p_max > 0 and not 0 < c.p_init < c.p_max:
            raise HyperParameterError(f"attendout.p_init={c.p_init} must lie in (0, p_max={c.p_max})")
        check_probability("attendout.rate_target", c.rate_target)
        for name in ("d_g", "sync_every", "g_update_every"):
            if getattr(c, name) < 1:
                raise HyperParameterError(f"attendout.{name}={getattr(c, name)} is impossible: it must be >= 1")
        if c.reward not in REWARD_KINDS:
            raise HyperParameterError(f"attendout.reward={c.reward!r}: choose one of {', '.join(REWARD_KINDS)}")
        if c.lookahead_lr is not None and not c.lookahead_lr > 0:
            raise HyperParameterError(f"attendout.lookahead_lr={c.lookahead_lr} must be > 0 (or None)")
        if not c.g_lr > 0:
            raise HyperParameterError(f"attendout.g_lr={c.g_lr} must be > 0")
        if not 0 <= c.baseline_decay < 1:
            raise HyperParameterError(f"attendout.baseline_decay={c.baseline_decay} must lie in [0, 1)")
        for name in ("entropy_coef", "rate_penalty", "cost_probe_steps", "reward_scale_floor"):
            if getattr(c, name) < 0:
                raise HyperParameterError(f"attendout.{name}={getattr(c, name)} must be >= 0")
        if not c.advantage_clip > 0:
            raise HyperParameterError(f"attendout.advantage_clip={c.advantage_clip} must be > 0")

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self._plain = NoDropout()
        self._defender_attention = Vanilla(Vanilla.Config(p=self.cfg.p_defender))
        self.mode = "attacker"   # attacker: G's masks; defender: vanilla dropout (in training mode only)
        self.collect = False     # keep G's graph for the next policy update
        self.generator: GNet | None = None
        self.g_optimizer: torch.optim.Optimizer | None = None
        self.training_only_parameters = 0
        self.num_layers = 0
        self._hidden: dict[int, torch.Tensor] = {}
        self._samples: list[MaskSample] = []
        self._hooks: list = []
        self._defender: dict[str, torch.Tensor] | None = None  # own copy only when sync_every > 1
        self._steps = 0
        self._rewards_seen = 0
        self._reward_ema = 0.0
        self._dev2_ema = 0.0
        self._dev2_count = 0
        self._epochs: list[dict[str, Any]] = []
        self._reset_epoch()
        self._cost: dict[str, Any] = {"reward_step_s": [], "masked_step_s": [], "optimizer_s": [],
                                      "step_s_per_token": [], "peak_memory_mb": None,
                                      "vanilla_fwd_bwd_s": None, "vanilla_tokens": None,
                                      "vanilla_probe_peak_mb": None, "probe_s": 0.0}
        self._optimizer: torch.optim.Optimizer | None = None

    # -- model hooks ---------------------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> None:
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        init_bias = 0.0
        if self.cfg.p_max > 0:
            frac = self.cfg.p_init / self.cfg.p_max
            init_bias = math.log(frac / (1 - frac))  # sigmoid(b) * p_max = p_init
        self.generator = GNet(cfg.hidden_size, self.cfg.d_g, self.num_layers, self.cfg.shared_generator, init_bias)
        self.training_only_parameters = sum(p.numel() for p in self.generator.parameters())
        self._pi_sum = torch.zeros(self.num_layers)
        self._drop_sum = torch.zeros(self.num_layers)
        self._pair_count = torch.zeros(self.num_layers)
        for module in attention_modules(model):
            self._hooks.append(module.register_forward_pre_hook(self._capture_hidden, with_kwargs=True))

    def _capture_hidden(self, module, args, kwargs):
        if module.training and self.mode == "attacker" and self.cfg.p_max > 0:
            h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            self._hidden[module.layer_idx] = h.detach()  # G's policy loss must never reach the model

    def _ensure_ready(self, device: torch.device) -> None:
        """Move G to the model's device and build its optimizer (lazily, so bench and tests need no setup)."""
        if self.generator is None:
            raise RuntimeError("attendout: attach the method to a model first")
        if self.g_optimizer is None or next(self.generator.parameters()).device != device:
            self.generator.to(device)
            self._pi_sum, self._drop_sum, self._pair_count = (t.to(device) for t in
                                                              (self._pi_sum, self._drop_sum, self._pair_count))
            self.g_optimizer = torch.optim.Adam(self.generator.parameters(), lr=self.cfg.g_lr)

    def setup_training(self, ctx) -> None:
        self._ensure_ready(ctx.device)

    # -- attention -----------------------------------------------------------------------------------
    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        if module.training and self.mode == "defender":
            return self._defender_attention.attention(module, query, key, value, attention_mask, scaling)
        h = self._hidden.pop(module.layer_idx, None) if module.training and self.mode == "attacker" else None
        if h is None:  # eval mode (the evaluated Attacker: no dropout), p_max = 0, or no captured state
            return self._plain.attention(module, query, key, value, attention_mask, scaling)
        s = scores(query, key, scaling, attention_mask)
        drop = self._sample(module.layer_idx, h, attention_mask, s.shape[-1])
        return attend(module, softmax(drop_scores(s, drop.unsqueeze(1))), value)

    def _sample(self, layer: int, h: torch.Tensor, attention_mask, length: int) -> torch.Tensor:
        """Sample one layer's drop mask (B, T, T) from G, record its statistics and, if collecting, its graph."""
        self._ensure_ready(h.device)
        valid = valid_pairs(attention_mask, length, h.device)
        with torch.set_grad_enabled(self.collect), torch.autocast(h.device.type, enabled=False):
            logits = self.generator(h.float(), layer)
        with torch.no_grad():
            pi = self.cfg.p_max * torch.sigmoid(logits)
            drop = torch.bernoulli(pi).bool() & valid
            v = valid.expand_as(pi)
            self._pi_sum[layer] += pi.masked_fill(~v, 0.0).sum()  # masked sums: no host sync
            self._drop_sum[layer] += drop.sum()
            self._pair_count[layer] += v.sum()
        if self.collect:
            self._samples.append(MaskSample(layer, logits, drop, valid))
        return drop

    # -- policy --------------------------------------------------------------------------------------
    def _log_probs(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pi, log pi, log(1 - pi)) with pi = p_max * sigmoid(logits), computed stably."""
        log_pi = math.log(self.cfg.p_max) + F.logsigmoid(logits)
        pi = log_pi.exp()
        return pi, log_pi, torch.log1p(-pi)

    def log_prob(self, samples: list[MaskSample] | None = None) -> torch.Tensor:
        """log p(m) per sample (B,): sum over layers and valid (query, key) pairs of m log pi + (1-m) log(1-pi)."""
        samples = self._samples if samples is None else samples
        total = 0.0
        for s in samples:
            _, log_pi, log_keep = self._log_probs(s.logits)
            v = s.valid.expand_as(s.logits)
            total = total + torch.where(s.drop, log_pi, log_keep).masked_fill(~v, 0.0).sum((-1, -2))
        return total

    def _advantage(self, reward: torch.Tensor) -> float:
        """Normalised advantage of this step's reward against the EMA baseline; then update the baseline."""
        r = reward.float().mean().item()
        decay = self.cfg.baseline_decay
        adv = 0.0
        if self._rewards_seen > 0:  # the first reward only sets the baseline
            baseline = self._reward_ema / (1 - decay ** self._rewards_seen)
            dev = r - baseline
            if self.cfg.reward == "sample" and reward.numel() > 1:
                scale = reward.float().std().item()  # the spread of this step's per-sample rewards
            else:
                self._dev2_ema = decay * self._dev2_ema + (1 - decay) * dev * dev
                self._dev2_count += 1
                scale = math.sqrt(self._dev2_ema / (1 - decay ** self._dev2_count))
            scale = max(scale, self.cfg.reward_scale_floor)
            if scale > 0:
                adv = max(-self.cfg.advantage_clip, min(self.cfg.advantage_clip, dev / scale))
        self._reward_ema = decay * self._reward_ema + (1 - decay) * r
        self._rewards_seen += 1
        self._epoch["reward_sum"] += r
        self._epoch["rewards"] += 1
        return adv

    def policy_update(self, reward: torch.Tensor) -> dict[str, float]:
        """One REINFORCE step of G on the masks collected since the last update, given their reward(s)."""
        samples, self._samples = self._samples, []
        adv = self._advantage(reward)
        if not samples:
            return {"advantage": adv}
        logp = self.log_prob(samples)
        entropy, pi_sum, pairs = 0.0, 0.0, 0.0
        for s in samples:
            pi, log_pi, log_keep = self._log_probs(s.logits)
            v = s.valid.expand_as(pi)
            h = -(pi * log_pi + (1 - pi) * log_keep)
            entropy = entropy + h.masked_fill(~v, 0.0).sum((-1, -2))
            pi_sum = pi_sum + pi.masked_fill(~v, 0.0).sum()
            pairs = pairs + v.sum()
        pairs_per_sample = pairs.clamp_min(1) / samples[0].logits.shape[0]
        # REINFORCE: grad = -(r - b) grad log p(m); per-pair units so the bonus and penalty weights mean the same
        # thing for every sequence length
        loss = -(adv * logp.mean() + self.cfg.entropy_coef * entropy.mean()) / pairs_per_sample
        if self.cfg.rate_penalty > 0:
            loss = loss + self.cfg.rate_penalty * (pi_sum / pairs.clamp_min(1) - self.cfg.rate_target) ** 2
        self.g_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.g_optimizer.step()
        self._epoch["g_updates"] += 1
        return {"advantage": adv, "loss": loss.item()}

    # -- the training step ---------------------------------------------------------------------------
    def trainable(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {n: p for n, p in model.named_parameters() if p.requires_grad}

    def defender_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The Defender's weights: the Attacker's own tensors when sync_every=1, else its own copy."""
        return self._defender if self._defender is not None else self.trainable(model)

    def sync_defender(self, model: nn.Module) -> None:
        if self.cfg.sync_every == 1:
            return  # the Defender reads the Attacker's tensors directly
        with torch.no_grad():
            if self._defender is None:
                self._defender = {n: p.detach().clone().requires_grad_(True)
                                  for n, p in self.trainable(model).items()}
            else:
                for n, p in self.trainable(model).items():
                    self._defender[n].copy_(p)

    @torch.no_grad()
    def _lookahead_losses(self, ctx, params: dict[str, torch.Tensor], next_batch: dict) -> torch.Tensor:
        """Per-sample loss of `params` on next_batch in eval mode (no dropout of any kind)."""
        model = ctx.model
        inputs = {k: v for k, v in next_batch.items() if k != "labels"}
        model.eval()
        try:
            if self.cfg.lookahead_fp32:
                with torch.autocast(ctx.device.type, enabled=False):
                    logits = functional_call(model, params, args=(), kwargs=inputs).logits
            else:
                with ctx.autocast():
                    logits = functional_call(model, params, args=(), kwargs=inputs).logits
        finally:
            model.train()
        return per_sample_loss(model, logits, next_batch["labels"])

    def training_step(self, ctx, batch: dict, next_batch: dict | None) -> torch.Tensor:
        self._ensure_ready(ctx.device)
        self._steps += 1
        self._optimizer = ctx.optimizer
        if self._steps == 1 and self.cfg.cost_probe_steps > 0:
            self._probe_vanilla_cost(ctx, batch)
        _sync(ctx.device)
        start = time.perf_counter()
        reward_step = next_batch is not None and (self._steps - 1) % self.cfg.g_update_every == 0
        if reward_step:
            loss = self._reward_step(ctx, batch, next_batch)
        else:  # a plain step under G's masks (no reward: last batch of the epoch, or between G updates)
            self.mode, self.collect = "attacker", False
            loss = ctx.loss(batch)
            ctx.apply(loss)
        _sync(ctx.device)
        elapsed = time.perf_counter() - start
        self._cost["reward_step_s" if reward_step else "masked_step_s"].append(elapsed)
        self._cost["step_s_per_token"].append(elapsed / batch["input_ids"].numel())
        if ctx.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(ctx.device) / 2**20
            self._cost["peak_memory_mb"] = max(self._cost["peak_memory_mb"] or 0.0, peak)
        return loss.detach()

    def _reward_step(self, ctx, batch: dict, next_batch: dict) -> torch.Tensor:
        model = ctx.model
        params = self.trainable(model)
        names = list(params)

        # Attacker: task loss and gradient under masks sampled from G (G's graph kept for the policy update)
        self.mode, self.collect = "attacker", True
        try:
            loss_a = ctx.loss(batch)
        finally:
            self.collect = False
        grads_a = torch.autograd.grad(loss_a, [params[n] for n in names], allow_unused=True)

        # Defender: synchronised to the Attacker, gradient under vanilla attention dropout
        if self._rewards_seen % self.cfg.sync_every == 0:
            self.sync_defender(model)
        defender = self.defender_parameters(model)
        self.mode = "defender"
        try:
            with ctx.autocast():
                loss_d = functional_call(model, defender, args=(), kwargs=batch).loss
            grads_d = torch.autograd.grad(loss_d, [defender[n] for n in names], allow_unused=True)
        finally:
            self.mode = "attacker"

        # Look-ahead: one virtual plain-SGD step each from the same weights, both scored on x_{t+1}
        lr = self.cfg.lookahead_lr if self.cfg.lookahead_lr is not None else ctx.optimizer.param_groups[0]["lr"]
        with torch.no_grad():
            a_next = {n: params[n] - lr * g if g is not None else params[n] for n, g in zip(names, grads_a)}
            loss_a_next = self._lookahead_losses(ctx, a_next, next_batch)
            del a_next
            if self._defender is not None:  # between syncs the Defender trains on with its own SGD steps
                for n, g in zip(names, grads_d):
                    if g is not None:
                        self._defender[n].sub_(lr * g)
                d_next = self._defender
            else:
                d_next = {n: defender[n] - lr * g if g is not None else defender[n] for n, g in zip(names, grads_d)}
            loss_d_next = self._lookahead_losses(ctx, d_next, next_batch)
            del d_next, grads_d
        reward = loss_d_next - loss_a_next
        if self.cfg.reward == "batch":
            reward = reward.mean()
        self.policy_update(reward)

        # The Attacker's real step with the gradient computed under the sampled masks. ctx.apply runs backward,
        # so it gets a surrogate whose gradient is exactly grads_a (the masked graph is already freed).
        surrogate = sum((p * g).sum() for p, g in zip(params.values(), grads_a) if g is not None)
        _sync(ctx.device)
        t0 = time.perf_counter()
        ctx.apply(surrogate)
        _sync(ctx.device)
        self._cost["optimizer_s"].append(time.perf_counter() - t0)
        return loss_a.detach()

    def _probe_vanilla_cost(self, ctx, batch: dict) -> None:
        """Time a few vanilla forward-backward passes (attention-probability dropout p_defender) on the first batch.

        It runs before the first step, so nothing that training measures is lost when the CUDA peak counter is reset
        here (the runner resets it just before step 1 too). No optimizer step is taken, so training is unchanged; the
        optimizer part of a vanilla step (clip, AdamW, scheduler) is timed on the Attacker's own ctx.apply calls, and
        the optimizer state that a vanilla step also holds is added to the probe's peak memory once it exists.
        """
        model, device = ctx.model, ctx.device
        _sync(device)
        start = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.mode = "defender"
        times = []
        try:
            for _ in range(self.cfg.cost_probe_steps + 1):  # the first pass warms up
                _sync(device)
                t0 = time.perf_counter()
                ctx.loss(batch).backward()
                _sync(device)
                times.append(time.perf_counter() - t0)
                model.zero_grad(set_to_none=True)
        finally:
            self.mode = "attacker"
        self._cost["vanilla_fwd_bwd_s"] = statistics.median(times[1:])
        self._cost["vanilla_tokens"] = batch["input_ids"].numel()
        if device.type == "cuda":
            self._cost["vanilla_probe_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            torch.cuda.reset_peak_memory_stats(device)
        self._cost["probe_s"] = time.perf_counter() - start

    # -- records -------------------------------------------------------------------------------------
    def _reset_epoch(self) -> None:
        self._epoch = {"reward_sum": 0.0, "rewards": 0, "g_updates": 0}
        if self.num_layers:
            for t in (self._pi_sum, self._drop_sum, self._pair_count):
                t.zero_()

    def epoch_record(self) -> dict[str, Any]:
        counts = self._pair_count.tolist()
        pi = [s / c if c else None for s, c in zip(self._pi_sum.tolist(), counts)]
        drawn = [s / c if c else None for s, c in zip(self._drop_sum.tolist(), counts)]
        e = self._epoch
        entry = {"drop_rate_per_layer": pi, "sampled_drop_rate_per_layer": drawn,
                 "reward_mean": e["reward_sum"] / e["rewards"] if e["rewards"] else None,
                 "rewards": e["rewards"], "g_updates": e["g_updates"]}
        self._epochs.append(entry)
        self._reset_epoch()
        return entry

    def cost(self) -> dict[str, Any]:
        """Time per step and peak memory against vanilla, measured in this process (see _probe_vanilla_cost)."""
        c = self._cost
        steps = c["reward_step_s"] + c["masked_step_s"]
        out: dict[str, Any] = {
            "step_s": statistics.fmean(steps) if steps else None,
            "reward_step_s": statistics.fmean(c["reward_step_s"]) if c["reward_step_s"] else None,
            "masked_step_s": statistics.fmean(c["masked_step_s"]) if c["masked_step_s"] else None,
            "steps": len(steps), "probe_s": c["probe_s"],
            "vanilla_step_s": None, "step_ratio": None,
            "peak_memory_mb": c["peak_memory_mb"], "vanilla_peak_memory_mb": None, "memory_ratio": None,
            "how": "vanilla step = median of timed vanilla forward-backward passes on the first batch (before step "
                   "1, no optimizer step) + the mean optimizer part (clip, AdamW, scheduler) of this run's reward "
                   "steps; step_ratio = mean time per token of this run's steps after the first / that of the "
                   "vanilla step; step times exclude the probe. Peak memory: CUDA max allocated during training "
                   "steps, vanilla = the probe's peak + the optimizer state; None on CPU, where only the process's "
                   "peak RSS exists (compare the records' timing.peak_memory_mb)"}
        if c["vanilla_fwd_bwd_s"] is not None and c["optimizer_s"]:
            vanilla = c["vanilla_fwd_bwd_s"] + statistics.fmean(c["optimizer_s"])
            out["vanilla_step_s"] = vanilla
            per_token = c["step_s_per_token"][1:] or c["step_s_per_token"]
            out["step_ratio"] = statistics.fmean(per_token) / (vanilla / c["vanilla_tokens"])
        if c["vanilla_probe_peak_mb"] is not None and self._optimizer is not None:
            state = sum(t.numel() * t.element_size() for st in self._optimizer.state.values()
                        for t in st.values() if torch.is_tensor(t))
            out["vanilla_peak_memory_mb"] = c["vanilla_probe_peak_mb"] + state / 2**20
            if c["peak_memory_mb"]:
                out["memory_ratio"] = c["peak_memory_mb"] / out["vanilla_peak_memory_mb"]
        return out

    def record(self) -> dict[str, Any]:
        last = self._epochs[-1] if self._epochs else {}
        return {"drop_rate_per_layer": last.get("drop_rate_per_layer"),
                "drop_rate_per_layer_per_epoch": [e["drop_rate_per_layer"] for e in self._epochs],
                "reward_trace": [e["reward_mean"] for e in self._epochs],
                "g_parameters": self.training_only_parameters,
                "cost": self.cost(),
                "reconstruction": "AttendOut reconstructed from the paper's description (methods.md §3.3); "
                                  "not the authors' code"}
