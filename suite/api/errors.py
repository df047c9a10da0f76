"""Every error the suite raises on purpose, and the exit codes the command line maps them to.

`BadInput` and its subclasses mean "the user asked for something impossible": the command line prints the message
(which says what was wrong and how to fix it) and exits 2 before anything trains. Everything else that goes wrong
inside a run is recorded in that run's record as `failed`; the grid goes on.
"""
from __future__ import annotations

import importlib
from types import ModuleType, TracebackType

# what the rest of the suite uses; other names are this module's own
__all__ = ["BadInput", "BrokenDependency", "DataError", "EXIT_BAD_INPUT", "EXIT_FAILED_RUNS", "EXIT_INTERRUPTED",
           "EXIT_NOT_STARTED", "EXIT_TERMINATED", "ExecutorError", "HyperParameterError", "NonFiniteLoss",
           "ReportError", "SuiteError", "Terminated", "UnknownNameError", "broken_dependency", "import_checked",
           "import_name"]

EXIT_FAILED_RUNS = 1       # the grid finished, some runs failed
EXIT_BAD_INPUT = 2         # nothing trained: fix the input
EXIT_INTERRUPTED = 130     # Ctrl-C
EXIT_TERMINATED = 143      # 128 + SIGTERM, as a shell reports it
EXIT_NOT_STARTED = 75      # runs held back (run --stop-by, SIGUSR1): the same command resumes them (EX_TEMPFAIL)


class SuiteError(Exception):
    """Base class of the suite's own errors."""


class BadInput(SuiteError):
    """Impossible input found before training; exit 2."""


class HyperParameterError(BadInput, ValueError):
    """An impossible or unknown hyper-parameter or training setting."""


class DataError(BadInput, RuntimeError):
    """Missing or malformed data; the message names the file (and line) and how to fix it."""


class UnknownNameError(BadInput, KeyError):
    """An unknown method or task name; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ExecutorError(BadInput, RuntimeError):
    """An executor that cannot run here (Ray missing, impossible worker counts, ...)."""


class ReportError(BadInput, RuntimeError):
    """Nothing to report, or report options that cannot work."""


class NonFiniteLoss(SuiteError, RuntimeError):
    """The training loss (or the model after training) became NaN or inf; the run is recorded as failed."""


class Terminated(BaseException):
    """SIGTERM (a scheduler's stop, `kill`) in the driver.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` inside a run records the interrupted
    run as failed: it propagates to the command line, which stops the workers and exits 143.
    """


class BrokenDependency(BadInput):
    """A package the suite imports is missing or broken (its import raised, or called sys.exit()); exit 2."""


def import_checked(module: str, package: str | None = None) -> ModuleType:
    """`importlib.import_module(module)`, with what a dependency's import raises (ImportError, SystemExit from a
    sys.exit() in its code, any exception from its own code) as BrokenDependency naming the package (`package`, else
    the one whose code raised) and the fix. Ctrl-C and SIGTERM pass; so does an exception from the suite's own code
    (a fault of the suite)."""
    try:
        return importlib.import_module(module)
    except (Exception, SystemExit) as exc:
        top = module.partition(".")[0]
        if package is None and isinstance(exc, SystemExit) and top != "suite":
            package = top  # sys.exit's raising frame may be a wrapper's (wandb replaces sys.exit), not the package's
        broken = broken_dependency(exc, package)
        if broken is None:
            raise
        raise broken from None


def broken_dependency(exc: BaseException, package: str | None = None) -> BrokenDependency | None:
    """The BrokenDependency an import's failure means (None: it came from the suite's own code)."""
    culprit = package or _culprit(exc)
    if culprit is None:
        return None
    what = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else \
        f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return BrokenDependency(f"the package {culprit!r} that the suite imports is missing or broken (importing it "
                            f"{what}): install or repair it (pip install --force-reinstall {culprit}), then give the "
                            "same command again")


def _culprit(exc: BaseException) -> str | None:
    """The top-level package a failed import came from: the module an ImportError names, else the one whose code
    raised last; None where that is the suite's own code."""
    if isinstance(exc, ImportError) and exc.name:
        top = exc.name.partition(".")[0]
        return None if top == "suite" else top
    names = [tb.tb_frame.f_globals.get("__name__", "") for tb in _frames(exc.__traceback__)]
    raised = next((n for n in reversed(names) if n and not n.startswith(("importlib", "<frozen"))), "")
    top = raised.partition(".")[0]
    return None if top in ("", "suite", "__main__") else top


def _frames(tb: TracebackType | None):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def import_name(distribution: str) -> str | None:
    """The module an installed distribution is imported as: the top-level one named like it, else its only one
    (scikit-learn: sklearn), from top_level.txt or else its file list; None when that cannot be told."""
    from importlib import metadata

    dist = metadata.distribution(distribution)
    tops = (dist.read_text("top_level.txt") or "").split() or sorted(
        {f.parts[0].removesuffix(".py") for f in dist.files or () if len(f.parts) <= 2 and f.name.endswith(".py")
         and not f.parts[0].endswith((".dist-info", ".data"))})
    tops = [t for t in tops if not t.startswith("_")]
    canonical = distribution.lower().replace("-", "_").replace(".", "_")
    return next((t for t in tops if t.lower() == canonical), tops[0] if len(tops) == 1 else None)
