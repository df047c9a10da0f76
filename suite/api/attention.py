"""The method API: what an attention method is, how it is registered, and how it is plugged into a model.

A method is a subclass of `AttentionMethod` with a dataclass `Config`, registered with `@register_method(name)`.
Its `attention()` has transformers' attention-interface signature (plus the method instance). Registration puts the
method into the suite's registry; attaching it to a model also registers it in transformers' `AttentionInterface`
*and* `AttentionMaskInterface` under `suite_<name>` (without the mask function transformers passes
`attention_mask=None` and padding is silently ignored).

Masks arrive in the additive form of transformers' `eager_mask`: a float tensor (B, 1, Lq, Lk) with 0 where a key may
be attended and `finfo(dtype).min` where not. The suite always builds it (`additive_mask`), but a method must still
accept `None` (a model called with no mask at all, or another caller of its attention).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from suite.api.errors import HyperParameterError
from suite.api.layers import name_the_layers, refuse_shared_layers
from suite.api.method_facts import METHODS, check_precision  # noqa: F401 (torch-free: dry runs read them there)
from suite.api.stochastic import Stochastic, stochastic_fields

# what the rest of the suite uses; other names are this module's own
__all__ = ["AttentionMethod", "NoConfig", "StepContext", "attend", "attention_modules", "check_integer",
           "check_probability", "drop_scores", "has_probe", "in_graph", "mask_fill_value", "probes", "probs_dropout",
           "register_method", "same_device", "scores", "softmax", "valid_keys"]


@dataclasses.dataclass
class NoConfig:
    pass


def check_probability(name: str, value: float, allow_one: bool = False) -> None:
    hi_ok = value <= 1 if allow_one else value < 1
    if not (0 <= value and hi_ok) or math.isnan(value):
        raise HyperParameterError(f"{name}={value} is impossible: it must lie in [0, {'1]' if allow_one else '1)'}")


def check_integer(name: str, value: Any, minimum: int, otherwise: str = "") -> None:
    """HyperParameterError unless `value` is an integer >= `minimum` (a bool is not one); `otherwise` names what a
    value below the bound means where the method gives it a meaning (e.g. "or 0 for the fairseq schedule")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise HyperParameterError(f"{name}={value!r} is impossible: it must be an integer >= {minimum}"
                                  + (f" ({otherwise})" if otherwise else ""))


@dataclasses.dataclass
class StepContext:
    """What a training step needs: every method's `training_step` receives it (the runner builds it)."""

    model: torch.nn.Module
    method: AttentionMethod
    optimizer: torch.optim.Optimizer
    scheduler: Any
    device: torch.device
    amp_dtype: torch.dtype | None
    grad_clip: float
    total_steps: int = 0  # optimizer steps of the whole run
    warmup_steps: int = 0  # of them, the learning rate's linear warm-up (Scheduled DropHead turns its rate there)
    step: int = 0         # steps taken so far (1 during the first step)
    # gradient accumulation: `apply` divides the loss by the batches of the current group and steps the optimizer
    # only on the group's last batch (the last group of an epoch may be shorter)
    group_size: int = 1
    group_end: bool = True
    # dynamic loss scaling under fp16 autocast; disabled, it passes the loss and the optimizer step through unchanged
    scaler: torch.amp.GradScaler = dataclasses.field(default_factory=lambda: torch.amp.GradScaler("cpu", enabled=False))
    # steps replayed from CUDA graphs (suite.run.capture): autocast keeps no cache of cast weights, which a graph
    # would free under its replays
    graphs: bool = False

    @property
    def lr(self) -> float:
        """The learning rate of the coming optimizer step (first parameter group)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype, cache_enabled=not self.graphs)

    def loss(self, batch: dict, model: torch.nn.Module | None = None) -> torch.Tensor:
        """Task loss plus the method's auxiliary loss, under autocast."""
        model = model or self.model
        with self.autocast():
            loss = model(**batch).loss
            aux = self.method.aux_loss(model)
        return loss if aux is None else loss + aux

    def apply(self, loss: torch.Tensor) -> None:
        """Backward, clip, optimizer and scheduler step (under fp16, with the loss scaled and the gradients unscaled
        before clipping; a step whose gradients overflowed is skipped and the scale lowered)."""
        if self.update(loss):
            self.scheduler.step()

    def update(self, loss: torch.Tensor) -> bool:
        """`apply` less the scheduler's step, which runs on the host (a captured step replays this part, then steps
        the scheduler outside the graph); True when the optimizer stepped (the last batch of a group)."""
        self.scaler.scale(loss / self.group_size if self.group_size > 1 else loss).backward()
        if not self.group_end:
            return False
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return True


