"""Every command of `python -m suite {run,list,bench,report,check,predict}`, and the parser that assembles them.

Every command is a module with COMMAND, add_parser(sub) and main(args). Bad input (`suite.api.errors.BadInput`) exits 2
with a message that says how to fix it, before anything trains.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from suite.api.errors import EXIT_BAD_INPUT, BadInput
from suite.commands import bench, check, listing, predict, report, run

COMMAND_MODULES = (run, listing, bench, report, check, predict)


def build_parser() -> argparse.ArgumentParser:
    from suite import __version__

    parser = argparse.ArgumentParser(prog="python -m suite", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(sub)
    return parser


def commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    return {m.COMMAND: m.main for m in COMMAND_MODULES}


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
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ClosedPipeSafe(sys.stdout), ClosedPipeSafe(sys.stderr)
    try:
        return commands()[args.command](args)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        sys.stdout, sys.stderr = streams
