"""A method that fails as a broken CUDA context would, for the worker-pool test (workers import it by name; the
test registers it only while it runs)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from suite.api.attention import register_method
from suite.methods.dropout import Vanilla


@dataclasses.dataclass
class MarkerConfig:
    p: float = 0.1
    marker: str = ""  # file that gets one line (the worker's pid) per attempt at the run


@register_method("test_cuda_breaks_once")
class CudaBreaksOnce(Vanilla):
    """The first attempt fails with an error after which a real CUDA context is unusable; later attempts run."""

    Config = MarkerConfig
    identity = None

    def prepare(self, model):
        with open(self.cfg.marker, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        if len(Path(self.cfg.marker).read_text().splitlines()) == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (faked on CPU)")
