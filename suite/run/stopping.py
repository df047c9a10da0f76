"""Stop requests (SIGTERM, Ctrl-C) that cannot be swallowed, and the request to drain a grid (SIGUSR1).

Python runs a signal handler at the next bytecode of the main thread, wherever that is; when that is inside a
destructor (`__del__`, e.g. of a regex object while a tokenizer runs), the exception the handler raises is printed
as "Exception ignored" and discarded, and the grid would keep training. So the handler also records the request,
and the training loop and the runner call `check()` between batches and between stages: a swallowed stop is raised
again there. A second signal of the same kind exits at once.

SIGUSR1 (what a cluster's scheduler can send before a job's time limit, e.g. SLURM's `--signal=B:USR1@600`) stops
nothing: the runs under way finish and are recorded, and the grid starts no new one (`draining()`, read by the
local executor's start gate, suite.grid.executors.gate).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

from suite.api.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

__all__ = ["check", "draining", "stop_signals"]  # what the rest of the suite uses; other names are this module's own

_requested: type[BaseException] | None = None
_drain = False  # SIGUSR1 arrived: start no new run


def draining() -> bool:
    """Whether SIGUSR1 asked the grid to start no new run."""
    return _drain


def check() -> None:
    """Raise the pending stop request, if any (Terminated for SIGTERM, KeyboardInterrupt for Ctrl-C)."""
    if _requested is not None:
        raise _requested()


def _handler(kind: type[BaseException], code: int):
    def handle(signum, frame):
        global _requested
        if _requested is kind:  # asked twice: the first request was not honoured in time
            print(f"\nsignal {signum} again: exiting now", file=sys.stderr)
            os._exit(code)
        _requested = kind
        raise kind()

    return handle


def _drain_handler(can_drain: bool):
    def handle(signum, frame):
        global _drain
        if not can_drain:
            print("\nsignal USR1: the Ray executor has handed every run to the cluster and cannot hold one back; "
                  "Ctrl-C or SIGTERM stops the grid", file=sys.stderr)
        elif not _drain:
            print("\nsignal USR1: the runs under way finish and are recorded, and no new run starts; the same "
                  "command resumes the grid", file=sys.stderr)
        _drain = _drain or can_drain

    return handle


@contextlib.contextmanager
def stop_signals(can_drain: bool = True):
    """SIGTERM and SIGINT become Terminated and KeyboardInterrupt, raised at once and again at every `check()`;
    SIGUSR1 (where the platform has it) drains the grid (`draining()`), or says why it cannot (`can_drain` false:
    the Ray executor). Without a handler SIGUSR1 would end the process."""
    global _requested, _drain
    _requested, _drain = None, False
    handlers = [(signal.SIGTERM, _handler(Terminated, EXIT_TERMINATED)),
                (signal.SIGINT, _handler(KeyboardInterrupt, EXIT_INTERRUPTED))]
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        handlers.append((signal.SIGUSR1, _drain_handler(can_drain)))
    try:
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested, _drain = None, False
