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


@register_method("test_dies_once")
class DiesOnce(Vanilla):
    """Vanilla attention, but the first attempt kills its worker process (as a segfault or an OOM kill would)."""

    Config = FaultConfig
    identity = None

    def prepare(self, model):
        if checked_before_training(model):
            return
        if count_attempt(self.cfg.marker) == 1:
            os._exit(3)


@register_method("test_raises")
class Raises(Vanilla):
    """A run that fails on its own, every time."""

    Config = FaultConfig
    identity = None

    def prepare(self, model):
        if checked_before_training(model):
            return
        count_attempt(self.cfg.marker)
        raise RuntimeError("this method always fails")


@register_method("test_hangs")
class Hangs(Vanilla):
    """A run that never ends (writes its worker's pid first), for stopping a grid from outside."""

    Config = FaultConfig
    identity = None

    def prepare(self, model):
        if checked_before_training(model):
            return
        count_attempt(self.cfg.marker)
        time.sleep(600)


@register_method("test_waits")
class Waits(Vanilla):
    """A run that writes its worker's pid, then waits until the file MARKER.go exists (at most 120 s) and trains:
    a test holds runs under way while it signals the driver."""

    Config = FaultConfig
    identity = None

    def prepare(self, model):
        if checked_before_training(model):
            return
        count_attempt(self.cfg.marker)
        go, deadline = Path(self.cfg.marker + ".go"), time.monotonic() + 120
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


METHOD_CLASSES = {"test_dies_once": DiesOnce, "test_raises": Raises, "test_hangs": Hangs, "test_waits": Waits}
