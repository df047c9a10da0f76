"""Stop requests (SIGTERM, Ctrl-C) that cannot be swallowed, and the request to drain a grid (SIGUSR1).

Python runs a signal handler at the next bytecode of the main thread, wherever that is; when that is inside a
destructor (`__del__`, e.g. of a regex object while a tokenizer runs), the exception the handler raises is printed
as "Exception ignored" and discarded, and the grid would keep training. So the handler also records the request,
and the training loop and the runner call `check()` between batches and between stages: a swallowed stop is raised
again there. A second signal of the same kind exits at once.

SIGUSR1 (what a cluster's scheduler can send before a job's time limit, e.g. SLURM's `--signal=B:USR1@600` to a
batch script that `exec`s the command) stops
nothing: the runs under way finish and are recorded, and the grid starts no new one (`drain_signal()` catches it
for the whole command; `draining()` is read by the local executor's start gate, suite.grid.executors.gate).
"""
from __future__ import annotations

import contextlib
import os
import signal

from suite.api.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

# what the rest of the suite uses; other names are this module's own
__all__ = ["check", "drain_signal", "draining", "stop_signals"]

_requested: type[BaseException] | None = None
_drain = False  # SIGUSR1 arrived: start no new run
_can_drain = True  # false while a Ray grid runs: it has handed every run to the cluster


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
            _say(f"signal {signum} again: exiting now")
            os._exit(code)
        _requested = kind
        raise kind()

    return handle


def _on_usr1(signum, frame):
    global _drain
    if not _can_drain:
        _say("signal USR1: the Ray executor has handed every run to the cluster and cannot hold one back; "
             "Ctrl-C or SIGTERM stops the grid")
    elif not _drain:
        _say("signal USR1: the runs under way finish and are recorded, and no new run starts; the same command "
             "resumes the grid")
    _drain = _drain or _can_drain


def _say(line: str) -> None:
    """A line to stderr from a signal handler: os.write, since print() there can land inside another print to
    stderr and raise a reentrant-call error that would end the grid."""
    with contextlib.suppress(OSError):
        os.write(2, f"\n{line}\n".encode(errors="replace"))


@contextlib.contextmanager
def drain_signal():
    """From here to the block's end SIGUSR1 asks the grid to drain (`draining()`) instead of ending the process,
    which is what it does without a handler; no-op where the platform has no SIGUSR1 (Windows)."""
    global _drain
    _drain, caught = False, False
    if hasattr(signal, "SIGUSR1"):
        try:
            previous, caught = signal.signal(signal.SIGUSR1, _on_usr1), True
        except ValueError:  # not the main thread: leave signals alone
            pass
    try:
        yield
    finally:
        if caught:  # None: a handler set outside Python, which cannot be put back; the default then
            signal.signal(signal.SIGUSR1, signal.SIG_DFL if previous is None else previous)
        _drain = False


@contextlib.contextmanager
def stop_signals(can_drain: bool = True):
    """SIGTERM and SIGINT become Terminated and KeyboardInterrupt, raised at once and again at every `check()`.
    `can_drain` false (the Ray executor): a SIGUSR1 that `drain_signal` catches only says why it cannot drain."""
    global _requested, _can_drain
    _requested, _can_drain = None, can_drain
    handlers = [(signal.SIGTERM, _handler(Terminated, EXIT_TERMINATED)),
                (signal.SIGINT, _handler(KeyboardInterrupt, EXIT_INTERRUPTED))]
    try:
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers}
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested, _can_drain = None, True
