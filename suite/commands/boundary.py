"""The one error boundary every command runs inside: whatever escapes a command becomes one line on stderr that
names the file and the fix, and an exit code, never a raw traceback.

- `BadInput` (and its subclasses): its own message, exit 2; nothing trained. A package that is missing or broken
  (its import raised, or called sys.exit(), while the command or its parser was imported, or later) is one too.
- Ctrl-C: exit 130, SIGTERM 143 (a grid says itself what it kept; `run` handles its own interruptions).
- OSError (a full disk, a read-only mount, no permission, a name too long): the file and what frees it; exit 1 from
  `run` (records written before are kept: the same command goes on), else 2.
- RecursionError (a JSON or YAML file nested thousands deep), UnicodeError (a name or text the locale's encoding
  cannot hold): what to change, exit 2.
- Anything else is a fault of the suite: one line, exit 1, and the traceback written to a file that line names.

Output never fails on encoding: stdout and stderr replace what their encoding cannot hold (`PYTHONIOENCODING=ascii`
printing '±' after a record was written crashed the command).
"""
from __future__ import annotations

import errno
import os
import sys
import tempfile
import traceback

from suite.api.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED_RUNS,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    BadInput,
    Terminated,
    broken_dependency,
)

__all__ = ["failure", "tolerant_output"]

# what frees each errno, said after the file
FIXES = {
    errno.ENOSPC: "free space on that disk or write to another one (--out)",
    errno.EDQUOT: "free space within your quota or write to another disk (--out)",
    errno.EROFS: "that file system is mounted read-only: give a folder on a writable one (--out)",
    errno.EACCES: "you may not write or read there: give a folder of your own (--out) or fix its permissions",
    errno.EPERM: "you may not write or read there: give a folder of your own (--out) or fix its permissions",
    errno.ENAMETOOLONG: "give a shorter path",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a file stands where a folder is needed: check the path",
    errno.EISDIR: "a folder stands where a file is needed: check the path",
    errno.EIO: "the disk reported an I/O error: check it, then give the same command again",
}


def tolerant_output() -> None:
    """stdout and stderr (and those of the processes the command starts) replace characters their encoding cannot
    hold instead of raising: a run must not fail on printing '±' after its record was written."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "strict") == "strict":
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change its error handler is left as it is
                pass
    encoding = os.environ.get("PYTHONIOENCODING")
    if encoding and ":" not in encoding:
        os.environ["PYTHONIOENCODING"] = f"{encoding}:backslashreplace"


def failure(exc: BaseException, command: str) -> tuple[str, int] | None:
    """(the one line to print, the exit code) for an exception that escaped `command`; None for a SystemExit or
    anything that should propagate as it is."""
    if isinstance(exc, BadInput):
        return f"error: {exc}", EXIT_BAD_INPUT
    if isinstance(exc, ImportError) and (broken := broken_dependency(exc)) is not None:  # a package imported late
        return f"error: {broken}", EXIT_BAD_INPUT
    if isinstance(exc, KeyboardInterrupt):  # outside training (planning, preflight, report, bench, predict)
        return "\ninterrupted: nothing was left half-written", EXIT_INTERRUPTED
    if isinstance(exc, Terminated):  # SIGTERM outside training
        return "\nterminated: nothing was left half-written", EXIT_TERMINATED
    if isinstance(exc, OSError):
        return _os_error(exc, command)
    if isinstance(exc, RecursionError):
        return ("error: an input is nested too deeply to read (a JSON or YAML file thousands of levels deep: not one "
                "the suite wrote); remove or restore the file named in the command or its output folder",
                EXIT_BAD_INPUT)
    if isinstance(exc, UnicodeError):
        return _unicode_error(exc), EXIT_BAD_INPUT
    if isinstance(exc, MemoryError):
        return ("error: out of memory: an input asks for more than this machine holds (the suite bounds the inputs "
                "it knows; say which one did this)", EXIT_FAILED_RUNS)
    if isinstance(exc, Exception):
        return _fault(exc, command), EXIT_FAILED_RUNS
    return None


def _os_error(exc: OSError, command: str) -> tuple[str, int]:
    where = exc.filename if exc.filename is not None else "a file"
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    what = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    fix = FIXES.get(exc.errno, "fix that file or folder, then give the same command again")
    if command == "run":  # the grid had started: records are written whole or not at all
        return (f"error: {where}: {what}; {fix}. Records written before are kept: give the same command again to "
                "run the rest", EXIT_FAILED_RUNS)
    return f"error: {where}: {what}; {fix}", EXIT_BAD_INPUT


def _unicode_error(exc: UnicodeError) -> str:
    encoding = getattr(exc, "encoding", None) or sys.getfilesystemencoding()
    text = getattr(exc, "object", "")
    start = getattr(exc, "start", 0)
    bad = text[start:start + 8] if isinstance(text, (str, bytes)) else ""
    if isinstance(exc, UnicodeEncodeError):
        return (f"error: {bad!r} cannot be written in this locale's encoding ({encoding}): give names in plain "
                "ASCII or UTF-8 text, or run under a UTF-8 locale (LANG=C.UTF-8)")
    return (f"error: {bad!r} is not {encoding} text: give file names and inputs as UTF-8 text, or run under a "
            "UTF-8 locale (LANG=C.UTF-8)")


def _fault(exc: Exception, command: str) -> str:
    """One line for a fault of the suite; its traceback goes to a file (or, failing that, after the line)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = " ".join(str(exc).split())[:300]
    try:
        fd, path = tempfile.mkstemp(prefix="suite-error-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(f"python -m suite {' '.join(sys.argv[1:])}\n\n{text}")
        kept = f"the traceback is in {path}"
    except OSError:
        kept = "the traceback could not be kept (no space for a temporary file)"
    return (f"error: python -m suite {command} failed: {type(exc).__name__}: {message}. This is a fault of the suite "
            f"or an input it does not check yet (an edited record or state file?); {kept}: please report it")
