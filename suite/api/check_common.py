"""What every part of the method check shares: its result and report types, and the tiny model and padded batch each
check attaches a method to and runs."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from suite.api.attention import AttentionMethod
from suite.api.tiny_models import padded_batch, tiny_model

# what the rest of the suite uses; other names are this module's own
__all__ = ["CheckReport", "CheckResult", "attached", "checked_batch", "forward", "gradients", "max_diff"]


@dataclasses.dataclass
class CheckResult:
    check: str          # hparams | shape | identity | padding | finite | eval | prepare | hooks | others
    setting: str        # which model / precision / value it ran on
    passed: bool | None  # None: skipped
    detail: str = ""


@dataclasses.dataclass
class CheckReport:
    method: str
    hparams: dict[str, Any]
    results: list[CheckResult] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.passed is not False for r in self.results)

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.passed is False]

    def __str__(self) -> str:
        mark = {True: "ok", False: "FAIL", None: "skip"}
        lines = [f"{self.method} {self.hparams or ''}".rstrip() + f": {'passed' if self.ok else 'FAILED'}"]
        for r in self.results:
            lines.append(f"  {mark[r.passed]:<4} {r.check:<8} {r.setting:<24} {r.detail}".rstrip())
        return "\n".join(lines)


def checked_batch(model, seed: int = 0, padded: bool = True):
    """(input_ids, attention_mask, labels) of three rows for `model`: padded differently per row, or not at all."""
    ids, mask = padded_batch(length=12, vocab=model.config.vocab_size, seed=seed, pad_id=model.config.pad_token_id)
    if not padded:
        mask = torch.ones_like(mask)
        ids[ids == model.config.pad_token_id] = 3
    return ids, mask, torch.tensor([0, 1, 0])


def attached(method: AttentionMethod, kind: str):
    """A fresh tiny model of `kind` ("bert", "roberta") with `method` attached."""
    model = tiny_model(kind)
    method.attach(model)
    return model


def forward(model, ids, mask, labels, seed: int = 0):
    """(the model's output with hidden states, a loss that reaches every real token's final state)."""
    torch.manual_seed(seed)  # methods that sample (dropout masks) draw the same numbers in compared passes
    out = model(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    valid = mask.bool()
    # a loss on every real token's final state, so the gradients see every attention row, not just [CLS]
    return out, out.loss + out.hidden_states[-1][valid].square().mean()


def gradients(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0
