"""A method whose module takes seconds to import, as a worker's first imports do on a loaded machine (torch, CUDA,
a plugin): the executor tests check that a per-run time limit does not count them. Workers import it by name."""
from __future__ import annotations

import time

from suite.api.attention import register_method
from suite.methods.dropout import Vanilla

IMPORT_S = 20.0   # longer than the test's 15 s limit, which leaves a loaded machine 5x the run's idle 3 s
time.sleep(IMPORT_S)


@register_method("test_slow_start")
class SlowStart(Vanilla):
    """Vanilla attention from a module that is slow to import."""