class AttentionMethod:
    """Base class of every attention method. Subclasses set `Config` and override `attention`.

    Every hook below has a no-op default; override only what the method needs. The runner and `bench` call each
    hook unconditionally, in this order: `prepare` when the method is attached, `setup_training` once the
    optimizer exists, `before_step` and `training_step` for every batch (which calls `aux_loss` through
    `ctx.loss`), `epoch_record` after each epoch, `record` and `training_only_parameters` at the end of the run.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    identity: ClassVar[dict[str, Any] | None] = None  # hyper-parameters under which it equals softmax attention
    description: ClassVar[str] = ""
    # True (or a note saying how) when the method is rebuilt from a paper's description rather than its authors'
    # code; reports footnote such methods so that nobody reads their numbers as the paper's.
    reconstruction: ClassVar[bool | str] = False
    # False for methods that compute gradients of their own (torch.autograd.grad) outside the runner's loss scaling:
    # under fp16 those would underflow silently, so such a grid is refused up front.
    supports_fp16: ClassVar[bool] = True
    # The step time this method should stay within, as a multiple of transformers' eager attention step on CUDA
    # (None: no target). `python -m suite bench` reports each method against its own target.
    cost_target: ClassVar[float | None] = None
    # Config fields added after records existed, with the value that reproduces the older behaviour (the new
    # default or not): at that value they stay out of a run's hash, so older records keep their hash and are still
    # found on resume, and a changed default gets a hash of its own.
    hashed_when_changed: ClassVar[dict[str, Any]] = {}
    # Why the method does not compile well (graph breaks, data-dependent shapes), or None: with train.compile the
    # run still compiles the model and warns with this note.
    compile_warning: ClassVar[str | None] = None
    # True when the standard step with this method can be replayed from a CUDA graph (suite.run.capture): its forward
    # and aux_loss only queue device work (no host read of a value, no shape that depends on values), what changes
    # from step to step lives in tensors (filled in `before_step`), and its random numbers come from torch's default
    # generator. A string says why not; False: not declared (the step then runs eagerly on a GPU, as before).
    capturable: ClassVar[bool | str] = False
    # Whether the method's training-mode attention weights keep, on average, the sums of its evaluation weights
    # (dropout that rescales the kept weights by 1/(1-p)). The check holds a method to it unless it declares False:
    # dropout without a rescale on purpose (scores dropout and DropKey mask before the softmax, whose rows still sum
    # to 1 but whose weights shift towards the kept keys).
    keeps_expectation: ClassVar[bool] = True
    # Names of parameters `prepare()` registers that the loss is not meant to train (e.g. updated by the method's own
    # rule); every other parameter it adds must receive a gradient. A parameter with requires_grad=False is frozen
    # without being named here.
    frozen_parameters: ClassVar[tuple[str, ...]] = ()
    # What the method gives each layer of its own (e.g. "a drop rate of its own"), or None (a property where the
    # configuration decides): such a method is refused where layers share one attention module (ALBERT's).
    layer_specific: str | None = None
    # What the method draws in training, one `Stochastic` per Config field (suite.api.stochastic); None: undeclared,
    # fields named p or p_* then count as rates; () declares that nothing is drawn.
    stochastic: ClassVar[tuple[Stochastic, ...] | None] = None

    def __init__(self, cfg: Any = None):
        self.cfg = cfg if cfg is not None else self.Config()
        self.validate()

    # -- configuration -------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise HyperParameterError for impossible hyper-parameters. Declared rates (or fields named p, p_*) must
        lie in [0, 1), declared scales be >= 0, and every float be finite (NaN or inf would fail a run half-way)."""
        kinds = {s.field: s.kind for s in stochastic_fields(type(self))}
        for f in dataclasses.fields(self.cfg):
            v = getattr(self.cfg, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise HyperParameterError(f"{self.name}.{f.name}={v} is impossible: it must be a finite number")
            if kinds.get(f.name) == "rate" and isinstance(v, float):
                check_probability(f"{self.name}.{f.name}", v)
            if kinds.get(f.name) == "scale" and isinstance(v, (int, float)) and not v >= 0:
                raise HyperParameterError(f"{self.name}.{f.name}={v} is impossible: it must be >= 0")

    # -- hooks ---------------------------------------------------------------------------------------
    def prepare(self, model: torch.nn.Module) -> None:
        """Add per-layer parameters or modules before the optimizer is built (they are saved with the model and
        counted as extra parameters). Create them on the model's device and dtype."""

    def check_model_config(self, config) -> None:
        """Raise HyperParameterError when the hyper-parameters are impossible for a model of this (transformers)
        config, e.g. more layers than it has. The grid's preflight calls it before anything trains."""

    def extra_parameters(self, config) -> int:
        """How many parameters `prepare` will add to a model of this (transformers) config; 0 by default. The
        grid's preflight adds them to the model's own and refuses a run whose training cannot fit in memory, so a
        method whose parameters grow with a hyper-parameter (a kernel width, a rank) should say how."""
        return 0

    def setup_training(self, ctx: "StepContext") -> None:
        """Called once after the optimizer and scheduler exist (e.g. to build a second optimizer)."""

    def aux_loss(self, model: torch.nn.Module) -> torch.Tensor | None:
        """A scalar added to the task loss (regularizers); None adds nothing."""
        return None

    def before_step(self, ctx: "StepContext") -> None:
        """Host-side work before each training step, outside any captured graph: e.g. filling a tensor with this
        step's scheduled rate, which the captured forward then reads."""

    def training_step(self, ctx: "StepContext", batch: dict, next_batch: dict | None) -> torch.Tensor:
        """One optimizer step on `batch`; returns the detached training loss. The default is the standard step
        (task loss + aux loss, backward, clipping, optimizer and scheduler step). Methods that need several models
        or look ahead (`next_batch` is the batch that follows, None at the end of an epoch) replace it."""
        loss = ctx.loss(batch)
        ctx.apply(loss)
        return loss.detach()

    def epoch_record(self) -> dict[str, Any]:
        """JSON-able method facts for the epoch that just ended (e.g. mean drop rates); stored in the history."""
        return {}

    def record(self) -> dict[str, Any]:
        """JSON-able method facts for the whole run (learned alphas, cost, ...); stored as `method_record`."""
        return {}

    def training_only_parameters(self) -> int:
        """Parameters used during training only and not saved with the model (e.g. a policy network)."""
        return 0

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        """The attention of one layer: (output in transformers' (B, L, H, d) layout, probabilities or None). Hand
        the probabilities to `attend` so that statistics probes see them; a fused path (SDPA) is taken only when
        `has_probe(module)` is False."""
        raise NotImplementedError

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def implementation(self) -> str:
        return f"suite_{self.name}"

    def attach(self, model: torch.nn.Module) -> torch.nn.Module:
        """Point every attention module of `model` at this method and run `prepare`."""
        modules = attention_modules(model)
        if not modules:
            raise TypeError(f"{type(model).__name__} has no attention module that uses transformers' attention "
                            "interface (a bidirectional one with `is_causal` and `config._attn_implementation`)")
        name_the_layers(modules)
        refuse_shared_layers(self, model, modules)
        for module in modules:
            module.suite_method = self
        _register_with_transformers(self.name)
        model.set_attn_implementation(self.implementation)
        self.prepare(model)
        return model


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Self-attention modules that dispatch through `AttentionInterface` (BERT and its kin, ModernBERT, DistilBERT,
    ALBERT): transformers marks each with `is_causal`, which its SDPA path reads; an encoder's are bidirectional.
    ALBERT calls its one module in every layer, so this may list fewer modules than the model has layers."""
    return [m for m in model.modules()
            if getattr(m, "is_causal", None) is False and hasattr(m, "config")
            and not getattr(m, "is_cross_attention", False)]


def _dispatch(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The function transformers calls; it hands over to the method attached to this module."""
    method: AttentionMethod = module.suite_method
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return method.attention(module, query, key, value, attention_mask, scaling, **kwargs)


def _first_paragraph(doc: str) -> str:
    """A docstring's first paragraph on one line: a description cut at its first line break ends mid-sentence."""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def register_method(name: str, description: str | None = None, replace: bool = False):
    """Class decorator: `@register_method("my_method")` on an `AttentionMethod` subclass.

    A name that is already registered by other code (a built-in such as `vanilla`, or another plugin) is refused:
    a silent replacement would give old records and new runs one hash for different code. `replace=True` replaces it
    on purpose; the replacing package and its version then enter every run's hash and record."""

    def wrap(cls: type[AttentionMethod]) -> type[AttentionMethod]:
        if not (isinstance(cls, type) and issubclass(cls, AttentionMethod)):
            raise TypeError("@register_method decorates a subclass of suite.AttentionMethod")
        if not dataclasses.is_dataclass(cls.Config):
            raise TypeError(f"{cls.__name__}.Config must be a dataclass")
        cls.name = name
        if description is not None:
            cls.description = description
        elif "description" not in cls.__dict__:
            cls.description = _first_paragraph(cls.__doc__ or "")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"method name {name!r}: use letters, digits, '_' and '-' only (it names record files)")
        METHODS.load()  # the built-ins first, so that a plugin imported before them cannot take a built-in's name
        METHODS.add(name, cls, replace=replace)
        return cls

    return wrap


