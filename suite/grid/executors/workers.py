"""What every executor shares: the modules its workers import, the retry budget for dead workers, and the facts a
record carries about where it ran.

Workers import the modules that registered the grid's methods by name, so a method must live in an importable module
(built in, an installed plugin, or a module on the workers' PYTHONPATH), not in the driver's `__main__` script.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from suite.api.errors import ExecutorError
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_MAX_RETRIES", "executor_info", "import_method_modules", "method_modules"]

DEFAULT_MAX_RETRIES = 2  # re-runs of a job whose worker process died (not of runs that fail on their own)


def method_modules(jobs: list[RunConfig]) -> list[str]:
    """Modules whose import registers the grid's methods; workers import them before running a job."""
    from suite.api.attention import METHODS

    modules = set()
    for name in {j.method for j in jobs}:
        module = METHODS.get(name).__module__
        if module in ("__main__", "__mp_main__"):
            raise ExecutorError(f"method {name!r} is defined in the script being run, which worker processes "
                                "cannot import: move it into a module (installed, or on PYTHONPATH) and import it")
        modules.add(module)
    return sorted(modules)


def import_method_modules(modules: list[str]) -> None:
    for module in modules:
        importlib.import_module(module)


def executor_info(name: str, **facts: Any) -> dict[str, Any]:
    """The `executor` entry of a record: which executor ran it, in which process, with which GPUs visible."""
    return {"name": name, **facts, "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
