"""Counting what a step asks of the host, on any device: dispatched operators and host synchronisations.

On a GPU the host queues kernels and only waits when Python needs a value (`.item()`, `bool(t)`, a copy to the CPU, an
operator whose output shape depends on the data); every such wait empties the queue. On the CPU nothing waits, so
these points are counted where the code asks for them, which is what a GPU would pay for:

- `aten._local_scalar_dense` (`.item()`, `float(t)`, `int(t)`, `bool(t)`, also from C++),
- operators whose output size depends on values (`nonzero`, `masked_select`, `unique`, ...),
- `Tensor.cpu()`, `.numpy()`, `.tolist()` and `.to("cpu")` with the device written as that string, on any tensor (on
  CUDA each is a device-to-host copy that waits; `.to(x.device)` is not counted, since on the CPU the two cannot be
  told apart at run time), and `torch.cuda.synchronize`,
- `torch.tensor(data, device=...)` and `torch.as_tensor(data, device=...)` from host data: on CUDA a copy from
  pageable memory that waits, and one that a CUDA graph capture refuses.

Dispatched operators are every aten call the dispatcher sees (forward, backward and the optimizer), views included;
launch-bound GPU steps cost host time per operator, so their count is a device-independent proxy for it.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["counting"]  # what the rest of the suite uses; other names are this module's own

# Operators whose output shape depends on tensor values: on CUDA the host must read a count before it can go on.
DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
                  "nonzero_static_fallback", "repeat_interleave", "argwhere"}
SCALAR_READ = "_local_scalar_dense"
HOST_COPIES = {"cpu", "numpy", "tolist"}
# torch.tensor(data, device=d): host data copied to the device from pageable memory, which waits on a GPU and which a
# CUDA graph capture refuses (the same call without a device builds a host tensor, as a batch's collation does)
HOST_DATA = {"tensor", "as_tensor"}


@dataclasses.dataclass
class Counts:
    ops: int = 0                 # dispatched aten operators
    views: int = 0               # of which views (no kernel launch on a GPU)
    syncs: int = 0               # host synchronisation points (the kinds above)
    sync_kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    op_kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add_sync(self, kind: str) -> None:
        self.syncs += 1
        self.sync_kinds[kind] += 1


class _Dispatch(TorchDispatchMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        self.counts.ops += 1
        self.counts.op_kinds[name] += 1
        if func.is_view:
            self.counts.views += 1
        if name == SCALAR_READ:
            self.counts.add_sync("item/float/bool")
        elif name in DATA_DEPENDENT:
            self.counts.add_sync(name)
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        kwargs = kwargs or {}
        if name in HOST_COPIES:
            self.counts.add_sync(name)
        elif name in HOST_DATA and kwargs.get("device") is not None and not isinstance(args[0], torch.Tensor):
            self.counts.add_sync(f"{name}(host data, device=...)")
        elif name == "to" and _to_cpu(args, kwargs):
            self.counts.add_sync("to(cpu)")
        return func(*args, **kwargs)


def _to_cpu(args, kwargs) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, str) and target.split(":")[0] == "cpu"  # a literal: code meaning the host


@contextlib.contextmanager
def counting():
    """Count operators and host synchronisation points of the code run inside; yields the `Counts`."""
    counts = Counts()
    real_sync = torch.cuda.synchronize

    def sync(*args, **kwargs):
        counts.add_sync("cuda.synchronize")
        return real_sync(*args, **kwargs)

    torch.cuda.synchronize = sync
    try:
        with _Function(counts), _Dispatch(counts):
            yield counts
    finally:
        torch.cuda.synchronize = real_sync
