"""Every command of `python -m suite {run,list,bench,report,check,predict,plan,reproduce}`, and the parser that
assembles them.

Every command is a module with COMMAND, add_parser(sub) and main(args), run inside one error boundary
(`suite.commands.boundary`): bad input (`suite.api.errors.BadInput`) exits 2 with a message that says how to fix it,
before anything trains; a full disk, a file nested too deeply, a name the locale cannot encode or Ctrl-C is one line
with the file and the fix, never a traceback.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Callable

from suite.api.errors import Terminated, import_checked
from suite.commands.boundary import failure, tolerant_output
from suite.run.device import prefer_passive_waits

# name -> (module, the line `python -m suite --help` lists it with). A command's module is imported only when that
# command runs (or when the whole parser is built): most pull in torch and transformers, which `--help` and
# `--version` must not wait for; so the listing's lines live here, not in the modules.
COMMANDS = {
    "run": ("suite.commands.run", "fine-tune a grid of models x tasks x methods x seeds x hyper-parameters"),
    "list": ("suite.commands.listing", "methods with their hyper-parameters, and tasks"),
    "bench": ("suite.commands.bench", "training-step time and peak memory of each method vs vanilla attention"),
    "report": ("suite.commands.report", "leaderboard markdown, tables and figures from run records"),
    "check": ("suite.commands.check", "check attention methods on tiny BERT/RoBERTa/ModernBERT models (hyper-parameter "
                                      "validation, output shape, identity, padding, finite values, deterministic "
                                      "evaluation, parameters on the model's device)"),
    "predict": ("suite.commands.predict", "test-set predictions in the GLUE server's format from saved checkpoints"),
    "plan": ("suite.commands.plan", "each primary comparison's chance of a decision under a study's design, before "
                                    "anything runs"),
    "reproduce": ("suite.commands.reproduce", "train recorded runs again and compare what they computed with their "
                                              "records (bit for bit)"),
}


def _command_in(argv: list[str]) -> str | None:
    """The command an argument list names: its first word that is no option (the top level has only -h, --version)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given `argv`, only the command it names is imported and gets its options (the
    others are listed by name and help, enough for `--help`)."""
    import suite

    chosen = _command_in(argv) if argv is not None else None
    parser = argparse.ArgumentParser(prog="python -m suite", description=suite.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {suite.__version__}")
    sub = _Listed(parser.add_subparsers(dest="command", required=True))
    for name, (module, _) in COMMANDS.items():
        if argv is None or name == chosen:
            import_checked(module).add_parser(sub)
        else:
            sub.add_parser(name)
    return parser


class _Listed:
    """The subparsers, each listed with its line from COMMANDS whichever command was imported."""

    def __init__(self, sub):
        self._sub = sub

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self._sub.add_parser(name, **{**kwargs, "help": COMMANDS[name][1]})


def commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    """Every command's main (imports every command module)."""
    return {name: import_checked(module).main for name, (module, _) in COMMANDS.items()}


class ClosedPipeSafe:
    """A text stream that goes quiet once its reader has gone (`python -m suite run ... | head`): a closed pipe is
    no reason for a run to fail, and the records are the output that matters."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._stream = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._stream = open(os.devnull, "w")  # noqa: SIM115

    def __getattr__(self, name):  # isatty, fileno, encoding, ... of the stream underneath
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    # before a command's module imports torch: its OpenMP reads the wait policy once, when it loads
    prefer_passive_waits()
    argv = sys.argv[1:] if argv is None else argv
    tolerant_output()
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ClosedPipeSafe(sys.stdout), ClosedPipeSafe(sys.stderr)
    command = _command_in(argv) or ""
    try:  # SIGTERM outside training (planning, a report) is the boundary's one line too, not a silent exit
        previous = signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread: signals are left alone
        previous = None
    try:  # the parser imports the command's module: Ctrl-C or a broken package there is inside the boundary too
        args = build_parser(argv).parse_args(argv)
        command = args.command
        if getattr(args, "quiet", False) or not sys.stderr.isatty():
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        return import_checked(COMMANDS[command][0]).main(args)
    except BaseException as exc:  # the one error boundary of every command (suite.commands.boundary)
        said = failure(exc, command)
        if said is None:  # SystemExit: argparse's usage error or --help, or the command's own exit
            raise
        print(said[0], file=sys.stderr)
        return said[1]
    finally:
        sys.stdout, sys.stderr = streams
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame) -> None:
    raise Terminated
