"""Training steps replayed from CUDA graphs (`train.capture`): the step's forward, backward, clipping and optimizer
step captured once per batch shape, then replayed, so the host queues one graph instead of ~1,500 operators.

On a GPU a small encoder's step is bound by the host (about 20 us per dispatched operator on an H100: MiniLM 32 ms
a step, its arithmetic well under 1 ms). A graph replays the same kernels with the same random-number offsets
(torch's default generator is graph-safe: each replay draws fresh numbers), so a captured run computes what the
eager run computes; what changes from step to step lives in tensors: the batch is copied into the graph's static
input buffers, the learning rate is a tensor the scheduler fills between replays, and AdamW is fused and
`capturable`.

Each batch shape's first step runs eagerly (a real step, which also warms up what a capture needs: cuBLAS handles,
the optimizer's state, autograd's threads), its second is captured and every later one replays. With
`train.pad_to=buckets` an epoch sees at most 8 shapes. Steps run eagerly, with the reason in the record, where a
graph would be wrong or cannot be captured (`eager_reason`). A capture that fails raises `CaptureFailed`: the grid
retires that process and runs the job again, eagerly, in a fresh one; a short capture at the grid's start
(`suite.grid.executors.workers.capture_self_test`) turns capture off for the whole
grid where it fails.

The graphs of one run share one memory pool (`torch.cuda.graph_pool_handle`), so their memory is that of the largest
shape's step, not the sum over shapes. PyTorch calls a shared pool safe when graphs replay in capture order; in any
order, a graph may overwrite what another graph left in the pool, and the only tensor a step's graph leaves for later
is its loss, which the loop adds to its running sum before the next step (`train_epoch`).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import torch

from suite.api import attention
from suite.api.attention import AttentionMethod, StepContext

# what the rest of the suite uses; other names are this module's own
__all__ = ["CAPTURE_FAULT_ENV", "CaptureFailed", "Steps", "eager_reason", "fault_injected"]

MAX_GRAPHS = 16  # shapes beyond these run eagerly (the graphs share one pool: a shape more costs its capture)
# Tests set it (to anything): every capture then fails as a CUDA one can, and a CPU run takes the captured path
# (emulated, no graphs) so that it reaches a capture; a grid's fall-back to eager steps is tested on the CPU with it
CAPTURE_FAULT_ENV = "SUITE_CAPTURE_FAULT"


def fault_injected() -> bool:
    return bool(os.environ.get(CAPTURE_FAULT_ENV))


class CaptureFailed(RuntimeError):
    """A CUDA graph capture failed. torch leaves the process's CUDA generator and the graph's memory pool in capture
    mode (its capture_end throws before cleaning up), so the next eager dropout in this process would fail too: the
    run is recorded as failed with this error (`CaptureFailed: ...`, `suite.run.device.is_capture_failure`), and the
    grid runs the job again with capture off in a fresh process (suite.grid.executors)."""


def eager_reason(method: AttentionMethod, capture: str, device: torch.device, amp_dtype: torch.dtype | None,
                 compiled: bool, grad_accumulation: int) -> str | None:
    """Why this run's training steps run eagerly, or None when they are replayed from CUDA graphs."""
    if capture == "off":
        return "train.capture=off"
    if device.type != "cuda" and not fault_injected():
        return "CUDA graphs need a CUDA device"
    if type(method).training_step is not AttentionMethod.training_step:
        note = method.capturable if isinstance(method.capturable, str) else "not captured"
        return f"{method.name} replaces the training step: {note}"
    if method.capturable is not True:
        return f"{method.name}: {method.capturable}" if isinstance(method.capturable, str) else (
            f"{method.name} does not declare `capturable = True` (suite.api.attention.AttentionMethod.capturable)")
    changed = _redefined_since_declared(type(method))
    if changed:
        return (f"{method.name} inherits `capturable = True` but redefines {', '.join(changed)}: a subclass that "
                "changes code declares `capturable` itself (suite.api.attention.AttentionMethod.capturable)")
    if compiled:
        return "train.compile: torch.compile runs the model (its own graphs)"
    if grad_accumulation > 1:
        return "train.grad_accumulation > 1: the optimizer steps on every few batches only"
    if amp_dtype is torch.float16:
        return "fp16: loss scaling reads the overflow flag on the host at every step"
    return None


def _redefined_since_declared(cls: type) -> list[str]:
    """The functions that classes below the one declaring `capturable` define: a plugin subclassing a capturable
    built-in to change its attention must not inherit a promise made for code it replaced."""
    changed = []
    for klass in cls.__mro__:
        if "capturable" in vars(klass):
            return changed
        changed += [f"{klass.__name__}.{n}" for n, v in vars(klass).items()
                    if not isinstance(v, type) and not (n.startswith("__") and n != "__init__")
                    and (callable(v) or isinstance(v, (staticmethod, classmethod, property)))]
    return changed


