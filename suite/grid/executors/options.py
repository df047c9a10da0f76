"""The options an executor takes from a study's `executor:` section and the command line, each declared once: its
type, the executor it belongs to and its help. The study schema, the flags of `run` and the check of which executor
takes what are built from this table."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXECUTOR_OPTIONS", "options_of"]  # what the rest of the suite uses; other names are this module's own


@dataclass(frozen=True)
class ExecutorOption:
    type: type
    executor: str              # the executor that takes it (another one refuses it before anything runs)
    help: str
    metavar: str | None = None
    positive: bool = False     # a value must be > 0 (checked before anything runs)

    @property
    def flag_help(self) -> str:
        return f"{self.executor} executor: {self.help}"


EXECUTOR_OPTIONS: dict[str, ExecutorOption] = {
    "workers": ExecutorOption(int, "local", "worker processes (default: 1 on CPU, one per GPU)"),
    "max_run_minutes": ExecutorOption(float, "local", "a run still going after M minutes (hung, stopped) is killed "
                                                      "and recorded failed, and the grid goes on; runs each job in a "
                                                      "worker process (default: $SUITE_MAX_RUN_MINUTES, else no "
                                                      "limit)", "M", positive=True),
    "address": ExecutorOption(str, "ray", "cluster to join (auto, HOST:PORT, ray://HOST:10001); default: start a "
                                          "local cluster"),
    "gpus_per_run": ExecutorOption(float, "ray", "GPUs per run (default 1; 0.5 packs two runs per GPU)",
                                   positive=True),
    "cpus_per_run": ExecutorOption(float, "ray", "CPUs per run (default 1)", positive=True),
}


def options_of(executor: str) -> frozenset[str]:
    """The declared options that `executor` takes."""
    return frozenset(name for name, option in EXECUTOR_OPTIONS.items() if option.executor == executor)
