"""The options an executor takes from a study's `executor:` section and the command line, each declared once: its
type, the executor it belongs to and its help. The study keys `executor.NAME` (`suite.grid.overrides.STUDY_KEYS`:
the study schema and the flags of `run`) and the check of which executor takes what are built from this table."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

# what the rest of the suite uses; other names are this module's own
__all__ = ["EXECUTOR_OPTIONS", "options_of"]


@dataclass(frozen=True)
class ExecutorOption:
    type: Any                  # the study schema's type
    executor: str              # the executor that takes it (another one refuses it before anything runs)
    help: str
    metavar: str | None = None
    positive: bool = False     # a value must be > 0 (checked before anything runs)
    parse: Callable[[str], Any] | None = None  # the flag's parser, where `type` is none (default: `type`)

    @property
    def flag_help(self) -> str:
        return f"{self.executor} executor: {self.help}"


def workers_value(text: Any) -> int | str:
    """--workers: a count, or `auto` (as many as the cores and the memory allow: suite.grid.executors.local);
    ValueError otherwise (argparse and the study schema both say it)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ValueError(f"{text!r}: give a number of worker processes or auto")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r}: give a number of worker processes or auto") from None


EXECUTOR_OPTIONS: dict[str, ExecutorOption] = {
    "workers": ExecutorOption(Union[int, str], "local",
                              "worker processes (default: 1 on CPU, one per GPU); auto: several runs side by side "
                              "on each GPU (up to 8, as its memory and the host's cores allow), or one per core "
                              "(up to 8, as the memory allows) on the CPU", "N|auto", positive=True,
                              parse=workers_value),
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