def _register_with_transformers(name: str) -> None:
    """Make `suite_NAME` an attention implementation transformers knows (with its mask function). Done when a method
    is first attached, not when it is registered: importing transformers costs seconds, which `list`, `--help` and
    dry runs do not need."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(f"suite_{name}", _dispatch)
    AttentionMaskInterface.register(f"suite_{name}", additive_mask)


def additive_mask(*args, **kwargs):
    """transformers' `eager_mask`, always built: its shortcut for batches without padding (`None` when every token is
    real) reads the padding mask on the host (`padding_mask.all()`), a GPU synchronisation in every forward. The
    boolean mask becomes 0 / finfo.min here rather than in `eager_mask`, whose transformers 5.17 builds its 0 with
    `torch.tensor(0.0, device=...)`: a copy of host data, which a CUDA graph capture refuses (seen on an H200)."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    kwargs["allow_is_bidirectional_skip"] = False
    if args:  # transformers passes keywords; anything else gets its own function
        return eager_mask(*args, **kwargs)
    dtype = kwargs.pop("dtype", torch.float32)
    kwargs["allow_is_causal_skip"] = False
    allowed = sdpa_mask(**kwargs)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed,
                                                                                     torch.finfo(dtype).min)


# ---------------------------------------------------------------------------------------------------------
# Building blocks shared by methods. Shapes: query/key/value (B, H, L, d); mask (B, 1, Lq, Lk) additive or None.
# ---------------------------------------------------------------------------------------------------------

