"""Every error the suite raises on purpose, and the exit codes the command line maps them to.

`BadInput` and its subclasses mean "the user asked for something impossible": the command line prints the message
(which says what was wrong and how to fix it) and exits 2 before anything trains. Everything else that goes wrong
inside a run is recorded in that run's record as `failed`; the grid goes on.
"""
from __future__ import annotations

__all__ = ["BadInput", "DataError", "EXIT_BAD_INPUT", "EXIT_FAILED_RUNS", "EXIT_INTERRUPTED", "EXIT_TERMINATED",
           "ExecutorError", "HyperParameterError", "NonFiniteLoss", "ReportError", "SuiteError",
           "Terminated", "UnknownNameError"]  # what the rest of the suite uses; other names are this module's own

EXIT_FAILED_RUNS = 1       # the grid finished, some runs failed
EXIT_BAD_INPUT = 2         # nothing trained: fix the input
EXIT_INTERRUPTED = 130     # Ctrl-C
EXIT_TERMINATED = 143      # 128 + SIGTERM, as a shell reports it


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