def _emulated(step: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Run a captured step without a graph, with `in_graph()` true as inside a capture (the CPU tests' path)."""
    attention._EMULATED_CAPTURE[0] = True
    try:
        return step()
    finally:
        attention._EMULATED_CAPTURE[0] = False


@dataclasses.dataclass
class _Graph:
    """One captured step: its static inputs and the loss tensor it writes (overwritten by the next replay)."""

    inputs: dict[str, torch.Tensor]
    replay: Callable[[], None]
    loss: torch.Tensor


class Steps:
    """Runs a run's training steps: the method's `before_step` (always on the host), then its `training_step`
    eagerly, or the standard step replayed from the graph of the batch's shape. `emulate` (tests on the CPU) runs
    the captured function on the static inputs instead of replaying a graph: the same code path but the graph."""

    def __init__(self, ctx: StepContext, reason: str | None, emulate: bool = False):
        # a CPU run reaches the captured path only with a capture fault injected ($SUITE_CAPTURE_FAULT): emulated
        self.ctx, self.reason, self.emulate = ctx, reason, emulate or ctx.device.type != "cuda"
        self.graphs: dict[tuple, _Graph] = {}
        self.seen: set[tuple] = set()
        self.eager_steps, self.replays, self.capture_s, self.pool_bytes = 0, 0, 0.0, 0
        self.stream = torch.cuda.Stream(ctx.device) if reason is None and not self.emulate else None
        self.pool = None  # the graphs' one memory pool, made at the first capture

    def __call__(self, batch: dict, next_batch: dict | None) -> torch.Tensor:
        """One step on `batch`; the detached training loss (a captured step's is valid until the next step)."""
        ctx = self.ctx
        ctx.method.before_step(ctx)
        if self.reason is not None:
            return ctx.method.training_step(ctx, batch, next_batch)
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in batch.items())
        graph = self.graphs.get(key)
        if graph is None:
            if key not in self.seen or len(self.graphs) >= MAX_GRAPHS:
                self.seen.add(key)
                self.eager_steps += 1
                return self._side(lambda: ctx.method.training_step(ctx, batch, next_batch))
            start = time.perf_counter()
            try:
                graph = self.graphs[key] = self._capture(batch)
            except RuntimeError as exc:  # a failed capture leaves torch's generator and allocator mid-capture
                raise CaptureFailed(self._failure(exc)) from exc
            self.capture_s += time.perf_counter() - start
        for name, buffer in graph.inputs.items():
            buffer.copy_(batch[name], non_blocking=True)
        graph.replay()
        ctx.scheduler.step()  # on the host, between replays: it fills the learning-rate tensor the graph reads
        self.replays += 1
        return graph.loss

    def _failure(self, exc: RuntimeError) -> str:
        """The run's error when a capture fails. It fails the run rather than going on eagerly in this process (see
        `CaptureFailed`); a grid runs the job again eagerly in a fresh process."""
        root = exc
        while root.__context__ is not None and isinstance(root.__context__, RuntimeError):
            root = root.__context__  # capture_end's "invalidated" error hides the operation that caused it
        first = str(root).strip().splitlines()[0] if str(root).strip() else type(root).__name__
        return (f"CUDA graph capture failed at step {self.ctx.step} ({first[:300]}); a grid runs the job again "
                "eagerly in a fresh process (else --set train.capture=off); please report the method and versions")

    def _side(self, work: Callable[[], Any]) -> Any:
        """Run `work` on the capture stream (eager warm-up steps belong there, as PyTorch's capture recipe says)."""
        if self.stream is None:
            return work()
        self.stream.wait_stream(torch.cuda.current_stream(self.ctx.device))
        with torch.cuda.stream(self.stream):
            out = work()
        torch.cuda.current_stream(self.ctx.device).wait_stream(self.stream)
        return out

    def _capture(self, batch: dict) -> _Graph:
        ctx = self.ctx
        if fault_injected():
            raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing (injected by "
                               f"${CAPTURE_FAULT_ENV})")
        inputs = {k: v.clone() for k, v in batch.items()}

        def step() -> torch.Tensor:
            loss = ctx.loss(inputs)
            ctx.update(loss)  # backward, clipping, AdamW, gradients to None: the scheduler steps outside
            return loss.detach()

        if self.emulate:
            loss = torch.zeros((), device=ctx.device)
            return _Graph(inputs, lambda: loss.copy_(_emulated(step)), loss)
        if not ctx.optimizer.state:  # AdamW builds its state at its first step: inside a capture it would be static
            raise RuntimeError("the optimizer has no state yet: a shape is captured only after an eager step")
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # one pool for every shape: safe in any replay order, as the module's docstring says
        reserved = torch.cuda.memory_reserved(ctx.device)
        with torch.cuda.device(ctx.device), torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            loss = step()
        self.pool_bytes += torch.cuda.memory_reserved(ctx.device) - reserved  # what the pool grew by
        return _Graph(inputs, graph.replay, loss)

    def facts(self) -> dict[str, Any]:
        """What the record says of how the steps ran."""
        if self.reason is not None:
            return {"mode": "eager", "reason": self.reason, **({"replays": self.replays} if self.replays else {})}
        return {"mode": "captured", "graphs": len(self.graphs), "eager_steps": self.eager_steps,
                "replays": self.replays, "capture_s": round(self.capture_s, 4),
                **({} if self.emulate else {"graph_pool_mb": round(self.pool_bytes / 2**20, 1)})}

