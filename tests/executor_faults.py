"""Methods that misbehave on purpose, for the executor tests. Workers import this module by name (it must be on
their PYTHONPATH); the tests register it only while they run."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from suite.api.attention import register_method
from suite.methods.dropout import Vanilla


@dataclasses.dataclass
class FaultConfig:
    p: float = 0.1
    marker: str = ""  # file that gets one line per attempt at the run


def count_attempt(marker: str) -> int:
    with open(marker, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    return len(Path(marker).read_text().splitlines())


def checked_before_training(model) -> bool:
    """Whether this attach is the driver's check before the grid (preflight attaches every method to a skeleton on
    the meta device, as a run will): these faults are a run's, so they stay out of it."""
    return next(model.parameters()).device.type == "meta"


class _Fault(Vanilla):
    """Vanilla attention whose run, once attached for training, counts its attempt and then misbehaves (`fault`)."""

    Config = FaultConfig
    identity = None

    def prepare(self, model):
        if not checked_before_training(model):
            self.fault(count_attempt(self.cfg.marker))

    def fault(self, attempt: int) -> None:
        raise NotImplementedError


@register_method("test_dies_once")
class DiesOnce(_Fault):
    """Vanilla attention, but the first attempt kills its worker process (as a segfault or an OOM kill would)."""

    def fault(self, attempt: int) -> None:
        if attempt == 1:
            os._exit(3)


@register_method("test_raises")
class Raises(_Fault):
    """A run that fails on its own, every time."""

    def fault(self, attempt: int) -> None:
        raise RuntimeError("this method always fails")


@register_method("test_hangs")
class Hangs(_Fault):
    """A run that never ends (writes its worker's pid first), for stopping a grid from outside."""

    def fault(self, attempt: int) -> None:
        time.sleep(600)


@register_method("test_waits")
class Waits(_Fault):
    """A run that writes its worker's pid, then waits until the file MARKER.go exists (at most 120 s) and trains:
    a test holds runs under way while it signals the driver."""

    def fault(self, attempt: int) -> None:
        go, deadline = Path(self.cfg.marker + ".go"), time.monotonic() + 120
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


METHOD_CLASSES = {"test_dies_once": DiesOnce, "test_raises": Raises, "test_hangs": Hangs, "test_waits": Waits}
