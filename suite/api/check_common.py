"""What every part of the method check shares: its result and report types, and the tiny model and padded batch each
check attaches a method to and runs."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import re
from typing import Any, Callable

import torch

from suite.api.attention import AttentionMethod, HyperParameterError, attention_modules
from suite.api.stochastic import stochastic_fields
from suite.api.tiny_models import padded_batch, seed_cpu, tiny_model

# what the rest of the suite uses; other names are this module's own
__all__ = ["HIGH_RATES", "ROWS", "SEEDS", "CheckReport", "CheckResult", "attached", "checked_batch", "finite_diff",
           "forward", "fresh_model", "gradients", "high_rate_hparams", "max_diff", "pass_seeds",
           "probability_fields", "rates_above_zero", "repeat_twin", "rows", "training_seeds", "undeclared_stochastic"]

# the random seeds a rule that samples in training runs under: one draw can miss a row whose keys are all dropped
SEEDS = range(8)
# the rates the check also runs every rule at, highest first (the first one the method accepts): at 0.9 whole rows
# lose all their keys, so what a method does with such a row shows whatever rate it is configured with
HIGH_RATES = (0.9, 0.7, 0.45)


@dataclasses.dataclass
class CheckResult:
    # hparams | shape | values | params | identity | finite | padding | eval | prepare | hooks | others
    check: str
    setting: str        # which model / precision / value it ran on
    passed: bool | None  # None: skipped
    detail: str = ""


@dataclasses.dataclass
class CheckReport:
    method: str
    hparams: dict[str, Any]
    results: list[CheckResult] = dataclasses.field(default_factory=list)
    high_rates: dict[str, Any] | None = None  # the configuration the rules also ran at ("at high rates")

    @property
    def ok(self) -> bool:
        return all(r.passed is not False for r in self.results)

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.passed is False]

    def __str__(self) -> str:
        mark = {True: "ok", False: "FAIL", None: "skip"}
        lines = [f"{self.method} {self.hparams or ''}".rstrip() + f": {'passed' if self.ok else 'FAILED'}"]
        if self.high_rates is not None:
            lines.append(f"  (each rule ran at the configuration above and at high rates: {self.high_rates})")
        for r in self.results:
            lines.append(f"  {mark[r.passed]:<4} {r.check:<8} {r.setting:<30} {r.detail}".rstrip())
        return "\n".join(lines)


# the rows of the padded checked batch, by what they test; a row with no real token and a row of one token are where
# masked softmaxes divide by zero and statistics over the keys of a row are empty
ROWS = {"rows with real tokens": [0, 1, 2], "a length-1 row": [3], "a fully padded row": [4]}


def checked_batch(model, seed: int = 0, padded: bool = True):
    """(input_ids, attention_mask, labels) for `model`. Padded: five rows of 12, 9, 6, 1 and 0 real tokens (the last
    row's attention mask is all 0, see ROWS); unpadded: three rows without padding."""
    pad = model.config.pad_token_id
    ids, mask = padded_batch(length=12, vocab=model.config.vocab_size, seed=seed, pad_id=pad)
    if not padded:
        mask = torch.ones_like(mask)
        ids[ids == pad] = 3
        return ids, mask, torch.tensor([0, 1, 0])
    short = torch.zeros(2, ids.shape[1], dtype=mask.dtype)
    short[0, 0] = 1
    ids = torch.cat([ids, torch.where(short.bool(), ids[:2], torch.full_like(ids[:2], pad))])
    return ids, torch.cat([mask, short]), torch.tensor([0, 1, 0, 1, 0])


def rows(batch: tuple, which: list[int]) -> tuple:
    """The rows `which` of a checked batch (input_ids, attention_mask, labels)."""
    return tuple(t[which] for t in batch)


class BuiltOnce:
    """A model builder run once per process for each arguments (a copy costs half a build): each call returns a copy,
    with the CPU's generator left as the build left it, so that what runs next draws what it drew after a new build;
    `original(...)` is the built model itself, for reading only."""

    def __init__(self, build: Callable[..., torch.nn.Module]):
        self._cached = functools.lru_cache(maxsize=None)(
            lambda *args: (build(*args), torch.default_generator.get_state()))

    def __call__(self, *args):
        model, state = self._cached(*args)
        torch.default_generator.set_state(state)
        return copy.deepcopy(model)

    def original(self, *args) -> torch.nn.Module:
        return self._cached(*args)[0]


_tiny = BuiltOnce(lambda kind, over: tiny_model(kind, **dict(over)))


def fresh_model(kind: str, **over):
    """A copy of `tiny_model(kind, **over)` built once per process (`BuiltOnce`), so that what `prepare()` draws next is
    what it drew on a new build."""
    return _tiny(kind, tuple(sorted(over.items())))


def keeps_state(method: AttentionMethod, model) -> bool:
    """Whether the method keeps something between calls beyond its config and plain values (a generator, a dict, a
    list, a tensor, an object), on itself or on the attention modules, or prepare() gave the model buffers: then a
    pass that must draw what another drew runs on a copy of the model taken before that other pass; otherwise on the
    model itself."""
    plain = (bool, int, float, str, type(None))
    built = _tiny.original(model.config.model_type, ())
    if {n for n, _ in model.named_buffers()} - {n for n, _ in built.named_buffers()}:
        return True
    for module, before in zip(attention_modules(model), attention_modules(built)):
        if any(name not in vars(before) and value is not method and not isinstance(value, plain)
               for name, value in vars(module).items()):
            return True
    return any(name != "cfg" and not isinstance(value, plain) for name, value in vars(method).items())


def draws(method: AttentionMethod) -> bool:
    """Whether a stochastic parameter the method declares is above 0: then its training passes draw."""
    cfg = method.cfg
    return any(isinstance(getattr(cfg, s.field, None), (int, float)) and getattr(cfg, s.field) > 0
               for s in stochastic_fields(type(method)))


def training_seeds(method: AttentionMethod, seeds=SEEDS):
    """`seeds` where a stochastic parameter of the method is above 0, else their first: training then draws nothing
    (the draws rule measures that it does not), so every seed would repeat the first one's pass."""
    return seeds if draws(method) else seeds[:1]


def pass_seeds(method: AttentionMethod, mode: str, seeds=SEEDS):
    """The seeds a rule's passes run under in `mode`: `training_seeds` in training, one in evaluation (nothing is
    drawn there; the eval rule measures that)."""
    return training_seeds(method, seeds) if mode == "train" else (0,)


def repeat_twin(method: AttentionMethod, model, mode: str):
    """The model a pass runs on that must draw what a pass on `model` under the same seed draws: a copy taken before
    that pass where the method may keep draw state between calls (training passes that draw: a generator made at
    its first call, one on a child module or a step counter cannot be told apart by inspection; or state found on
    the method or the attention modules), else `model` itself (a copy costs as much as a pass)."""
    return copy.deepcopy(model) if mode == "train" and draws(method) or keeps_state(method, model) else model


def attached(method: AttentionMethod, kind: str):
    """A fresh tiny model of `kind` ("bert", "roberta", "modernbert") with `method` attached."""
    model = fresh_model(kind)
    method.attach(model)
    return model


def forward(model, ids, mask, labels, seed: int = 0):
    """(the model's output with hidden states, a loss that reaches every real token's final state)."""
    seed_cpu(seed)  # methods that sample (dropout masks) draw the same numbers in compared passes
    out = model(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    real = out.hidden_states[-1][mask.bool()]
    # a loss on every real token's final state, so the gradients see every attention row, not just [CLS] (a batch of
    # fully padded rows has no real token: a mean over none would be NaN)
    return out, out.loss + (real.square().mean() if real.numel() else real.sum())


def gradients(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def finite_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, bool]:
    """(the largest difference where both are finite, whether either holds NaN or inf): checks that compare two
    passes leave non-finite values to the finite check rather than reading NaN - NaN as a difference."""
    a, b = a.detach().float(), b.detach().float()
    both = torch.isfinite(a) & torch.isfinite(b)
    return (float((a - b)[both].abs().max()) if both.any() else 0.0), not bool(both.all())


def probability_fields(cls: type[AttentionMethod]) -> list[str]:
    """Config fields that hold a rate: those the method declares (`stochastic`, kind "rate"), else by the naming
    rule `p` or `p_*`, typed float."""
    return [s.field for s in stochastic_fields(cls) if s.kind == "rate"]


# names of Config fields that read as something drawn: an undeclared method with one of them is told to declare it
STOCHASTIC_NAME = re.compile(r"(^|_)(rate|prob|probability|drop|dropout|sigma|noise|std)($|_)")


def undeclared_stochastic(cls: type[AttentionMethod]) -> list[str]:
    """Float Config fields whose names read as a rate or a noise's size, on a method that declares no `stochastic`
    (beyond p, p_*, which the naming rule covers): no rule would vary them."""
    if cls.stochastic is not None:
        return []
    named = set(probability_fields(cls))
    return [f.name for f in dataclasses.fields(cls.Config) if f.name not in named and STOCHASTIC_NAME.search(f.name)
            and isinstance(getattr(cls.Config(), f.name), float)]


def accepted(cls: type[AttentionMethod], hparams: dict[str, Any]) -> bool:
    try:
        cls(cls.Config(**hparams))
    except HyperParameterError:
        return False
    return True


def high_rate_hparams(cls: type[AttentionMethod], hparams: dict[str, Any]) -> dict[str, Any] | None:
    """`hparams` with each probability field, in the Config's order, raised to the first of HIGH_RATES the method
    accepts together with the fields raised before it (AttendOut's p_init must stay below its p_max); None when no
    field can be raised."""
    high = dict(hparams)
    for name in probability_fields(cls):
        for rate in HIGH_RATES:
            if accepted(cls, {**high, name: rate}):
                high[name] = rate
                break
    return high if high != hparams else None


def rates_above_zero(cls: type[AttentionMethod], hparams: dict[str, Any]) -> list[str]:
    """The stochastic fields above 0 in this configuration: where the method should draw in training."""
    cfg = cls.Config(**hparams)
    return [f"{s.field}={getattr(cfg, s.field)}" for s in stochastic_fields(cls)
            if isinstance(getattr(cfg, s.field), (int, float)) and math.isfinite(getattr(cfg, s.field))
            and getattr(cfg, s.field) > 0]


@contextlib.contextmanager
def paired_with_eval(method: AttentionMethod, seen: list, on_pair: Callable[[list], None]):
    """While active, each training call of `method.attention()` runs once more in evaluation on the same inputs;
    `on_pair(seen)` gets what a probe appended to `seen` over the two calls (emptied before each pair)."""
    original = method.attention

    def paired(module, *args, **kwargs):
        seen.clear()
        result = original(module, *args, **kwargs)
        module.training = False
        try:
            original(module, *args, **kwargs)
        finally:
            module.training = True
        on_pair(seen)
        return result

    method.attention = paired
    try:
        yield
    finally:
        del method.attention