def scores(query, key, scaling, attention_mask=None):
    """Scaled dot-product scores with the additive padding mask applied."""
    s = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        s = s + attention_mask
    return s


def valid_keys(attention_mask, like: torch.Tensor) -> torch.Tensor:
    """Boolean (B, 1, Lq, Lk), broadcastable to the scores `like`: True where a key may be attended."""
    if attention_mask is None:
        return torch.ones((1, 1) + like.shape[-2:], dtype=torch.bool, device=like.device)
    return attention_mask == 0


def mask_fill_value(t: torch.Tensor) -> float:
    return torch.finfo(t.dtype).min


def drop_scores(s: torch.Tensor, drop: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """Scores dropout (docs/methods.md#scores_dropout): dropped query-key pairs get the mask minimum before the softmax.

    `drop` is boolean, broadcastable to `s` (B, H, L, L). The diagonal is never dropped, so each real query keeps
    one key and rows stay finite. With `attention_mask`, padded queries (whose diagonal is a padded key) drop
    nothing, so even their rows never put weight on padding; padding itself stays masked because masked_fill
    writes the minimum, never a larger value.
    """
    lq, lk = s.shape[-2:]
    diag = torch.eye(lq, lk, dtype=torch.bool, device=s.device)
    if attention_mask is not None:
        query_valid = (attention_mask == 0).diagonal(dim1=-2, dim2=-1).unsqueeze(-1)  # self-attention: Lq == Lk
        drop = drop & query_valid
    return s.masked_fill(drop & ~diag, mask_fill_value(s))


_EMULATED_CAPTURE = [False]  # set by suite.run.capture while its CPU tests run a captured step without a graph


def in_graph() -> bool:
    """Whether the code runs inside torch.compile's tracing or a CUDA graph capture: a value that changes from step to
    step must then be read from a tensor, since a Python number would be baked into the graph."""
    if torch.compiler.is_compiling() or _EMULATED_CAPTURE[0]:
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether two device names are one device: `cuda` is the current CUDA device (`cuda:0` by default) and `cpu` is
    `cpu:0`, so a method that compares devices does not mistake the same device for a move."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False

    def index(d: torch.device) -> int:
        if d.index is not None:
            return d.index
        return torch.cuda.current_device() if d.type == "cuda" else 0

    return index(a) == index(b)


def probs_dropout(p: torch.Tensor, rate: float, module) -> torch.Tensor:
    return F.dropout(p, p=rate, training=module.training) if rate > 0 else p


@contextlib.contextmanager
def probes(model: torch.nn.Module, probe):
    """Set `probe(module, probs)` on every attention module for the duration; always removed afterwards."""
    modules = attention_modules(model)
    try:
        for m in modules:
            m.suite_probe = probe
        yield modules
    finally:
        for m in modules:
            if hasattr(m, "suite_probe"):
                del m.suite_probe


def has_probe(module) -> bool:
    """Whether a statistics probe is watching `module`: a method with a fused fast path (SDPA) must then take the path
    that materialises the probabilities and hands them to `attend`."""
    return getattr(module, "suite_probe", None) is not None


def attend(module, probs: torch.Tensor, value: torch.Tensor):
    """probs @ value in the (B, L, H, d) layout transformers expects.

    A statistics probe (set with `probes`) sees the probabilities first.
    """
    probe = getattr(module, "suite_probe", None)
    if probe is not None:
        probe(module, probs)
    out = torch.matmul(probs.to(value.dtype), value).transpose(1, 2).contiguous()
    return out, probs


def softmax(s: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys in at least fp32 (float64 stays float64, so gradcheck can see the exact gradient)."""
    return torch.softmax(s, dim=-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(s.dtype)
