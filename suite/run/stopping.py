"""Stop requests (SIGTERM, Ctrl-C) that cannot be swallowed.

Python runs a signal handler at the next bytecode of the main thread, wherever that is; when that is inside a
destructor (`__del__`, e.g. of a regex object while a tokenizer runs), the exception the handler raises is printed
as "Exception ignored" and discarded, and the grid would keep training. So the handler also records the request,
and the training loop and the runner call `check()` between batches and between stages: a swallowed stop is raised
again there. A second signal of the same kind exits at once.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

from suite.api.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated

__all__ = ["check", "stop_signals"]  # what the rest of the suite uses; other names are this module's own

_requested: type[BaseException] | None = None


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


@contextlib.contextmanager
def stop_signals():
    """SIGTERM and SIGINT become Terminated and KeyboardInterrupt, raised at once and again at every `check()`."""
    global _requested
    _requested = None
    try:
        previous = {sig: signal.signal(sig, _handler(kind, code)) for sig, kind, code in
                    ((signal.SIGTERM, Terminated, EXIT_TERMINATED), (signal.SIGINT, KeyboardInterrupt,
                                                                      EXIT_INTERRUPTED))}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested = None
