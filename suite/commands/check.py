"""`python -m suite check METHOD [METHOD ...]`: the method check of `suite.api.testing` from the command line.

Exit 0 when every check of every method holds, 1 when one fails, 2 for an unknown method or an impossible
`--set` value.
"""
from __future__ import annotations

import argparse
import sys

from suite.api.attention import METHODS
from suite.api.errors import EXIT_BAD_INPUT, BadInput

# what the rest of the suite uses; other names are this module's own
__all__ = ["COMMAND", "EXIT_FAILED", "add_parser", "main"]

COMMAND = "check"
EXIT_FAILED = 1


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(COMMAND, help="check attention methods on tiny BERT/RoBERTa/ModernBERT models (hyper-parameter "
                                     "validation, output layout, identity, padding, finite values on fully padded "
                                     "and length-1 rows, value channels that reach the output, parameters an "
                                     "optimizer holds and trains, evaluation free of sampling and rates, fresh "
                                     "draws, kept expectation, gradients against a finite difference, devices, fp16 "
                                     "at pre-trained score ranges, training hooks and records, ModernBERT's local "
                                     "windows; where declared draws land and their unit, schedules, the training "
                                     "flag, batch invariance, padding in bf16/fp16, 512 tokens, the scaling, "
                                     "parameters at their edges), at the given rates and at high ones",
                       description="Runs the method check of suite.api.testing on each METHOD (names, wildcards or "
                                   "'all'; methods from installed plugins included) and prints a per-check report. "
                                   "Every rule runs at the configuration and again with each probability field at "
                                   "a high rate (0.9 where the method accepts it).")
    p.add_argument("methods", nargs="+", metavar="METHOD")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="M.KEY=V",
                   help="check method M at this hyper-parameter value instead of its default")
    p.add_argument("--quiet", action="store_true", help="print only the methods that fail")
    return p


def _hparams(names: list[str], sets: list[str]) -> dict[str, dict]:
    """--set METHOD.KEY=VALUE (as in `run`) -> {method: {key: value}}; every METHOD must be one being checked."""
    from suite.grid.plan import parse_assignment

    out: dict[str, dict] = {name: {} for name in names}
    for item in sets:
        target, key, (value,) = parse_assignment(item, sweep=False)
        if target not in out:
            raise BadInput(f"--set {item!r}: {target} is not among the checked methods "
                                      f"({', '.join(names)})")
        out[target][key] = value
    return out


def main(args: argparse.Namespace) -> int:
    from suite.api.testing import check_method

    try:
        names = METHODS.select(args.methods)
        jobs = list(_hparams(names, args.sets).items())
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    failed = []
    for name, hparams in jobs:
        report = check_method(name, **hparams)
        if not report.ok:
            failed.append(name)
        if not (args.quiet and report.ok):
            print(report, flush=True)
    print(f"\n{len(jobs) - len(failed)} of {len(jobs)} methods passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return EXIT_FAILED if failed else 0
