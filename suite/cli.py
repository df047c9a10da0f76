"""Command line: `python -m suite {run,list,...}`. Bad input exits 2 with a message that says how to fix it."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import typing

from tabulate import tabulate

from .attention import METHODS, HyperParameterError
from .config import DEFAULT_MODEL, PRESETS, TrainSettings, build_grid, resolve_model
from .data import DATA_DIR_ENV, DataError, get_task, load_splits, resolve_data_dir, select_tasks
from .registry import UnknownNameError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports it


class BadInput(Exception):
    pass


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="fine-tune a grid of models x tasks x methods x seeds x hyper-parameters",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Runs every job of the grid whose record is not already in OUT/runs/.\n"
                                   "Hyper-parameters: --set METHOD.KEY=VALUE fixes one value, --sweep "
                                   "METHOD.KEY=V1,V2,... adds a grid axis;\nMETHOD may be `train` for training "
                                   "settings (e.g. --sweep train.lr=2e-5,3e-5).")
    p.add_argument("--methods", required=True, help="comma list of names, wildcards ('scores_*') or 'all'")
    p.add_argument("--tasks", required=True, help="comma list of task names (case/dash-insensitive) or 'glue'")
    p.add_argument("--seeds", type=_ints, default=[1, 2, 3], help="comma list (default 1,2,3)")
    p.add_argument("--model", help=f"comma list of local paths or hub ids (default: the preset's; "
                                    f"'{DEFAULT_MODEL}' is the offline MiniLM)")
    p.add_argument("--preset", default="quick", choices=sorted(PRESETS), help="training recipe (default quick)")
    p.add_argument("--data-dir", help=f"folder of GLUE TSVs (else ${DATA_DIR_ENV}, else the hub)")
    p.add_argument("--out", default="runs", help="output folder; records go to OUT/runs/ (default ./runs)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--max-length", type=int)
    p.add_argument("--max-train-samples", type=int, help="seeded train subset (the same for every method/seed)")
    p.add_argument("--max-eval-samples", type=int, help="seeded dev subset")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="M.KEY=V")
    p.add_argument("--sweep", dest="sweeps", action="append", default=[], metavar="M.KEY=V1,V2")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1 ...")
    p.add_argument("--executor", default="local",
                   help="local (default: sequential; one worker process per GPU when several are visible) or ray")
    p.add_argument("--workers", type=int, help="local executor: worker processes (default: 1 on CPU, one per GPU)")
    p.add_argument("--address", help="ray executor: cluster to join (auto, HOST:PORT, ray://HOST:10001); "
                                     "default: start a local cluster")
    p.add_argument("--gpus-per-run", type=float, help="ray executor: GPUs per run (default 1; 0.5 packs two per GPU)")
    p.add_argument("--cpus-per-run", type=float, help="ray executor: CPUs per run (default 1)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (train.compile=true)")
    p.add_argument("--force", action="store_true", help="rerun jobs whose records exist")
    p.add_argument("--quiet", action="store_true", help="no progress bars (for logs)")
    p.add_argument("--dry-run", action="store_true", help="print the jobs and exit")


def cmd_run(args) -> int:
    from .executors import ExecutorError, check_executor, run_grid, status_table
    from .store import Store

    preset = PRESETS[args.preset]
    train = TrainSettings(**preset["train"])
    flags = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "max_length": args.max_length,
             "max_train_samples": args.max_train_samples, "max_eval_samples": args.max_eval_samples,
             "precision": args.precision, "compile": True if args.compile else None}
    train = dataclasses.replace(train, **{k: v for k, v in flags.items() if v is not None})
    train.validate()
    executor_options = {"workers": args.workers, "address": args.address, "gpus_per_run": args.gpus_per_run,
                        "cpus_per_run": args.cpus_per_run}
    try:
        check_executor(args.executor, executor_options)
    except ExecutorError as exc:
        raise BadInput(str(exc)) from None
    methods = METHODS.select(args.methods)
    tasks = select_tasks(args.tasks)
    models = [m.strip() for m in args.model.split(",")] if args.model else list(preset["models"])
    if not args.seeds:
        raise BadInput("--seeds is empty")
    data_dir = resolve_data_dir(args.data_dir)
    for t in tasks:  # read every split now: a missing file or a malformed line stops the grid before training
        load_splits(get_task(t), data_dir)
    for m in models:
        _check_model(m)
    jobs = build_grid(models, tasks, methods, args.seeds, train, args.sets, args.sweeps,
                      data_source="local" if data_dir else "hub")
    store = Store(args.out)
    if args.dry_run:
        for j in jobs:
            print(j.label, j.filename, sep="\t")
        return 0
    print(f"{len(jobs)} runs: {len(models)} model(s) x {len(tasks)} task(s) x {len(methods)} method(s) "
          f"x {len(args.seeds)} seed(s){' x sweeps' if args.sweeps else ''} -> {store.runs}", file=sys.stderr)
    _write_command(store)
    try:
        with _sigterm_as_interrupt():
            result = run_grid(jobs, store, data_dir, executor=args.executor, force=args.force, quiet=args.quiet,
                              device=args.device, **executor_options)
    except ExecutorError as exc:
        raise BadInput(str(exc)) from None
    except (KeyboardInterrupt, Terminated) as exc:
        print(f"\n{'terminated' if isinstance(exc, Terminated) else 'interrupted'}: finished records are kept; "
              "the interrupted run was not recorded and will run when the same command is given again",
              file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    print(status_table(result))
    return 0 if not result.failed else 1


class Terminated(Exception):
    """SIGTERM (a scheduler's stop, `kill`): raised in the driver so that it stops its workers before exiting."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    def stop(signum, frame):
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_command(store) -> None:
    """Remember the command that produced the runs (reports print it in their header)."""
    store.root.mkdir(parents=True, exist_ok=True)
    with open(store.root / "commands.txt", "a") as fh:
        fh.write("python -m suite " + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "\n")


def _check_model(model: str) -> None:
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(resolve_model(model))
    except Exception as exc:  # noqa: BLE001
        raise BadInput(f"cannot load model {model!r}: {type(exc).__name__}: {str(exc)[:300]}\n"
                       f"Give a local folder with config.json and weights, a hub id (needs internet), or "
                       f"'{DEFAULT_MODEL}' for the offline default.") from None


def cmd_list(args) -> int:
    rows = []
    for name in METHODS.names():
        cls = METHODS.get(name)
        hints = typing.get_type_hints(cls.Config)
        hp = ", ".join(f"{f.name}={getattr(cls.Config(), f.name)!r} ({getattr(hints[f.name], '__name__', hints[f.name])})"
                       for f in dataclasses.fields(cls.Config))
        rows.append([name, hp or "-", cls.description])
    print("Methods (select with --methods; set with --set METHOD.KEY=VALUE):\n")
    print(tabulate(rows, headers=["method", "hyper-parameters (default)", "what it does"], tablefmt="simple_grid",
                   maxcolwidths=[None, 60, 60]))
    if METHODS.plugin_errors:
        print("\nPlugins that failed to load: " + "; ".join(f"{k}: {v}" for k, v in METHODS.plugin_errors.items()))
    from .data import TASK_GROUPS, TASKS

    rows = []
    for name in TASKS.names():
        spec = get_task(name)
        groups = ",".join(g for g, members in TASK_GROUPS.items() if name in members)
        rows.append([spec.name, spec.display, " + ".join(spec.text_fields),
                     "regression" if spec.is_regression else "/".join(spec.label_names),
                     ", ".join(spec.metric_keys()), groups])
    print("\nTasks (select with --tasks; groups: " + ", ".join(TASK_GROUPS) + "):\n")
    print(tabulate(rows, headers=["task", "name", "text", "labels", "metrics (headline: their mean)", "group"],
                   tablefmt="github"))
    return 0


COMMANDS = {"run": cmd_run, "list": cmd_list}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m suite", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    sub.add_parser("list", help="methods with their hyper-parameters, and tasks")
    for extra in EXTRA_COMMANDS:
        extra(sub)
    return parser


EXTRA_COMMANDS: list = []  # (parser-adding function) for commands living in their own modules


def _load_extra_commands() -> None:
    """Commands kept next to what they drive (bench, report) add their parsers and handlers here."""
    import importlib

    for module in ("suite.bench", "suite.report"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        if mod.add_parser not in EXTRA_COMMANDS:  # main() may be called more than once in a process
            EXTRA_COMMANDS.append(mod.add_parser)
        COMMANDS[mod.COMMAND] = mod.main


def main(argv: list[str] | None = None) -> int:
    _load_extra_commands()
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        return COMMANDS[args.command](args)
    except (UnknownNameError, HyperParameterError, DataError, BadInput) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
