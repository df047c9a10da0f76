"""AttendOut's step cost against vanilla, measured interleaved on the same batches.

Every `cost_every`-th step a vanilla forward-backward pass (attention-probability dropout, no update, the random
state restored afterwards so training is unchanged) is timed on that step's own batch, alternately just before and
just after AttendOut's step, so that slow phases of a shared machine hit both. A vanilla step is that pass plus the
optimizer part (clipping, AdamW, scheduler) of the same step, which AttendOut runs identically. The ratio is the sum of
AttendOut's step times over the sum of the paired vanilla step times. AttendOut does strictly more work than a
vanilla step (at least the same forward-backward and optimizer step, plus G), so a measured ratio below 1 is timing
noise: `step_ratio` is then reported as 1 and the raw value kept as `measured_step_ratio`.

On the CPU only: timing a GPU step needs host syncs that drain the device's queue, so on a GPU no step is timed and
the record says so (`step_ratio` None, `note`); `python -m suite bench` measures the ratio there, interleaved.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch


def sync(device: torch.device) -> None:
    """Wait for a CUDA device's queue (a timed step's edges); nothing to wait for elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_vanilla(ctx, batch: dict, vanilla, restore) -> float:
    """Seconds of a forward-backward on `batch` under the `vanilla` context; no update: the gradients are dropped and
    `restore()` puts the random states back, so that training never sees the pass."""
    sync(ctx.device)
    start = time.perf_counter()
    with vanilla:
        ctx.loss(batch).backward()
    sync(ctx.device)
    elapsed = time.perf_counter() - start
    ctx.model.zero_grad(set_to_none=True)
    restore()
    return elapsed


class CostMeter:
    def __init__(self) -> None:
        self.pairs: list[tuple[float, float]] = []  # (AttendOut step s, vanilla step s) on the same batch
        self.step_s: list[float] = []  # timed steps only (the probe steps)
        self.untimed = 0
        self.peak_memory_mb: float | None = None
        self.device: str | None = None  # the device type of the last step

    def due(self, step: int, every: int, device) -> bool:
        """Whether step `step` (from 1) is timed: every `every`-th, on the CPU only (timing a GPU step needs host
        syncs that stall it; `suite bench` times it there)."""
        return every > 0 and device.type == "cpu" and (step - 1) % every == 0

    def add_untimed_step(self) -> None:
        self.untimed += 1

    def add_step(self, seconds: float) -> None:
        self.step_s.append(seconds)

    def add_pair(self, attendout_s: float, vanilla_fwd_bwd_s: float, optimizer_s: float) -> None:
        self.pairs.append((attendout_s, vanilla_fwd_bwd_s + optimizer_s))

    def summary(self) -> dict[str, Any]:
        measured = None
        if self.pairs:
            measured = sum(a for a, _ in self.pairs) / sum(v for _, v in self.pairs)
        return {
            "step_s": statistics.fmean(self.step_s) if self.step_s else None,
            "steps": len(self.step_s) + self.untimed,
            "timed_steps": len(self.step_s),
            "paired_steps": len(self.pairs),
            "vanilla_step_s": statistics.fmean(v for _, v in self.pairs) if self.pairs else None,
            "measured_step_ratio": measured,
            "step_ratio": None if measured is None else max(1.0, measured),
            "peak_memory_mb": self.peak_memory_mb,
            "note": None if self.pairs or self.device in (None, "cpu") else
            f"not measured in-run on {self.device}: timing a step there needs host syncs that stall it; "
            "`python -m suite bench` measures it",
            "how": "interleaved on the same batches: every cost_every-th step a vanilla forward-backward pass "
                   "(attention-probability dropout, no update) is timed on that step's batch, alternately before "
                   "and after AttendOut's step, plus that step's optimizer part; step_ratio = sum of AttendOut's "
                   "step times / sum of the paired vanilla times, floored at 1 (AttendOut does strictly more work). "
                   "Timed on the CPU only: on a GPU the timing's host syncs would stall the step (see note). Peak "
                   "memory: CUDA max allocated after training steps (an allocator statistic, no sync), None on CPU; "
                   "`suite bench` compares memory against vanilla. step_s is the mean over the timed (paired) steps.",
        }
